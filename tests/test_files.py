"""Output paths are checked before work; files appear only when complete."""

import pytest

from lmckit.errors import OutputPathError
from lmckit.files import (
    atomic_path,
    atomic_write_json,
    check_output_dir,
    prepare_output_dir,
    prepare_output_file,
)


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
    from lmckit.files import MANIFEST, check_outputs, locked_output

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
    from lmckit.files import locked_output

    (tmp_path / ".lmckit.lock").write_text("")
    (tmp_path / "interpolation.json").write_text("{}")
    with locked_output(tmp_path):
        atomic_write_json(tmp_path / "interpolation.json", {"new": True})


def test_a_refused_command_leaves_a_users_folder_as_it_was(tmp_path):
    """A lock left behind would mark the folder as lmckit's: the next run adopted the user's
    interpolation.json as its own output and overwrote it."""
    import os

    from lmckit.files import OutputPathError, locked_output

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


def _writer(name):
    """A command that writes ``name-<item>.json`` for each item (and an always-written
    summary) into ``out``, and replaces its earlier call's item files."""
    from lmckit.files import check_outputs, writes_folder

    @writes_folder("out", replaces=(f"{name}-*.json", "sub/*.json"))
    def command(out, items, inputs=(), log=None):
        check_outputs([out / f"{name}-{i}.json" for i in items], inputs)
        for i in items:
            atomic_write_json(
                out / (f"sub/{i}.json" if i.startswith("sub") else f"{name}-{i}.json"), {}
            )
        atomic_write_json(out / f"{name}.json", {"items": list(items)})

    return command


def names(folder):
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and ".lmckit" not in p.name
    )


def test_a_folder_written_again_keeps_only_what_its_last_call_wrote(tmp_path):
    """Formerly a second call with other methods (or another pair) left the first call's
    permutation files beside the new results, with nothing to tell them apart."""
    out = tmp_path / "out"
    perm = _writer("perm")
    said = []
    perm(out, ["wm", "am", "subx"], log=said.append)
    assert names(out) == ["perm-am.json", "perm-wm.json", "perm.json", "sub/subx.json"]
    (out / "perm-mine.json").write_text("the user's")  # matches the pattern, not lmckit's
    perm(out, ["am"], log=said.append)
    assert names(out) == ["perm-am.json", "perm-mine.json", "perm.json"]
    assert said == [f"removed from {out} what an earlier run wrote there and this one did not: "
                    "perm-wm.json, sub/subx.json"]  # fmt: skip
    perm(out, ["am"], log=said.append)  # nothing more to remove: nothing said
    assert len(said) == 1


def test_a_shared_folder_keeps_a_file_while_another_commands_last_call_wrote_it(tmp_path):
    """Two commands writing one folder: a file goes when neither one's last call wrote it."""
    out = tmp_path / "out"
    first, second = _writer("perm"), _writer("perm")
    second.__wrapped__.__qualname__ = "other"  # the name a writer is known by
    first(out, ["wm", "am"])
    second(out, ["wm"])
    first(out, ["am"])  # perm-wm.json: still the other command's output
    assert "perm-wm.json" in names(out)
    second(out, ["am"])  # now neither one's: removed
    assert "perm-wm.json" not in names(out)


def test_what_an_earlier_call_wrote_stays_when_it_is_an_input_or_its_writer_is_unknown(tmp_path):
    import json

    from lmckit.files import MANIFEST

    out = tmp_path / "out"
    perm = _writer("perm")
    perm(out, ["wm", "am"])
    perm(out, ["sinkhorn"], inputs=[out / "perm-wm.json"])  # e.g. --perm out/perm-wm.json
    assert names(out) == ["perm-sinkhorn.json", "perm-wm.json", "perm.json"]
    # a folder an lmckit before this bookkeeping wrote: its files have no recorded writer
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["written_by"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    perm(out, ["am"])
    assert names(out) == ["perm-am.json", "perm-sinkhorn.json", "perm-wm.json", "perm.json"]


def test_a_failed_call_removes_nothing(tmp_path):
    out = tmp_path / "out"
    perm = _writer("perm")
    perm(out, ["wm"])
    with pytest.raises(OutputPathError):  # refused: perm-x.json is a folder of the user's
        (out / "perm-x.json").mkdir()
        perm(out, ["x"])
    assert "perm-wm.json" in names(out)


def test_a_folder_reached_through_a_symbolic_link_is_guarded_too(tmp_path):
    """The held folder is resolved; the paths written into it were compared unresolved, so
    through a link in --out nothing was guarded and a user's file was overwritten."""
    from lmckit.files import locked_output

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "real" / "mine.json").write_text("the user's")
    with locked_output(tmp_path / "link"):
        with pytest.raises(OutputPathError, match="was not written by lmckit"):
            atomic_write_json(tmp_path / "link" / "mine.json", {"x": 1})
        atomic_write_json(tmp_path / "link" / "ours.json", {"x": 1})
    assert (tmp_path / "real" / "mine.json").read_text() == "the user's"
    with locked_output(tmp_path / "link"):  # its own output, claimed through the link
        atomic_write_json(tmp_path / "link" / "ours.json", {"x": 2})
