"""Old import paths kept for one release: each is the moved module itself, and says so."""

import subprocess
import sys

from lmckit._moved import MOVED


def test_every_old_path_is_the_moved_module_and_warns():
    code = (
        "import importlib, warnings\n"
        "from lmckit._moved import MOVED\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        moved = importlib.import_module(old)\n"
        "    assert moved is importlib.import_module(new), old\n"
        "    said = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "    assert any(old in s and new in s for s in said), (old, said)\n"
        "print(len(MOVED))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(len(MOVED))


def test_every_moved_module_left_its_old_file_behind():
    """An old path in the table has its file (a module that moved without one would break
    every import of it); no other file in the package is such a stub."""
    from pathlib import Path

    import lmckit

    root = Path(lmckit.__file__).parent
    stubs = {
        "lmckit." + ".".join(p.relative_to(root).with_suffix("").parts)
        for p in root.rglob("*.py")
        if "\nalias(__name__" in p.read_text()
    }
    assert stubs == set(MOVED)
