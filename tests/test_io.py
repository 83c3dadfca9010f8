"""Output paths are checked before work; files appear only when complete."""

import pytest

from lmckit._io import (
    atomic_path,
    atomic_write_json,
    check_output_dir,
    prepare_output_dir,
    prepare_output_file,
)
from lmckit.errors import OutputPathError


def test_output_folders_are_checked_then_created(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        check_output_dir(tmp_path / "file", "--out")
    with pytest.raises(OutputPathError, match=r"--out .*x/y is under a file"):
        check_output_dir(tmp_path / "file" / "x" / "y", "--out")
    target = tmp_path / "new" / "deeper"
    assert check_output_dir(target) == target and not (tmp_path / "new").exists()
    assert prepare_output_dir(target).is_dir()
    assert list(target.iterdir()) == []  # the write probe leaves nothing behind
    with pytest.raises(OutputPathError, match="/proc/lmckit"):
        prepare_output_dir("/proc/lmckit-test-output")


def test_output_files_are_checked(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    with pytest.raises(OutputPathError, match="is a folder"):
        prepare_output_file(tmp_path / "folder", "--out")
    with pytest.raises(OutputPathError, match="under a file"):
        prepare_output_file(tmp_path / "file" / "p.json", "--out")
    assert prepare_output_file(tmp_path / "sub" / "p.json") == tmp_path / "sub" / "p.json"
    assert (tmp_path / "sub").is_dir()


def test_atomic_writes_leave_the_old_file_on_failure(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "a.json") as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert (tmp_path / "a.json").read_text().strip().endswith("}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_guarded_folder_never_overwrites_what_lmckit_did_not_write(tmp_path):
    """Inside ``locked_output`` every write is claimed first: a user's file under an
    output's name is refused (and left as it was), lmckit's own outputs are rewritten."""
    from lmckit._io import MANIFEST, check_outputs, locked_output

    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.toml").write_text("the user's\n")
    with locked_output(out):
        atomic_write_json(out / "results.json", {"a": 1})
        atomic_write_json(out / "results.json", {"a": 2})  # its own: rewritten
        atomic_write_json(out / "sub" / "deep.json", {})  # under a folder it created
        with pytest.raises(OutputPathError, match=r"experiment\.toml already exists and was not"):
            atomic_write_json(out / "experiment.toml", {})
        with pytest.raises(OutputPathError, match="not written by lmckit"):
            check_outputs([out / "experiment.toml"])
    assert (out / "experiment.toml").read_text() == "the user's\n"
    with locked_output(out):  # a later command: what lmckit wrote there is still its own
        atomic_write_json(out / "results.json", {"a": 3})
    import json

    listed = json.loads((out / MANIFEST).read_text())["entries"]
    assert sorted(listed) == ["results.json", "sub"]
    import os

    umask = os.umask(0)
    os.umask(umask)
    for written in (out / MANIFEST, out / "results.json"):  # readable as open() would make them
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask, written.name
    # outside any held folder nothing is guarded (a library caller writes where it likes)
    atomic_write_json(out / "experiment.toml", {"mine": True})


def test_a_folder_an_older_lmckit_wrote_is_adopted_whole(tmp_path):
    """Locked before (``.lmckit.lock``) but no list of files: written by an lmckit that kept
    none — its files are lmckit's."""
    from lmckit._io import locked_output

    (tmp_path / ".lmckit.lock").write_text("")
    (tmp_path / "interpolation.json").write_text("{}")
    with locked_output(tmp_path):
        atomic_write_json(tmp_path / "interpolation.json", {"new": True})


def test_a_refused_command_leaves_a_users_folder_as_it_was(tmp_path):
    """A lock left behind would mark the folder as lmckit's: the next run adopted the user's
    interpolation.json as its own output and overwrote it."""
    import os

    from lmckit._io import OutputPathError, locked_output

    (tmp_path / "interpolation.json").write_text("mine")
    with pytest.raises(RuntimeError), locked_output(tmp_path):
        raise RuntimeError("refused before writing anything")
    assert os.listdir(tmp_path) == ["interpolation.json"]
    with pytest.raises(OutputPathError, match="was not written by lmckit"), locked_output(tmp_path):
        atomic_write_json(tmp_path / "interpolation.json", {"new": True})
    assert (tmp_path / "interpolation.json").read_text() == "mine"
    with pytest.raises(RuntimeError), locked_output(tmp_path):  # it wrote, then failed: kept
        atomic_write_json(tmp_path / "curve.json", {})
        raise RuntimeError("failed after writing")
    assert (tmp_path / ".lmckit.lock").exists()
