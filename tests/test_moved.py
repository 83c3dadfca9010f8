"""Old import paths kept for one release: each is the moved module itself, and says so."""

import subprocess
import sys

from lmckit._moved import MOVED


def test_every_old_path_is_the_moved_module_and_warns():
    code = (
        "import importlib, warnings\n"
        "from lmckit._moved import MOVED\n"
        "import sys\n"
        "for old, new in MOVED.items():\n"
        "    for name in [m for m in sys.modules if m in MOVED]:\n"
        "        del sys.modules[name]  # each old path imported afresh\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        moved = importlib.import_module(old)\n"
        "    assert moved is importlib.import_module(new), old\n"
        "    said = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "    package = old.rsplit('.', 1)[0]\n"
        "    assert any((old in s and new in s) or s.startswith(package + ' moved')\n"
        "               for s in said), (old, said)\n"
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
        "lmckit." + ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for p in root.rglob("*.py")
        if "\nalias(__name__" in p.read_text()
    }
    packages = {old for old in stubs if (root / old.split(".", 1)[1].replace(".", "/")).is_dir()}
    moved_with_package = {old for old in MOVED if old.rsplit(".", 1)[0] in packages}
    assert stubs | moved_with_package == set(MOVED)


def test_a_match_results_old_name_is_its_alignment():
    """``MatchResult.perm`` held transforms too; it is now ``alignment``, the old name kept
    for one release as the same object."""
    import torch

    from lmckit.match import weight_matching
    from lmckit.models import build_model, permutation_spec

    torch.manual_seed(0)
    a, b = (build_model("mlp", in_dim=4, hidden=[6], out_dim=3).state_dict() for _ in range(2))
    result = weight_matching(
        permutation_spec(build_model("mlp", in_dim=4, hidden=[6], out_dim=3)), a, b
    )
    assert result.perm is result.alignment
