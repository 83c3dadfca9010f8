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


def test_the_triplet_landscape_is_the_plane_through_the_aligned_models(run, digits):
    """The stored plane equals :func:`plane_landscape` on A, π_B(B), π_C(C) computed here,
    and the recorded summary is read off the grid points inside the triangle."""
    import json

    from lmckit.analysis import plane_landscape
    from lmckit.analysis.landscape import Landscape, triangle_summary
    from lmckit.transform import align

    out, jobs, metrics = run
    name = "triplet/b0/c0/0-1-2/wm-fast"
    folder = artifact(out, jobs[name], "triplet")
    stored = json.loads((folder / "landscape.json").read_text())
    a, b, c = (
        load_checkpoint(artifact(out, jobs[f"train/c0/seed{s}"], "checkpoint") / "model")
        for s in range(3)
    )
    perms = [
        load_permutation(
            artifact(out, jobs[f"match/c0/0-{k}/wm-fast"], "permutation") / "perm.json", a.spec
        )
        for k in (1, 2)
    ]
    three = [a.params, align(perms[0], b.params), align(perms[1], c.params)]
    direct = plane_landscape(a.model, three, digits.loader("test", batch_size=500), resolution=4)
    for field in ("accuracy", "loss"):
        torch.testing.assert_close(
            torch.tensor(stored[field]), torch.tensor(getattr(direct, field)), rtol=1e-6, atol=1e-9
        )
    summary = triangle_summary(Landscape(**stored))
    assert summary
    for key, value in summary.items():
        assert metrics[name, f"landscape.{key}"] == pytest.approx(value)


def test_the_landscape_summary_reads_the_triangle_only():
    """A 3 × 3 grid over the unit square with the triangle (0, 0), (1, 0), (0, 1): the six
    points with x + y ≤ 1 are inside (edges count), (1, 1), (½, 1) and (1, ½) are not;
    accuracy x + 2y, loss 10·x."""
    from lmckit.analysis.landscape import Landscape, triangle_summary

    xs = ys = [0.0, 0.5, 1.0]
    accuracy = [[x + 2 * y for x in xs] for y in ys]
    loss = [[10 * x for x in xs] for _ in ys]
    land = Landscape(xs, ys, loss, accuracy, [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)])
    inside = [x + 2 * y for y in ys for x in xs if x + y <= 1]
    summary = triangle_summary(land)
    assert summary["points_inside"] == 6
    assert summary["accuracy_min_inside"] == min(inside) == 0.0
    assert summary["accuracy_mean_inside"] == pytest.approx(sum(inside) / 6)
    assert summary["loss_max_inside"] == 10.0  # (1, 0); (1, ½) and (1, 1) are out


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
    # the dominant share counted by hand over every model's stored values
    for layer, per_model in stored["layers"].items():
        counted = [sum(v / values[0] > 0.3 for v in values) / len(values) for values in per_model]
        assert metrics[("spectra/c0", f"dominant_share.{layer}")] == pytest.approx(
            sum(counted) / len(counted), abs=1e-12
        )


def test_the_report_draws_the_analyses(run):
    out, _, _ = run
    text = write_report(out).read_text()
    assert "singular-vector alignment" in text and "singular values" in text
    assert "layerwise diagnostics at λ = ½, wm-fast" in text and "flatness proxy" in text
    assert "plane through the three aligned models (seeds 0-1-2; Ito et al. Fig. 5)" in text
    assert "width study Figs. 5, 21" in text and "width study Figs. 13–14" in text
    assert "0.123 ± 0.004 (a made-up reference for the test)" in text
