"""The analysis, triplet and spectra steps of an experiment agree with the library
functions called directly on the same checkpoints."""

from pathlib import Path

import pytest
import torch

from lmckit.analysis import alignment, l2_distances, singular_values, taylor_barrier
from lmckit.checkpoint import load_checkpoint
from lmckit.experiments.report import write_report
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from lmckit.store import Store
from lmckit.workflows.matching import load_permutation
from tests.experiments.conftest import read_ledger

FILE = Path(__file__).parent / "files" / "analyses.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("analyses")
    summary = run_experiment(load_experiment(FILE), out, log=lambda _: None)
    assert summary.complete and not summary.failed
    jobs, metrics = read_ledger(out)
    return out, jobs, metrics


def artifact(out, job, kind):
    return Store(out / "store").folder(kind, job["key"])


def test_the_analysis_step_records_what_the_library_computes(run, digits):
    out, jobs, metrics = run
    a = load_checkpoint(artifact(out, jobs["train/c0/seed0"], "checkpoint") / "model")
    b = load_checkpoint(artifact(out, jobs["train/c0/seed1"], "checkpoint") / "model")
    perm = load_permutation(
        artifact(out, jobs["match/c0/0-1/wm-fast"], "permutation") / "perm.json", a.spec
    )
    name = "analysis/b0/c0/0-1/wm-fast"
    d = l2_distances(a.params, b.params, perm)
    assert metrics[(name, "l2.before")] == pytest.approx(d.parameters[0], rel=1e-12)
    assert metrics[(name, "l2.after")] == pytest.approx(d.parameters[1], rel=1e-12)
    expected = alignment(a.spec, a.params, b.params, perm, gamma=0.3).total
    assert metrics[(name, "R.0.3")] == pytest.approx(expected, rel=1e-9)
    assert metrics[(name, "R.0.3")] > metrics[("analysis/b0/c0/0-1/none", "R.0.3")] + 0.05
    t = taylor_barrier(
        a.model,
        a.params,
        perm.apply(b.params),
        digits.loader("test", batch_size=1000, shuffle=False),
        lambdas=[0.5],
    )
    assert metrics[(name, "taylor.predicted.0.5")] == pytest.approx(t.predicted[0], rel=1e-6)
    assert metrics[(name, "taylor.actual.0.5")] == pytest.approx(t.actual[0], rel=1e-6, abs=1e-7)
    for g in ("0", "0.3"):
        assert 0 < metrics[(name, f"R_merged.a.{g}")] <= 1


def test_the_layerwise_analysis_records_what_the_library_computes(run, digits):
    from lmckit.analysis import layerwise, random_permutation_merges

    out, jobs, metrics = run
    a = load_checkpoint(artifact(out, jobs["train/c0/seed0"], "checkpoint") / "model")
    b = load_checkpoint(artifact(out, jobs["train/c0/seed1"], "checkpoint") / "model")
    perm = load_permutation(
        artifact(out, jobs["match/c0/0-1/wm-fast"], "permutation") / "perm.json", a.spec
    )
    loader = digits.loader("test", batch_size=1000, shuffle=False)
    direct = layerwise(a.model, a.params, perm.apply(b.params), loader)
    name = "analysis/b0/c0/0-1/wm-fast"
    for row in direct.layers:
        assert metrics[(name, f"layerwise.depth.{row['name']}")] == row["depth"]
        assert metrics[(name, f"layerwise.lewc.{row['name']}")] == pytest.approx(row["lewc"])
        assert metrics[(name, f"layerwise.commutativity.{row['name']}")] == pytest.approx(
            row["commutativity"]
        )
    # The pair-level extras run once per pair, in the unpermuted ("none") job.
    none = "analysis/b0/c0/0-1/none"
    assert (name, "random.temperature") not in metrics
    given = random_permutation_merges(
        a.model, a.spec, a.params, b.params, loader, n=0, perm=perm
    ).merges["given"]
    assert metrics[(name, "given.calibrated_loss_barrier")] == pytest.approx(
        given["calibrated_loss_barrier"]
    )
    merges = random_permutation_merges(a.model, a.spec, a.params, b.params, loader).merges
    assert metrics[(none, "none.accuracy")] == pytest.approx(merges["none"]["accuracy"])
    randoms = [m["calibrated_loss_barrier"] for k, m in merges.items() if k != "none"]
    assert metrics[(none, "random.calibrated_loss_barrier")] == pytest.approx(
        sum(randoms) / len(randoms)
    )
    from lmckit.metrics import evaluate

    assert metrics[(none, "flatness.accuracy.0")] == evaluate(a.model, a.params, loader).accuracy
    assert 0 < metrics[(none, "gaussian.layer1")] < 1


def test_the_triplet_step_reuses_the_pair_matches(run):
    _, jobs, metrics = run
    ab = metrics[("triplet/b0/c0/0-1-2/wm-fast", "R.a-b")]
    assert ab == pytest.approx(metrics[("analysis/b0/c0/0-1/wm-fast", "R.0.3")], rel=1e-9)
    assert metrics[("triplet/b0/c0/0-1-2/wm-fast", "R.b-c")] > 0.0
    assert sum(1 for name in jobs if name.startswith("match/")) == 2  # no duplicate matches


def test_the_spectra_step_stores_every_models_singular_values(run):
    import json

    out, jobs, metrics = run
    stored = json.loads((artifact(out, jobs["spectra/c0"], "spectra") / "spectra.json").read_text())
    a = load_checkpoint(artifact(out, jobs["train/c0/seed2"], "checkpoint") / "model")
    for layer, values in singular_values(a.params).items():
        torch.testing.assert_close(
            torch.tensor(stored["layers"][layer][2], dtype=torch.float64), values
        )
    assert metrics[("spectra/c0", "spread.layers.1.weight")] >= 0


def test_the_report_draws_the_analyses(run):
    out, _, _ = run
    text = write_report(out).read_text()
    assert "singular-vector alignment" in text and "singular values" in text
    assert "layerwise diagnostics at λ = ½, wm-fast" in text and "flatness proxy" in text
    assert "0.123 ± 0.004 (a made-up reference for the test)" in text
