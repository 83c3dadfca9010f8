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
    """A demo on digits through the command line, in a folder that already holds a demo on
    the synthetic data (the case where the second dataset used to get the first one's
    barriers and permutations), shared by the tests below (a demo takes 20-40 s here): the
    folder, what the digits demo printed and the synthetic demo's summary."""
    from lmckit.experiments.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    synthetic = run_demo(out, dataset="synthetic", epochs=2, log=lambda _: None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*DIGITS_ARGS, "--out", str(out)]) == 0
    return out, printed.getvalue(), synthetic


@pytest.mark.slow
def test_demo_runs_on_digits_and_reuses_its_results(digits_demo, capsys):
    out, printed, _ = digits_demo
    for method in ("naive", "WM", "AM", "STE", "Sinkhorn"):
        assert f"| {method} |" in printed
    for name in ("interpolation.png", "interpolation.json", "interpolation.csv", "results.md"):
        assert (out / name).exists(), name
    first = json.loads((out / "results.json").read_text())
    assert main([*DIGITS_ARGS, "--out", str(out)]) == 0
    assert "0 jobs run, 20 reused from the store" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["rows"] == first["rows"]


@pytest.mark.slow
def test_the_demo_recomputes_for_another_dataset_in_the_same_folder(digits_demo):
    """Formerly the second dataset got the first one's barriers and permutations: now
    nothing of the synthetic run is reused, and no row or barrier is the synthetic one's."""
    out, printed, synthetic = digits_demo
    assert "20 jobs run, 0 reused from the store" in printed
    digits = json.loads((out / "results.json").read_text())
    assert digits["dataset"] == "digits" and synthetic["dataset"] == "synthetic"
    assert len(digits["rows"]) == len(synthetic["rows"]) == 5
    for ours, theirs in zip(digits["rows"], synthetic["rows"], strict=True):
        assert ours["method"] == theirs["method"]
        assert ours["loss_barrier"] != theirs["loss_barrier"], ours["method"]
    assert digits["pairwise_wm"] != synthetic["pairwise_wm"]


def test_the_repositorys_demo_file_is_the_built_in_one():
    from pathlib import Path

    from lmckit.experiments.demo import DEMO

    root = Path(__file__).resolve().parents[2]
    assert (root / "experiments" / "demo.toml").read_text() == DEMO.read_text()
