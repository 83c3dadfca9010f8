"""Outputs are written without reading what is there, and inputs are opened only when they
are regular files: a FIFO, a character device (``/dev/null``, ``/dev/zero``, ``/dev/full``)
or a large file of the user's at an output's name is refused or replaced, never read
whole; a FIFO or a device given as an input is named as what it is, never waited on.

A FIFO that a check forgot would block the test forever, so each FIFO here has a helper
thread that opens its writing end as soon as a reader waits on it (and closes it at once:
the reader then sees an empty file) — a forgotten check fails the test instead."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

import pytest
import torch

from lmckit.checkpoint import read_meta, read_safetensors, save_checkpoint
from lmckit.cli import main
from lmckit.errors import CheckpointError, OutputPathError, ParamsError, PermutationError
from lmckit.files import (
    atomic_write_json,
    check_output_dir,
    check_output_file,
    describe_path,
    leading_format,
    prepare_output_file,
    special_kind,
)
from lmckit.models import build_model

DEVICE = "/dev/null"  # a character device on every Linux


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    stop = threading.Event()

    def unblock():  # a reader that waits on the FIFO gets EOF instead of waiting forever
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.05)
                continue
            os.close(fd)
            time.sleep(0.05)

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join(5)


def test_special_files_are_named_for_what_they_are(tmp_path, fifo):
    assert special_kind(fifo) == "a FIFO (named pipe)"
    assert special_kind(DEVICE) == "a character device"
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(fifo)
    assert special_kind(tmp_path / "file") is None and special_kind(tmp_path) is None
    assert special_kind(tmp_path / "missing") is None
    assert special_kind(tmp_path / "link") == "a FIFO (named pipe)"  # links followed
    import socket

    with socket.socket(socket.AF_UNIX) as listening:  # a socket file: neither file nor folder
        listening.bind(str(tmp_path / "sock"))
        assert special_kind(tmp_path / "sock") == "a socket"
        with pytest.raises(OutputPathError, match="is a socket, not a regular file"):
            prepare_output_file(tmp_path / "sock", "--out")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    assert [describe_path(tmp_path / n) for n in ("file", "dangling", "missing")] == [
        "a file",
        "a broken symbolic link",
        "nothing",
    ]


@pytest.mark.parametrize("where", ["fifo", "device", "link"])
def test_an_output_at_a_special_file_is_refused_before_anything_is_written(tmp_path, fifo, where):
    target = {"fifo": fifo, "device": DEVICE, "link": tmp_path / "link"}[where]
    if where == "link":
        target.symlink_to(fifo)
    kind = "FIFO" if where != "device" else "character device"
    with pytest.raises(OutputPathError, match=kind):
        check_output_file(target, "--out", file_format="lmckit-permutation")
    with pytest.raises(OutputPathError, match=kind):
        prepare_output_file(target, "--out")
    with pytest.raises(OutputPathError, match=f"is an? {kind}.*; a folder is needed"):
        check_output_dir(target, "--out")
    with pytest.raises(OutputPathError, match=f"under an? {kind}"):
        check_output_dir(os.path.join(target, "sub"), "--out")
    if where != "device":  # never renamed over: the FIFO is still a FIFO
        with pytest.raises(OutputPathError, match=kind):
            atomic_write_json(target, {"x": 1})
        assert special_kind(target) == "a FIFO (named pipe)"


def test_a_large_file_at_an_output_is_judged_by_its_first_bytes(tmp_path):
    """A 2 GiB file of the user's (sparse: no disk used) at ``--out``: refused while less
    than a megabyte is allocated — it was read whole into memory."""
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(2 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(OutputPathError, match="not a file lmckit wrote"):
            check_output_file(big, "--out", file_format="lmckit-permutation")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    # lmckit's own file, whatever its size, is recognised from its head and may be replaced
    ours = tmp_path / "ours.json"
    atomic_write_json(ours, {"format": "lmckit-permutation", "perm": list(range(200_000))})
    assert leading_format(ours) == "lmckit-permutation"
    assert check_output_file(ours, "--out", file_format="lmckit-permutation") == ours
    with pytest.raises(OutputPathError, match="not a file lmckit wrote"):
        check_output_file(ours, "--out", file_format="lmckit-spec")


def test_a_fifo_or_a_device_given_as_an_input_is_named_and_never_waited_on(tmp_path, fifo):
    from lmckit.evaluate.interpolation import load_curves
    from lmckit.model_folder import read_layout
    from lmckit.perm import PermutationSpec
    from lmckit.workflows.matching import load_alignment, load_permutation, load_transform

    spec = PermutationSpec({"g": 2}, {"w": ("g",)})
    for source in (fifo, DEVICE):
        kind = "FIFO" if source == fifo else "character device"
        with pytest.raises(CheckpointError, match=kind):
            read_safetensors(source)
        with pytest.raises(CheckpointError, match=kind):
            read_layout(source)
        for loader in (load_permutation, load_alignment, load_transform):
            with pytest.raises(PermutationError, match=kind):
                loader(source, spec)
    os.mkfifo(tmp_path / "curves.json")
    with pytest.raises(ParamsError, match="FIFO"):
        load_curves(tmp_path / "curves.json")
    # a checkpoint whose sidecar is a FIFO
    model = build_model("mlp", in_dim=4, hidden=[3], out_dim=2)
    weights = save_checkpoint(tmp_path / "ck", model, {"dataset": "digits"})
    sidecar = weights.with_suffix(".json")
    sidecar.unlink()
    os.mkfifo(sidecar)
    with pytest.raises(CheckpointError, match="FIFO"):
        read_meta(weights)


def test_the_command_line_refuses_special_files_in_one_line(tmp_path, fifo, capsys):
    torch.manual_seed(0)
    paths = []
    for seed in (0, 1):
        model = build_model("mlp", in_dim=64, hidden=[8], out_dim=10)
        paths.append(str(save_checkpoint(tmp_path / f"m{seed}", model, {"dataset": "digits"})))
    for out in (str(fifo), DEVICE, "/dev/zero", "/dev/full"):
        assert main(["match", *paths, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a regular file" in err[0], err
    for argv in (
        ["match", str(fifo), paths[1], "--out", str(tmp_path / "p.json")],
        ["match", "/dev/zero", paths[1], "--out", str(tmp_path / "p.json")],
        ["spec", str(fifo)],
        ["interpolate", *paths, "--perm", str(fifo), "--out", str(tmp_path / "i")],
        ["interpolate", *paths, "--out", "/dev/zero"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("FIFO" in err[0] or "character device" in err[0]), (argv, err)
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "i").exists()
