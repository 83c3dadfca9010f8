"""scripts/gpu_rows.py: the unfinished and GPU-only reproduction rows, run in commands of a
few minutes, resumable, writing the results files the pages render — exercised on the CPU
at its tiny settings (never a result)."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from lmckit.experiments.results import read_results, select_row

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_rows():
    spec = importlib.util.spec_from_file_location("gpu_rows", ROOT / "scripts" / "gpu_rows.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_rows"] = module
    spec.loader.exec_module(module)
    return module


def test_every_row_is_an_experiment_file_and_says_what_it_needs(gpu_rows, capsys):
    names = [row.name for row in gpu_rows.ROWS]
    assert len(set(names)) == len(names)
    for row in gpu_rows.ROWS:
        assert row.file.is_file(), row.name
        assert row.needs and row.fills
        assert row.dataset_on_disk == ("cifar" in row.name), row.name
    assert gpu_rows.main(["list"]) == 0
    printed = capsys.readouterr().out
    assert all(f"{name}:" in printed for name in names)
    assert "CIFAR-100 on the machine" in printed and "not started" in printed


def test_a_row_runs_at_tiny_settings_and_writes_the_results_file_the_pages_read(
    gpu_rows, tmp_path, capsys
):
    store, results = tmp_path / "store", tmp_path / "results"
    results.mkdir()
    cpu_run = results / "lewc-width-fmnist-full.json"
    cpu_run.write_text("a CPU run's results")  # beside a CPU run's file: never replaced
    common = ["--store", str(store), "--device", "cpu", "--tiny", "--results-dir", str(results)]
    assert gpu_rows.main(["run", "lewc-width-fmnist-full", *common, "--minutes", "5"]) == 0
    assert cpu_run.read_text() == "a CPU run's results"
    document = read_results(results / "lewc-width-fmnist-full-gpu.json")
    for width in (0.25, 0.5):
        row = select_row(
            document, "analysis", "none.calibrated_loss_barrier",
            {"method": "none", "width_multiplier": str(width)}, "test",
        )  # fmt: skip
        assert row["n"] == 3  # the three pairs of seeds 0–2
    assert gpu_rows.complete(store / "lewc-width-fmnist-full") is True
    # complete rows are not run again
    before = (results / "lewc-width-fmnist-full-gpu.json").read_bytes()
    capsys.readouterr()
    assert gpu_rows.main(["run", "lewc-width-fmnist-full", *common]) == 0
    assert "running" not in capsys.readouterr().out
    assert (results / "lewc-width-fmnist-full-gpu.json").read_bytes() == before


def test_a_row_stopped_at_its_deadline_goes_on_when_run_again(gpu_rows, tmp_path):
    """A deadline SIGTERMs the run (here within a second: while it starts); the command
    says so with exit 3, and the same command run again completes the row."""
    store, results = tmp_path / "store", tmp_path / "results"
    args = argparse.Namespace(
        device="cpu", jobs=1, data_dir=None, tiny=True, results_dir=str(results)
    )
    row = next(r for r in gpu_rows.ROWS if r.name == "stemm-fig5")
    assert gpu_rows.run_row(row, store, 1.0, args, log=lambda _: None) == "stopped"
    assert gpu_rows.complete(store / "stemm-fig5") is not True
    common = ["--store", str(store), "--device", "cpu", "--tiny", "--results-dir", str(results)]
    assert gpu_rows.main(["run", "stemm-fig5", *common, "--minutes", "5"]) == 0
    document = read_results(results / "stemm-fig5.json")
    assert any(r["kind"] == "merge" and r["metric"] == "loss_gap" for r in document["rows"])


def test_rows_without_tiny_settings_and_unknown_rows(gpu_rows, tmp_path, capsys):
    common = ["--store", str(tmp_path), "--device", "cpu", "--tiny"]
    assert gpu_rows.main(["run", "width-resnet20-fmnist", *common]) == 0
    assert "no tiny settings" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        gpu_rows.main(["run", "no-such-row", *common])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    "extra, why",
    [
        (["--device", "gpu0"], "is not cpu, cuda"),
        (["--results-dir", "FILE"], "--results-dir .* is a file"),
        (["--data-dir", "NOWHERE"], "--data-dir .* is not a folder"),
        (["--minutes", "0"], "--minutes must be positive"),
    ],
)
def test_bad_options_are_refused_before_any_run(gpu_rows, tmp_path, capsys, extra, why):
    import re

    afile = tmp_path / "a-file"
    afile.write_text("not a folder")
    extra = [str(afile) if x == "FILE" else str(tmp_path / "nowhere") if x == "NOWHERE" else x
             for x in extra]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        gpu_rows.main(["run", "--store", str(tmp_path / "store"), *extra])
    assert exc.value.code == 2 and re.search(why, capsys.readouterr().err)
    assert not (tmp_path / "store").exists()  # nothing was run
    with pytest.raises(SystemExit):
        gpu_rows.main(["list", "--store", str(afile)])


def test_a_row_runs_at_the_papers_settings_and_tiny_settings_win_in_tests(gpu_rows, tmp_path):
    """STE-MM Figs. 6–10: the file runs STE-MM 2 epochs on the CPU; the GPU row passes the
    paper's 10 (and n = 2, 3, 5, 10) to ``lmckit run``; ``--tiny`` overrides them again."""
    import argparse

    from lmckit.experiments.schema import load_experiment, parse_overrides

    row = next(r for r in gpu_rows.ROWS if r.name == "stemm-geometry-fmnist")
    args = argparse.Namespace(device="cuda", jobs=1, data_dir=None, tiny=False)
    command = gpu_rows.run_command(row, tmp_path / "out", args)
    sets = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    assert sets == ["merge.1.options.ste-mm.epochs=10", "merge.1.n=[2, 3, 5, 10]"]
    exp = load_experiment(row.file, overrides=parse_overrides(sets))
    assert exp.merge[1].options["ste-mm"]["epochs"] == 10 and exp.merge[1].n == (2, 3, 5, 10)
    tiny = gpu_rows.run_command(
        row, tmp_path / "out", argparse.Namespace(**{**vars(args), "tiny": True})
    )
    assert "merge.1.options.ste-mm.epochs=1" in tiny and 'data.dataset="digits"' in tiny
