# The README's two commands are `make demo` (setup + main job) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: setup demo info test lint docs docs-serve clean

# Pinned CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
$(BIN)/lmckit: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,ray,docs,parquet]'
	# numba compiles the LAP kernels once here (~3 s) into its cache, not in the first run
	$(BIN)/python -c "from lmckit.lap import compile_kernels; compile_kernels()"
	touch $@

setup: $(BIN)/lmckit
	bash scripts/install-datasets.sh $(BIN)/python

demo: setup
	$(BIN)/lmckit demo --out demo-out

info: $(BIN)/lmckit
	$(BIN)/lmckit info

lint: $(BIN)/lmckit
	$(BIN)/ruff check .

# The site, built offline; strict: a broken link, reference or docstring fails the build
# (never with --quiet: it hides the warnings that strict mode counts, and the build passes).
docs: $(BIN)/lmckit
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(BIN)/lmckit
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

test: $(BIN)/lmckit
	bash scripts/install-browser.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .ruff_cache
