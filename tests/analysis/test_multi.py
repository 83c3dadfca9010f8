"""Multi-model metrics of merged models and the plane landscape through three of them."""

import math

import pytest

from lmckit.analysis import multi_model_metrics
from lmckit.errors import ParamsError
from lmckit.merge import merge_many
from lmckit.metrics import evaluate
from lmckit.models import permutation_spec
from lmckit.params import average_params, params_distance


def test_multi_model_metrics_are_their_definitions(three, digits):
    model, params = three
    spec = permutation_spec(model)
    result = merge_many(spec, params)
    test = digits.loader("test", batch_size=360)
    metrics = multi_model_metrics(model, params, result.perms, test)
    aligned = [p.apply(x) for p, x in zip(result.perms, params, strict=True)]
    losses = [evaluate(model, p, test).loss for p in params]
    assert metrics.n == 3 and len(metrics.distance_ratios) == 3 and len(metrics.triplet_angles) == 3
    assert sum(metrics.triplet_angles) == pytest.approx(180.0)
    pairs = ((0, 1), (0, 2), (1, 2))  # combinations order, each pair's distance directly
    expected = [params_distance(aligned[i], aligned[j]) for i, j in pairs]
    assert metrics.pair_distances == pytest.approx(expected, rel=1e-9)
    assert metrics.mean_loss == pytest.approx(sum(losses) / 3)
    assert metrics.merged_loss == pytest.approx(evaluate(model, average_params(aligned), test).loss)
    assert metrics.loss_gap == pytest.approx(metrics.merged_loss - metrics.mean_loss)
    assert math.isfinite(metrics.pairwise_gap)
    with pytest.raises(ParamsError, match=r"one permutation per model \(3\), got 2"):
        multi_model_metrics(model, params, result.perms[:2], test)
