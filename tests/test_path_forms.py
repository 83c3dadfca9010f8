"""Every guard that keeps a user's files safe holds whatever form the path takes: absolute,
relative to the working folder, through ``..``, through a symbolically linked folder, a
symbolic link to the file, a hard link to it. A guard that compares paths as written lets
one of these forms through — and a user's input is overwritten or removed.

The guards: an output is never one of the inputs (:func:`lmckit.files.check_not_inputs`,
:func:`lmckit.files.input_at`); the inputs of the command holding a folder are found from any
form of the folder's path (:func:`lmckit.files.held_inputs`); a model folder written again
removes only plain names its own ``lmckit.json`` listed, never ``../x``, ``sub/x`` or an
absolute path that an edited (or hostile) ``lmckit.json`` lists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmckit.errors import OutputPathError
from lmckit.files import (
    check_not_inputs,
    check_outputs,
    held_inputs,
    input_at,
    locked_output,
)

FORMS = ("absolute", "relative", "dotdot", "linked-folder", "symlink", "hardlink")


def _form(form: str, target: Path, root: Path) -> Path:
    """A path that reaches ``target`` (a file under ``root/data``) in the form named."""
    if form == "absolute":
        return target
    if form == "relative":
        return Path(os.path.relpath(target, Path.cwd()))
    if form == "dotdot":
        return target.parent / ".." / target.parent.name / target.name
    if form == "linked-folder":
        link = root / "data-link"
        if not link.exists():
            link.symlink_to(target.parent, target_is_directory=True)
        return link / target.name
    if form == "symlink":
        link = root / f"{target.name}.symlink"
        link.symlink_to(target)
        return link
    if form == "hardlink":
        link = root / f"{target.name}.hardlink"
        os.link(target, link)
        return link
    raise AssertionError(form)


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # relative paths climb out of here
    return tmp_path


@pytest.mark.parametrize("form", FORMS)
def test_an_output_in_any_form_of_an_input_is_that_input(root, form):
    given = root / "data" / "a.safetensors"
    given.write_bytes(b"the user's weights")
    out = _form(form, given, root)
    assert input_at(out, [given]) == given
    with pytest.raises(OutputPathError, match="one of the inputs"):
        check_not_inputs([out], [given])
    # and the other way round: the input given in that form, the output as written
    assert input_at(given, [out]) == out
    with pytest.raises(OutputPathError, match="one of the inputs"):
        check_not_inputs([given], [out])
    assert input_at(root / "data" / "b.safetensors", [given]) is None
    assert given.read_bytes() == b"the user's weights"


@pytest.mark.parametrize("form", ["absolute", "relative", "dotdot", "linked-folder"])
def test_the_inputs_of_a_held_folder_are_found_from_any_form_of_its_path(root, form):
    given = root / "data" / "a.safetensors"
    given.write_bytes(b"x")
    out = root / "data" / "out"
    out.mkdir()
    marker = out / "m"
    marker.write_text("")
    reach = _form(form, marker, root).parent
    with locked_output(out):
        check_outputs([out / "result.json"], [given])
        assert held_inputs(reach) == [given]
        assert held_inputs(reach / "result.json") == [given]
    assert held_inputs(reach) == []  # released


@pytest.mark.parametrize(
    "listed", ["../victim.txt", "sub/x.txt", "ABSOLUTE", ".hidden", "", "./victim.txt"]
)
def test_a_model_folder_removes_only_plain_names_its_own_sidecar_listed(tmp_path, listed):
    """An edited ``lmckit.json`` naming files outside the folder, in a subfolder, by an
    absolute path or hidden: none of them is removed when another model is written there."""
    pytest.importorskip("transformers")
    import transformers as T

    from lmckit.model_folder import SIDECAR, load_model_folder, write_model_folder
    from tests.test_model_folder import gpt2_config, save

    source = load_model_folder(save(tmp_path / "src", T.GPT2LMHeadModel, gpt2_config(), 0))
    out = tmp_path / "out"
    write_model_folder(out, source)
    victims = {
        "../victim.txt": tmp_path / "victim.txt",
        "sub/x.txt": out / "sub" / "x.txt",
        ".hidden": out / ".hidden",
        "./victim.txt": out / "victim.txt",
        "ABSOLUTE": tmp_path / "absolute-victim.txt",
        "": None,
    }
    victim = victims[listed]
    name = str(victim) if listed == "ABSOLUTE" else listed
    if victim is not None:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("the user's")
    meta = json.loads((out / SIDECAR).read_text())
    meta["files_sha256"][name] = "0" * 64
    (out / SIDECAR).write_text(json.dumps(meta, indent=2))
    said: list[str] = []
    write_model_folder(out, source, log=said.append)
    if victim is not None:
        assert victim.read_text() == "the user's"
    assert not said  # nothing of the earlier model's was left to remove
