"""The README and the documentation pages: their Python examples run as written (every
```python block of a page, in order, in one namespace per page, in a scratch folder;
```py blocks are illustrative fragments), the README starts with the two commands and stays
a landing page, and the reproduction page covers every reproduction file."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


EXAMPLES = [p for p in [README, *PAGES] if python_blocks(p)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_examples_run(path, tmp_path, monkeypatch):
    blocks = python_blocks(path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{path.name} block {i + 1}", "exec"), namespace)


def test_the_readme_has_examples_and_every_guide_with_code_runs_some():
    assert python_blocks(README)
    guides = [p for p in PAGES if p.parent.name == "guides"]
    assert sum(bool(python_blocks(p)) for p in guides) >= 4


def test_readme_starts_with_the_two_commands_and_is_a_landing_page():
    text = README.read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    assert commands[:2] == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci
    assert len(text.splitlines()) <= 200


def test_the_reproduction_page_links_resolve_and_covers_every_reproduction_file():
    """docs/reproductions.md: every relative link names a file of the site (experiment files
    and benchmarks are copied into it from the repository), and every experiment file that
    reproduces a paper is on it (a new reproduction cannot be left off)."""
    page = ROOT / "docs" / "reproductions.md"
    text = page.read_text()
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", text) if not link.startswith("http")]

    def exists(link: str) -> bool:
        copied = link.startswith(("experiments/", "benchmarks/"))
        return (ROOT / link).exists() if copied else (page.parent / link).exists()

    assert links and [link for link in links if not exists(link)] == []
    not_reproductions = {"demo", "federated-fmnist", "gpt-python-stdlib", "vit-fmnist",
                         "vit-fmnist-symmetries", "llama-python-stdlib"}  # fmt: skip
    files = {p.stem for p in (ROOT / "experiments").glob("*.toml")} - not_reproductions
    assert sorted(f for f in files if f"{f}.toml" not in text) == []


def test_every_report_and_figure_in_docs_is_reachable_from_a_page():
    pages = " ".join(p.read_text() for p in [README, *PAGES])
    kept = [*(ROOT / "docs").glob("*.html"), *(ROOT / "docs").glob("*.png")]
    assert kept and sorted(p.name for p in kept if p.name not in pages) == []


def _shell_commands(text: str) -> list[str]:
    """The ``lmckit ...`` command lines of a page's bash blocks (continuations joined,
    comments dropped)."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("lmckit "):
                commands.append(line)
    return commands


def test_every_command_line_in_the_pages_parses_with_todays_cli():
    """The pages' ``lmckit`` command lines name options and values the command line has:
    a renamed option or a removed method fails here (files need not exist: the arguments'
    types, which open them, are left out)."""
    import argparse
    import shlex

    from lmckit.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for a in sub._actions:
                    a.type = None
    commands = [c for p in [README, *PAGES] for c in _shell_commands(p.read_text())]
    assert len(commands) >= 20
    for command in commands:
        words = shlex.split(command)[1:]
        if words == ["--help"]:
            continue
        try:
            parser.parse_args(words)
        except SystemExit:
            pytest.fail(f"does not parse: {command}")
