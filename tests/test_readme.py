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
