"""Per-part evaluation of models trained on parts of the data, and the one-shot average."""

import pytest
import torch
import torch.nn.functional as F

from lmckit.data import Split, TensorLoader
from lmckit.errors import ParamsError
from lmckit.evaluate import calibration_metrics
from lmckit.evaluate.parts import ENSEMBLE, majority_classes, part_groups, parts_report
from lmckit.merge import average
from lmckit.metrics import predict
from lmckit.models import build_model, permutation_spec


def _labels(per_class=100, classes=10):
    return torch.arange(classes).repeat_interleave(per_class)


def test_majority_classes_of_the_imbalanced_halves_and_of_dirichlet_clients():
    labels = _labels()
    a, b = (Split("class-imbalanced", p, fraction=0.2) for p in (0, 1))
    assert majority_classes(a, labels) == [5, 6, 7, 8, 9]
    assert majority_classes(b, labels) == [0, 1, 2, 3, 4]
    fed = Split("dirichlet", 1, clients=3, alpha=0.3, seed=4)
    part = fed.indices(labels)
    share = torch.bincount(labels[part], minlength=10) / 100
    assert majority_classes(fed, labels) == [c for c in range(10) if share[c] > 1 / 3]


def test_part_groups_name_each_part_once_and_refuse_two_partitions():
    labels = _labels()
    a, b = (Split("class-imbalanced", p) for p in (0, 1))
    assert part_groups([a, None, b, a], labels) == {
        "part a": [5, 6, 7, 8, 9],
        "part b": [0, 1, 2, 3, 4],
    }
    assert part_groups([None, None], labels) == {}
    # a random split favours no class by construction: no groups, whatever the seeds
    halves = [Split("random", 0, seed=1), Split("random", 1, seed=2)]
    assert part_groups(halves, labels) == {}
    with pytest.raises(ParamsError, match="different partitions"):
        part_groups([a, Split("class-imbalanced", 1, fraction=0.3)], labels)


def test_parts_report_equals_a_direct_computation():
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=6, hidden=[8], out_dim=4)
    params = {n: build_model("mlp", in_dim=6, hidden=[8], out_dim=4).state_dict() for n in "xy"}
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(90, 6, generator=g), torch.randint(0, 4, (90,), generator=g)
    loader = TensorLoader(x, y, batch_size=32)
    groups = {"low": [0, 1], "three": [3], "none": []}
    report = parts_report(model, params, loader, groups=groups, ensemble_of=["x", "y"])
    logits = {n: predict(model, p, loader)[0] for n, p in params.items()}
    logits[ENSEMBLE] = (logits["x"] + logits["y"]) / 2
    for name, lg in logits.items():
        row = report[name]
        assert row["loss"] == pytest.approx(F.cross_entropy(lg.double(), y).item(), rel=1e-6)
        hit = lg.argmax(1) == y
        assert row["accuracy"] == pytest.approx(hit.double().mean().item())
        assert row["ece"] == pytest.approx(calibration_metrics(lg, y)["ece"])
        low = (y == 0) | (y == 1)
        assert row["groups"]["low"] == pytest.approx(hit[low].double().mean().item())
        assert row["groups"]["three"] == pytest.approx(hit[y == 3].double().mean().item())
        assert row["groups"]["none"] is None
    with pytest.raises(ParamsError, match="ensemble_of names"):
        parts_report(model, params, loader, ensemble_of=["z"])


def test_the_average_merger_is_the_plain_mean():
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=6, hidden=[8], out_dim=4) for _ in range(3)]
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    result = average(spec, params)
    assert all(p.is_identity() for p in result.perms) and result.method == "average"
    for k in params[0]:
        assert torch.allclose(result.merged[k], sum(p[k] for p in params) / 3)
