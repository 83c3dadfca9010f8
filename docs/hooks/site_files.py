"""MkDocs hook: what the site holds besides docs/'s pages.

* The API reference, one page per public module of ``src/lmckit`` (a module or package
  whose dotted name has no part starting with ``_``), each rendered by mkdocstrings from
  the docstrings, and an index listing them with each module's first docstring line —
  generated at build time, so a new module is in the reference without anyone writing a page.
* The experiment file reference (from :mod:`lmckit.experiments.schema`'s annotated example
  and key sets, ``TrainConfig`` and the method registries) and an index of the benchmark
  scripts and results — generated the same way, so neither can fall behind the code.
* The experiment files, the benchmark scripts and their JSON results, copied into the site
  at ``experiments/`` and ``benchmarks/`` so the pages can link to them.
* The docstrings' Sphinx roles rendered as code, and the API pages in the navigation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "lmckit"
COPIED = {"experiments": "*.toml", "benchmarks": "*.py", "benchmarks/results": "*.json*"}


def public_modules() -> list[tuple[str, Path]]:
    """``(dotted name, source file)`` of every public module, packages first, sorted."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        if "\nalias(__name__" in path.read_text():  # an old path kept for one release
            continue
        out.append((".".join(parts), path))
    return out


def summary(path: Path) -> str:
    """The first line of a module's docstring (read without importing it)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _api_index(modules: list[tuple[str, Path]]) -> str:
    lines = [
        "# API reference",
        "",
        "Every public module of lmckit, rendered from its docstrings (shapes, conventions",
        "and errors are stated there). The pages are generated when the site is built.",
        "",
        "| module | what it holds |",
        "|---|---|",
    ]
    for name, path in modules:
        lines.append(f"| [`{name}`]({name}.md) | {_cell(summary(path))} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A docstring's text as a Markdown table cell: reST roles and double backticks as
    code, pipes escaped."""
    text = re.sub(r":(?:class|func|meth|mod|data|attr):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|")


def _constant(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise KeyError(name)


def _experiment_reference() -> str:
    """The experiment file's schema, from :mod:`lmckit.experiments.schema` (its annotated
    example and key sets), :class:`lmckit.train.TrainConfig` (the ``[train]`` options) and
    the method registries (names, what each does, the options each takes)."""
    from lmckit.match import METHODS as MATCHERS
    from lmckit.merge import METHODS as MERGERS

    source = (PACKAGE / "experiments" / "schema.py").read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    example = doc.split("::", 1)[1].split("\n\n:func:", 1)[0]
    example = "\n".join(line[4:] for line in example.strip("\n").splitlines())
    tables = {
        "top level": "TOP_KEYS",
        "[[compare]]": "COMPARE_KEYS",
        "[[merge]]": "MERGE_KEYS",
        "[[triplets]]": "TRIPLET_KEYS",
        "[[paper]]": "PAPER_KEYS",
    }
    lines = [
        "# Experiment file reference",
        "",
        "Generated from `lmckit.experiments.schema`, `lmckit.train.TrainConfig` and the method",
        "registries when the site is built: every key `lmckit run` accepts. An unknown key, a",
        "value of the wrong type or an option a method does not take is an error naming it.",
        "",
        "## An annotated file",
        "",
        "```toml",
        example,
        "```",
        "",
        "## Keys per table",
        "",
        "| table | keys |",
        "|---|---|",
    ]
    for table, constant in tables.items():
        keys = ", ".join(f"`{k}`" for k in sorted(_constant(tree, constant)))
        lines.append(f"| {table} | {keys} |")
    analyses = ", ".join(f'`"{a}"`' for a in sorted(_constant(tree, "ANALYSES")))
    lines += ["", f"`analyses` takes {analyses}.", "", "## `[train]`", ""]
    lines += _train_options()
    for title, registry in (("Matching methods", MATCHERS), ("Merging methods", MERGERS)):
        lines += ["", f"## {title}", "", "| method | what it does | options |", "|---|---|---|"]
        for name, method in registry.items():
            options = ", ".join(f"`{o}`" for o in method.options()) or "—"
            lines.append(f"| `{name}` | {_cell(method.summary)} | {options} |")
    return "\n".join(lines) + "\n"


def _train_options() -> list[str]:
    """``[train]``'s keys: TrainConfig's fields with their defaults and the meaning its
    docstring's Attributes section gives."""
    tree = ast.parse((PACKAGE / "train.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    doc = ast.get_docstring(cls) or ""
    meaning: dict[str, str] = {}
    current = None
    for line in doc.split("Attributes:", 1)[-1].splitlines():
        stripped = line.strip()
        head = stripped.split(":", 1)
        if line.startswith("    ") and not line.startswith("     ") and len(head) == 2:
            current = head[0]
            meaning[current] = head[1].strip()
        elif current and stripped:
            meaning[current] += " " + stripped
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            default = ast.unparse(node.value) if node.value is not None else "—"
            text = next((v for k, v in meaning.items() if name in k.split(", ")), "")
            rows.append(f"| `{name}` | `{default}` | {_cell(text)} |")
    return rows


ROLE = re.compile(
    r":(?:func|class|meth|mod|data|attr|exc|obj):<code>~?(?:lmckit\.[\w.]*\.)?([^<]+)</code>"
)


def on_page_content(html: str, page, config, files) -> str:
    """The docstrings' Sphinx roles (``:func:`x` ``), which mkdocstrings' Google parser
    leaves as text, become plain code: ``x``."""
    return ROLE.sub(r"<code>\1</code>", html)


def _benchmark_index() -> str:
    """Every benchmark script with its purpose and every stored result, linked."""
    lines = [
        "# Benchmark scripts and results",
        "",
        "Every script in `benchmarks/` prints JSON with its baseline measured in the same run;",
        "the results kept in `benchmarks/results/` are the numbers the",
        "[Benchmarks](benchmarks.md) page quotes (the suffix names the machine where not",
        "2 CPU cores: `_h100`, `_h200`).",
        "",
        "| script | what it measures |",
        "|---|---|",
    ]
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        lines.append(f"| [`{path.name}`](benchmarks/{path.name}) | {_cell(summary(path))} |")
    lines += ["", "| result | size |", "|---|---|"]
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json*")):
        size = f"{path.stat().st_size / 1024:.1f} KiB"
        lines.append(f"| [`{path.name}`](benchmarks/results/{path.name}) | {size} |")
    return "\n".join(lines) + "\n"


def on_config(config):
    """The API pages go into the navigation under the "API reference" entry."""
    pages = ["api/index.md", *(f"api/{name}.md" for name, _ in public_modules())]
    for i, entry in enumerate(config["nav"] or []):
        if isinstance(entry, dict) and "API reference" in entry:
            config["nav"][i] = {"API reference": pages}
    return config


def on_files(files: Files, config) -> Files:
    modules = public_modules()
    files.append(File.generated(config, "api/index.md", content=_api_index(modules)))
    files.append(
        File.generated(config, "guides/experiment-reference.md", content=_experiment_reference())
    )
    files.append(File.generated(config, "benchmark-results.md", content=_benchmark_index()))
    for name, _ in modules:
        content = f"# `{name}`\n\n::: {name}\n"
        files.append(File.generated(config, f"api/{name}.md", content=content))
    for folder, pattern in COPIED.items():
        for path in sorted((ROOT / folder).glob(pattern)):
            if path.is_file():
                uri = f"{folder}/{path.name}"
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
