"""STE-MM §6 in an experiment: the aligned models' geometry (Figs. 6, 7, 9, 10) and the
merge's sharpness against its inputs' (Fig. 8), measured by a ``[[merge]]`` block."""

import itertools
import json
import math

import pytest

from lmckit.analysis import sharpness
from lmckit.checkpoint import load_checkpoint
from lmckit.data import load_dataset
from lmckit.experiments.dag import build_jobs
from lmckit.experiments.report import write_report
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment, model_configs
from lmckit.params import average_params, params_distance
from lmckit.perm import Permutation
from lmckit.store import Store
from lmckit.transform import align
from lmckit.workflows.merging import with_geometry_summary
from tests.experiments.conftest import read_ledger

TOML = """
name = "geometry"
seeds = [0, 1, 2]
threads = 1
[data]
dataset = "digits"
[model]
name = "mlp"
hidden = [16]
[train]
epochs = 1
batch_size = 128
[[merge]]
methods = ["merge-many"]
n = [3]
{probes}
"""


def _load(tmp_path, probes: str):
    path = tmp_path / "e.toml"
    path.write_text(TOML.format(probes=probes))
    return load_experiment(path)


def test_a_merge_block_measures_sharpness_and_geometry_as_their_definitions(tmp_path):
    exp = _load(tmp_path, "sharpness_probes = 3")
    out = tmp_path / "run"
    assert run_experiment(exp, out, log=lambda _: None).complete
    jobs, metrics = read_ledger(out)
    name = "merge/b0/c0/merge-many/n3"
    store = Store(out / "store")
    folder = store.folder("merge-metrics", jobs[name]["key"])
    ckpts = [
        load_checkpoint(store.folder("checkpoint", jobs[f"train/c0/seed{s}"]["key"]) / "model")
        for s in range(3)
    ]
    stored = json.loads((folder / "permutations.json").read_text())
    perms = [Permutation.from_dict(p, ckpts[0].spec) for p in stored]
    aligned = [align(p, c.params) for p, c in zip(perms, ckpts, strict=True)]
    # the naive version: every pair's distance, the triangle's angles by the law of cosines
    pairs = itertools.combinations(range(3), 2)
    d = {(i, j): params_distance(aligned[i], aligned[j]) for i, j in pairs}
    assert metrics[name, "distance_mean"] == pytest.approx(sum(d.values()) / 3, rel=1e-9)
    ratios = [v / (sum(d.values()) / 3) for v in d.values()]
    assert metrics[name, "distance_ratio_min"] == pytest.approx(min(ratios), rel=1e-9)
    assert metrics[name, "distance_ratio_max"] == pytest.approx(max(ratios), rel=1e-9)
    a, b, c = d[1, 2], d[0, 2], d[0, 1]  # the sides opposite models 0, 1, 2

    def angle(opposite, s1, s2):
        return math.degrees(math.acos((s1 * s1 + s2 * s2 - opposite * opposite) / (2 * s1 * s2)))

    angles = [angle(a, b, c), angle(b, a, c), angle(c, a, b)]
    assert metrics[name, "angle_min"] == pytest.approx(min(angles), rel=1e-9)
    assert metrics[name, "angle_max"] == pytest.approx(max(angles), rel=1e-9)
    spread = math.sqrt(sum((x - 60.0) ** 2 for x in angles) / 3)  # their mean is 60
    assert metrics[name, "angle_std"] == pytest.approx(spread, rel=1e-6, abs=1e-9)
    assert "angle_mean" not in {m for _, m in metrics}  # 60 for any triangles: not listed
    # sharpness: the same estimator, probes and seed on the merge (MergeMany's: the mean of
    # the aligned models) and on every input
    test = load_dataset("digits").loader("test", batch_size=1000)
    inputs = [sharpness(c.model, c.params, test, probes=3, seed=0).value for c in ckpts]
    assert metrics[name, "sharpness_models_mean"] == pytest.approx(sum(inputs) / 3, rel=1e-6)
    merged = sharpness(ckpts[0].model, average_params(aligned), test, probes=3, seed=0)
    assert metrics[name, "sharpness_merged"] == pytest.approx(merged.value, rel=1e-5)
    assert metrics[name, "sharpness_merged_stderr"] == pytest.approx(merged.stderr, rel=1e-4)
    write_report(out)
    page = (out / "report.html").read_text()
    assert "aligned models&#x27; geometry" in page or "aligned models' geometry" in page
    assert "Figs. 3a, 3b, 4, 8" in page


def test_sharpness_probes_are_part_of_the_merge_key(tmp_path, digits):
    def merge_job(probes):
        exp = _load(tmp_path, probes)
        jobs = build_jobs(exp, model_configs(exp, lambda _name: digits))
        return next(j for j in jobs if j.kind == "merge")

    plain, probed = merge_job(""), merge_job("sharpness_probes = 4")
    assert "sharpness_probes" not in plain.settings  # earlier files keep their keys
    assert probed.settings["sharpness_probes"] == 4


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "sharpness_probes must be at least 2"),
        ("-3", "sharpness_probes must be at least 2"),
        ('"many"', "sharpness_probes must be an integer"),
        ("true", "sharpness_probes must be an integer"),
    ],
)
def test_bad_sharpness_probes_are_refused_by_name(tmp_path, value, message):
    with pytest.raises(ExperimentError, match=message):
        _load(tmp_path, f"sharpness_probes = {value}")


def test_the_geometry_summary_of_known_triangles():
    """An equilateral triangle: ratios 1, angles 60°, spread 0; a right isosceles one (sides
    1, 1, √2): ratios 1/m and √2/m for the mean m, angles 45, 45 and 90 (population spread
    √((15² + 15² + 30²)/3)); NaN entries (coinciding models) are left out; an entry without
    lists gains nothing."""
    equilateral = with_geometry_summary(
        {"pair_distances": [2.0] * 3, "distance_ratios": [1.0] * 3, "triplet_angles": [60.0] * 3}
    )
    assert equilateral["distance_mean"] == 2.0
    assert equilateral["distance_ratio_min"] == equilateral["distance_ratio_max"] == 1.0
    assert equilateral["angle_min"] == equilateral["angle_max"] == 60.0
    assert equilateral["angle_std"] == 0.0
    m = (2 + math.sqrt(2)) / 3
    right = with_geometry_summary(
        {
            "pair_distances": [1.0, 1.0, math.sqrt(2)],
            "distance_ratios": [1 / m, 1 / m, math.sqrt(2) / m],
            "triplet_angles": [45.0, 45.0, 90.0, math.nan],
        }
    )
    assert right["distance_ratio_min"] == pytest.approx(1 / m)
    assert right["distance_ratio_max"] == pytest.approx(math.sqrt(2) / m)
    assert (right["angle_min"], right["angle_max"]) == (45.0, 90.0)
    assert right["angle_std"] == pytest.approx(math.sqrt((15**2 + 15**2 + 30**2) / 3))
    assert with_geometry_summary({"n": 2}) == {"n": 2}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1", "landscape is the grid's points per side, from 2 to 101"),
        ("500", "landscape is the grid's points per side, from 2 to 101"),
        ('"fine"', "landscape must be an integer"),
    ],
)
def test_bad_landscape_resolutions_are_refused_by_name(tmp_path, value, message):
    path = tmp_path / "t.toml"
    path.write_text(
        TOML.format(probes="").replace("[[merge]]", f"[[triplets]]\nlandscape = {value}\n[[merge]]")
    )
    with pytest.raises(ExperimentError, match=message):
        load_experiment(path)
