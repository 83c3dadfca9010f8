"""Parameter-dict arithmetic: one rule for integer buffers, closed forms for everything."""

import itertools

import pytest
import torch

from lmckit import ParamsError
from lmckit.params import (
    average_params,
    check_finite,
    check_params_compatible,
    has_batchnorm,
    lerp_params,
    pairwise_inner_sum,
    params_distance,
    params_inner,
)
from tests.zoo import tiny_params


def flat(params):
    return torch.cat([t.reshape(-1) for t in params.values() if t.dtype.is_floating_point])


@pytest.mark.parametrize("lam", [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, -0.5, 1.5])
def test_lerp_is_the_closed_form_at_every_lambda(lam):
    a, b = tiny_params(1), tiny_params(2)
    a["bn.num_batches_tracked"], b["bn.num_batches_tracked"] = torch.tensor(3), torch.tensor(9)
    out = lerp_params(a, b, lam)
    for k in a:
        if a[k].dtype.is_floating_point:
            assert torch.allclose(out[k], (1 - lam) * a[k] + lam * b[k], atol=1e-12), k
    # integer buffers follow the larger weight: A for λ < ½ (and at ½), B above
    expected = 3 if 1 - lam >= lam else 9
    assert int(out["bn.num_batches_tracked"]) == expected


def test_lerp_is_exact_at_the_endpoints_and_for_identical_models():
    a, b = tiny_params(1, torch.float32), tiny_params(2, torch.float32)
    for k in a:
        assert torch.equal(lerp_params(a, b, 0.0)[k], a[k])
        assert torch.equal(lerp_params(a, b, 1.0)[k], b[k])
        assert torch.equal(lerp_params(a, a, 0.37)[k], a[k])


def test_lerp_keeps_gradients_and_never_aliases_integer_buffers():
    a, b = tiny_params(1), tiny_params(2)
    w = a["l0.weight"].clone().requires_grad_(True)
    out = lerp_params(dict(a, **{"l0.weight": w}), b, 0.25)
    out["l0.weight"].sum().backward()
    assert torch.allclose(w.grad, torch.full_like(w, 0.75))
    out["bn.num_batches_tracked"] += 1
    assert int(a["bn.num_batches_tracked"]) == 7


def test_average_is_the_weighted_sum_with_the_same_integer_rule():
    models = [tiny_params(s) for s in range(3)]
    for i, m in enumerate(models):
        m["bn.num_batches_tracked"] = torch.tensor(10 + i)
    weights = [0.2, 0.5, 0.3]
    out = average_params(models, weights)
    assert torch.allclose(flat(out), sum(w * flat(m) for w, m in zip(weights, models, strict=True)))
    assert int(out["bn.num_batches_tracked"]) == 11  # the largest weight
    uniform = average_params(models)
    assert torch.allclose(flat(uniform), sum(flat(m) for m in models) / 3)
    assert int(uniform["bn.num_batches_tracked"]) == 10  # ties: the first
    two = average_params(models[:2], [0.5, 0.5])
    assert torch.allclose(flat(two), flat(lerp_params(models[0], models[1], 0.5)))
    assert int(two["bn.num_batches_tracked"]) == int(
        lerp_params(models[0], models[1], 0.5)["bn.num_batches_tracked"]
    )
    with pytest.raises(ParamsError, match="2 weights for 3"):
        average_params(models, [0.5, 0.5])
    with pytest.raises(ParamsError, match="at least one"):
        average_params([])


def test_pairwise_inner_sum_equals_the_double_loop():
    models = [tiny_params(s) for s in range(4)]
    naive = sum(params_inner(x, y) for x, y in itertools.combinations(models, 2))
    assert float(pairwise_inner_sum(models)) == pytest.approx(naive, rel=1e-12)
    # differentiable: d/dθ_0 Σ_{i<j}<θ_i, θ_j> = Σ_{j≠0} θ_j
    w = models[0]["l1.weight"].clone().requires_grad_(True)
    pairwise_inner_sum([dict(models[0], **{"l1.weight": w}), *models[1:]]).backward()
    assert torch.allclose(w.grad, sum(m["l1.weight"] for m in models[1:]))


def test_has_batchnorm_and_check_finite():
    a = tiny_params()
    assert has_batchnorm(a)
    assert not has_batchnorm({k: v for k, v in a.items() if not k.startswith("bn.")})
    bad = dict(a, **{"l1.bias": torch.tensor([0.0, float("inf"), float("nan")])})
    with pytest.raises(ParamsError, match=r"model X: tensor 'l1.bias' has 2 NaN/infinite"):
        check_finite(bad, "model X")
    check_finite(a, "fine")


def test_distance_and_inner_product_are_consistent():
    a, b = tiny_params(1), tiny_params(2)
    d2 = params_distance(a, b) ** 2
    assert d2 == pytest.approx(params_inner(a, a) + params_inner(b, b) - 2 * params_inner(a, b))
    assert params_distance(a, a) == 0.0
    # integer buffers do not count
    c = dict(a, **{"bn.num_batches_tracked": torch.tensor(99)})
    assert params_distance(a, c) == 0.0


def test_check_params_compatible_names_the_problem():
    a = tiny_params()
    with pytest.raises(ParamsError, match="only in A"):
        check_params_compatible(a, {k: v for k, v in a.items() if k != "l0.bias"})
    with pytest.raises(ParamsError, match=r"'l0.bias' has shape \(4,\) in A but \(5,\) in B"):
        check_params_compatible(a, dict(a, **{"l0.bias": torch.zeros(5, dtype=torch.float64)}))
    with pytest.raises(ParamsError, match="dtype"):
        check_params_compatible(a, dict(a, **{"l0.bias": torch.zeros(4, dtype=torch.float32)}))
