"""The midpoint loss over the continuous maps (lmckit.match.transform_ste): every iterate
is a symmetry of B (its function unchanged to float64 rounding), the gradient through the
parameterisation equals finite differences, the loss goes down, and the heads weight
matching paired stay paired."""

from __future__ import annotations

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.match import symmetry_matching
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.match.transform_ste import (
    _free_parameters,
    _maps,
    _moved,
    transform_ste_matching,
)
from lmckit.models import build_model, permutation_spec
from lmckit.tracing import symmetry_kinds
from lmckit.transform import fold_norms, head_blocks
from tests.tracing.test_kinds import randomized_norms


def _gpt(seed):
    torch.manual_seed(seed)
    model = build_model("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32)
    return randomized_norms(model.double().eval(), seed)


@pytest.fixture(scope="module")
def pair():
    model, other = _gpt(0), _gpt(1)
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randint(0, 20, (32, 8), generator=g), torch.randint(0, 20, (32, 8), generator=g))
        for _ in range(3)
    ]
    spec = symmetry_kinds(model, data[0][0][:4], permutation_spec(model)).spec
    a = fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})
    b = fold_norms(spec, {k: v.detach() for k, v in other.state_dict().items()})
    return model, spec, a, b, data


def _midpoint_loss(model, a, moved, x, y):
    mid = {k: (a[k] + moved[k]) / 2 for k in a}
    logits = torch.func.functional_call(model, mid, (x,))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def test_the_gradient_through_the_maps_equals_finite_differences(pair):
    model, spec, a, b, data = pair
    start = orthogonal_weight_matching(spec, a, b).perm
    free = _free_parameters(spec)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for k in free.values():
            k.copy_(0.05 * torch.randn(k.shape, generator=g, dtype=torch.float64))
    x, y = data[0]
    loss = _midpoint_loss(model, a, _moved(spec, _maps(spec, start, free), b, a), x, y)
    grads = torch.autograd.grad(loss, list(free.values()))
    direction = [torch.randn(k.shape, generator=g, dtype=torch.float64) for k in free.values()]
    analytic = sum(float((gr * d).sum()) for gr, d in zip(grads, direction, strict=True))
    eps = 1e-6
    values = []
    for sign in (1, -1):
        shifted = {
            name: (k + sign * eps * d).detach()
            for (name, k), d in zip(free.items(), direction, strict=True)
        }
        moved = _moved(spec, _maps(spec, start, shifted), b, a)
        values.append(float(_midpoint_loss(model, a, moved, x, y)))
    numeric = (values[0] - values[1]) / (2 * eps)
    assert abs(analytic - numeric) < 1e-6 * max(1.0, abs(numeric)), (analytic, numeric)


@pytest.mark.parametrize("symmetries", ["orth", "full"])
def test_every_result_is_a_symmetry_of_b_and_the_loss_goes_down(pair, symmetries):
    model, spec, a, b, data = pair
    params = [{k: v.detach() for k, v in m.state_dict().items()} for m in (model, _gpt(1))]
    result = symmetry_matching(
        permutation_spec(model), *params, model=model, data=data, start="ste",
        symmetries=symmetries, epochs=15, lr=1e-2,
    )  # fmt: skip
    assert [s["method"] for s in result.info["stages"]][-1] == "ste-transform"
    assert len(result.info["stages"]) == 3  # WM, its orthogonal maps, the descent
    assert result.iterations == 15 * len(data)  # one step per batch per epoch
    x = data[0][0]
    moved = result.perm.apply(b)
    with torch.no_grad():
        ref = torch.func.functional_call(model, b, (x,))
        out = torch.func.functional_call(model, moved, (x,))
    assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-10
    # the midpoint loss on the data is lower than at weight matching's orthogonal maps
    orth = orthogonal_weight_matching(spec, a, b).perm
    before = sum(float(_midpoint_loss(model, a, orth.apply(b), *batch)) for batch in data)
    after = sum(float(_midpoint_loss(model, a, moved, *batch)) for batch in data)
    assert after < before - 0.05, (before, after)
    kinds = {result.perm.spec.kind(g) for g in result.perm.spec.groups}
    assert ("invertible" in kinds) == (symmetries == "full")


def test_the_heads_keep_their_pairing(pair):
    model, spec, a, b, data = pair
    start = orthogonal_weight_matching(spec, a, b).perm
    result = transform_ste_matching(spec, a, b, model=model, data=data, init=start, epochs=5)
    for g in spec.heads:
        heads = spec.heads[g][1]
        before, after = (
            head_blocks(start.matrix(g), heads),
            head_blocks(result.perm.matrix(g), heads),
        )
        assert after is not None and torch.equal(before[0], after[0])


def test_bad_requests_are_refused(pair):
    model, spec, a, b, data = pair
    from dataclasses import replace

    with pytest.raises(ParamsError, match="no orthogonal or invertible group"):
        transform_ste_matching(replace(spec, kinds={}), a, b, model=model, data=data)
    with pytest.raises(ParamsError, match="n_batches"):
        transform_ste_matching(spec, a, b, model=model, data=data, n_batches=0)
    with pytest.raises(ParamsError, match="labelled batches"):
        transform_ste_matching(spec, a, b, model=model, data=[(x, None) for x, _ in data])


def test_the_first_loss_is_the_loss_at_the_midpoint_of_a_and_the_moved_b(pair):
    """The derivation checked at its start, against the transform's own application (which
    moves readers of invertible groups by ``M⁻ᵀ``): with ``M₀`` a random element of the
    whole group, invertible head maps included, the first step's loss is the loss at
    ``½(θ_A + M₀ θ_B)`` — a dual side moved by ``M⁻¹`` or a midpoint without the ½ is
    another number."""
    from lmckit.transform import Transform

    model, spec, a, b, data = pair
    assert "invertible" in {spec.kind(g) for g in spec.groups}
    start = Transform.random(spec, 3)
    x, y = data[0]
    moved = start.apply(b)
    with torch.no_grad():  # M₀ is a symmetry of B, so the check below is of the midpoint
        ref = torch.func.functional_call(model, b, (x,))
        out = torch.func.functional_call(model, moved, (x,))
    assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-10
    expected = float(_midpoint_loss(model, a, moved, x, y))
    result = transform_ste_matching(
        spec, a, b, model=model, data=[(x, y)], init=start, epochs=1, lr=1e-9
    )
    assert result.history[0] == pytest.approx(expected, rel=1e-10, abs=1e-12)
    # and the naive midpoint of A and the unmoved B is not that number
    assert abs(float(_midpoint_loss(model, a, b, x, y)) - expected) > 1e-3
