"""The command line's transcript: `--help` of every command and the one-line error of every
bad input of `tests/test_cli.py`'s table (and a few for the commands it lacks), recorded in
`tests/fixtures/cli_transcript.json` and compared word for word.

The file was recorded before the command line moved from one module into the package
`lmckit/cli/`; a change in it is a change users see, so each is deliberate: rewrite the file
with ``LMCKIT_RECORD_TRANSCRIPT=1 pytest tests/test_cli_transcript.py`` and say why in the
commit.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from lmckit.cli import build_parser, main
from tests.test_cli import bad_inputs, write_bad_input_files

TRANSCRIPT = Path(__file__).parent / "fixtures" / "cli_transcript.json"
RECORD = os.environ.get("LMCKIT_RECORD_TRANSCRIPT") == "1"


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def help_texts() -> dict[str, str]:
    """``lmckit --help`` and ``lmckit COMMAND --help`` for every command, at 100 columns."""
    texts = {}
    for command in ["", *_commands()]:
        argv = [command, "--help"] if command else ["--help"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
        texts[command or "lmckit"] = out.getvalue()
    return texts


def extra_bad_inputs(root: Path) -> list[tuple[str, list[str]]]:
    """Bad inputs of the commands the table of `test_cli` leaves out."""
    (root / "bad.toml").write_text("this is = not [toml")
    (root / "empty.toml").write_text("")
    return [
        ("status-missing", ["status", str(root / "absent")]),
        ("status-file", ["status", str(root / "file")]),
        ("report-missing", ["report", str(root / "absent")]),
        ("report-not-a-run", ["report", str(root / "folder")]),
        ("run-missing", ["run", str(root / "absent.toml"), "--out", str(root / "r")]),
        ("run-not-toml", ["run", str(root / "bad.toml"), "--out", str(root / "r")]),
        ("run-empty", ["run", str(root / "empty.toml"), "--out", str(root / "r")]),
        ("unknown-command", ["frobnicate"]),
        ("no-command", []),
        ("train-no-out", ["train", "--model", "mlp"]),
        ("info-extra", ["info", "extra"]),
    ]


def error_lines(root: Path, capsys) -> dict[str, dict]:
    """Each bad input's exit status and stderr, the fixture folder written as ``<root>``."""
    # the device this machine lacks differs between machines: test_cli checks that case
    cases = [
        (case, argv)
        for case, argv, _, _ in bad_inputs(_files(root))
        if case != "device-unavailable"
    ]
    cases += extra_bad_inputs(root)
    out = {}
    for case, argv in cases:
        code = main(argv)
        err = capsys.readouterr().err.replace(str(root), "<root>")
        out[case] = {"argv": [a.replace(str(root), "<root>") for a in argv], "exit": code,
                     "stderr": err}  # fmt: skip
    return out


_FILES: dict[Path, dict] = {}


def _files(root: Path) -> dict:
    if root not in _FILES:
        _FILES[root] = write_bad_input_files(root)
    return _FILES[root]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("transcript")


@pytest.fixture(autouse=True)
def _columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help at the terminal's width


def test_help_of_every_command_is_as_recorded():
    texts = help_texts()
    if RECORD:
        _write("help", texts)
    recorded = json.loads(TRANSCRIPT.read_text())["help"]
    assert sorted(texts) == sorted(recorded)
    changed = [command for command in texts if texts[command] != recorded[command]]
    assert not changed, f"help changed for {changed}: rewrite the transcript if deliberate"


def test_every_bad_inputs_error_is_as_recorded(root, capsys):
    lines = error_lines(root, capsys)
    assert len(lines) >= 50
    if RECORD:
        _write("errors", lines)
    recorded = json.loads(TRANSCRIPT.read_text())["errors"]
    assert sorted(lines) == sorted(recorded)
    changed = {
        case: (recorded[case], lines[case]) for case in lines if lines[case] != recorded[case]
    }
    assert not changed, json.dumps(changed, indent=1)


def _write(part: str, value: dict) -> None:
    old = json.loads(TRANSCRIPT.read_text()) if TRANSCRIPT.exists() else {}
    TRANSCRIPT.write_text(json.dumps({**old, part: value}, indent=1, sort_keys=True) + "\n")
