"""Git Re-Basin's counterexample and the exhaustive permutation search."""

import math

import numpy as np
import pytest
import torch

from lmckit.analysis.counterexample import (
    counterexample_data,
    counterexample_error,
    counterexample_networks,
    exhaustive_barriers,
)
from lmckit.data import TensorLoader
from lmckit.errors import ParamsError
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation


def relu(v):
    return np.maximum(v, 0)


def f_a(x):  # eq. 4, written from the paper
    h = relu(np.array([[-1, 0], [0, -1]]) @ x.T + np.array([[1], [0]]))
    return (np.array([[-1, -1]]) @ relu(np.array([[-1, 0], [0, 1]]) @ h + np.array([[1], [0]])))[0]


def f_b(x):  # eq. 5
    h = relu(np.array([[1, 0], [0, 1]]) @ x.T + np.array([[0], [1]]))
    return (np.array([[-1, -1]]) @ relu(np.array([[1, 0], [0, -1]]) @ h + np.array([[0], [1]])))[0]


def test_both_networks_are_the_papers_and_fit_the_data_perfectly():
    model, a, b, _ = counterexample_networks()
    x, y = counterexample_data(2000, seed=1)
    assert 0.2 < float(y.float().mean()) < 0.3  # a quarter of the square is positive
    for params, reference in ((a, f_a), (b, f_b)):
        out = torch.func.functional_call(model, params, (x,)).reshape(-1)
        np.testing.assert_allclose(out.numpy(), reference(x.double().numpy()), atol=1e-6)
        assert float(counterexample_error(out[:, None], y)) == 0.0


def test_no_permutation_connects_the_two_networks_linearly():
    model, a, b, spec = counterexample_networks()
    x, y = counterexample_data(4000, seed=0)
    result = exhaustive_barriers(
        model,
        a,
        b,
        TensorLoader(x, y, batch_size=1000),
        spec,
        metric=counterexample_error,
        lambdas=21,
    )
    assert len(result.permutations) == 4 == len({str(p.to_dict()) for p in result.permutations})
    for values in result.values:
        assert values[0] == 0.0 and values[-1] == 0.0  # both ends fit perfectly
    assert min(result.barriers) > 0.05  # every one of the four paths leaves the data
    # the midpoint of the unpermuted path, evaluated here independently
    mid = torch.func.functional_call(model, {k: (a[k] + b[k]) / 2 for k in a}, (x,)).reshape(-1)
    expected = float(((mid >= 0).long() != y).float().mean())
    assert result.values[0][10] == pytest.approx(expected)


def test_exhaustive_search_finds_a_planted_permutation():
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=3, hidden=[3, 3], out_dim=2)
    spec = permutation_spec(model)
    a = model.state_dict()
    planted = Permutation(
        spec, {"hidden0": torch.tensor([2, 0, 1]), "hidden1": torch.tensor([1, 2, 0])}
    )
    b = planted.apply(a)
    x = torch.randn(64, 3)
    with torch.no_grad():
        target = model(x)  # every permutation of B computes A's function: both ends are 0

    def distance(outputs, targets):
        return ((outputs - targets) ** 2).mean()

    result = exhaustive_barriers(model, a, b, [(x, target)], spec, metric=distance, lambdas=5)
    assert len(result.permutations) == 36
    assert result.permutations[result.best] == planted.inverse()
    assert result.barriers[result.best] == pytest.approx(0.0, abs=1e-6)
    assert sorted(result.barriers)[1] > 1e-4  # the other 35 do not undo it


def test_refuses_more_permutations_than_the_limit():
    model = build_model("mlp", in_dim=3, hidden=[8, 8], out_dim=2)
    spec = permutation_spec(model)
    a = model.state_dict()
    with pytest.raises(ParamsError, match=r"1\.63e\+09 permutations .*max_permutations=10000"):
        exhaustive_barriers(model, a, a, [], spec)
    assert math.factorial(8) ** 2 == 1625702400
