"""The demo: dataset choice and a whole run on digits."""

import contextlib
import io
import json

import pytest

import lmckit.experiments.demo as demo
from lmckit.cli import main


def test_demo_falls_back_to_digits_and_says_so(monkeypatch):
    monkeypatch.setattr(demo, "fashion_mnist_available", lambda: False)
    said = []
    data = demo.choose_dataset(None, said.append)
    assert data.name == "digits"
    assert "apt-get install dataset-fashion-mnist" in said[0] and "digits" in said[0]


DIGITS_ARGS = ["demo", "--dataset", "digits", "--epochs", "2", "-q"]


@pytest.fixture(scope="module")
def digits_demo(tmp_path_factory):
    """One fresh demo on digits through the command line, shared by the tests below (a demo
    takes about 40 s here): its folder and what it printed."""
    out = tmp_path_factory.mktemp("digits-demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*DIGITS_ARGS, "--out", str(out)]) == 0
    return out, printed.getvalue()


@pytest.mark.slow
def test_demo_runs_on_digits_and_reuses_its_results(digits_demo, capsys):
    out, printed = digits_demo
    for method in ("naive", "WM", "AM", "STE", "Sinkhorn"):
        assert f"| {method} |" in printed
    for name in ("interpolation.png", "interpolation.json", "interpolation.csv", "results.md"):
        assert (out / name).exists(), name
    first = json.loads((out / "results.json").read_text())
    assert main([*DIGITS_ARGS, "--out", str(out)]) == 0
    assert "0 jobs run, 20 reused from the store" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["rows"] == first["rows"]


@pytest.mark.slow
def test_the_demo_recomputes_for_another_dataset_in_the_same_folder(tmp_path, digits_demo):
    """Formerly the second dataset got the first one's barriers and permutations."""
    from lmckit.experiments.demo import run_demo

    quiet = {"log": lambda _: None, "epochs": 2}
    first = run_demo(tmp_path / "out", dataset="synthetic", **quiet)
    second = run_demo(tmp_path / "out", dataset="digits", **quiet)
    fresh = json.loads((digits_demo[0] / "results.json").read_text())

    def rows(summary):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in summary["rows"]]

    assert second["dataset"] == "digits" and rows(second) == rows(fresh)
    assert rows(second) != rows(first)
    assert second["pairwise_wm"] == fresh["pairwise_wm"]


def test_the_repositorys_demo_file_is_the_built_in_one():
    from pathlib import Path

    from lmckit.experiments.demo import DEMO

    root = Path(__file__).resolve().parents[2]
    assert (root / "experiments" / "demo.toml").read_text() == DEMO.read_text()
