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
