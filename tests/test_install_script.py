"""The dataset installer says what happened — apt's own error when it failed — and, asked
of lmckit itself, what the demo will use: never "falls back to digits" before a demo that
runs on Fashion-MNIST."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-datasets.sh"


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("lmckit_finds_it", [False, True])
def test_a_failed_apt_install_is_shown_and_the_verdict_is_lmckits(tmp_path, lmckit_finds_it):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "id", "echo 0")  # as root
    _tool(
        bin_dir,
        "apt-get",
        'echo "Reading package lists..."; echo "E: Unable to locate package '
        'dataset-fashion-mnist"; exit 100',
    )
    _tool(bin_dir, "python-stub", f"exit {0 if lmckit_finds_it else 1}")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "FASHION_MNIST_DIR": str(tmp_path / "absent")}  # fmt: skip
    out = subprocess.run(
        ["bash", str(SCRIPT), str(bin_dir / "python-stub")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "apt-get could not install dataset-fashion-mnist; it said:" in out
    assert "E: Unable to locate package dataset-fashion-mnist" in out
    if lmckit_finds_it:
        assert "lmckit finds it; the demo runs on it" in out and "falls back" not in out
    else:
        assert "the demo falls back to scikit-learn's bundled 8x8 digits" in out
