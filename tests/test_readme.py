"""The README's Python examples run as written (```python blocks; ```py blocks need files
that a fresh clone does not have and are only illustrative)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    assert commands[:2] == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci


def test_the_reproduction_page_links_resolve_and_covers_every_reproduction_file():
    """docs/reproductions.md: every relative link names a file of the repository, and every
    experiment file that reproduces a paper is on it (a new reproduction cannot be left off)."""
    page = README.parent / "docs" / "reproductions.md"
    text = page.read_text()
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", text) if not link.startswith("http")]
    assert links and [link for link in links if not (page.parent / link).exists()] == []
    not_reproductions = {"demo", "federated-fmnist", "gpt-python-stdlib", "vit-fmnist",
                         "vit-fmnist-symmetries"}  # fmt: skip
    files = {p.stem for p in (README.parent / "experiments").glob("*.toml")} - not_reproductions
    assert sorted(f for f in files if f"{f}.toml" not in text) == []
