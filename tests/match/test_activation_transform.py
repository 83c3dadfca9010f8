"""Activation matching over every symmetry kind (lmckit.match.activation_transform):
planted transforms of each kind recovered exactly from activations, least squares held to
a direct solve on the samples, primal and dual sites told apart, the refinement of
weight matching's result, and ``lmckit match --symmetries full``."""

from __future__ import annotations

import math

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.match.activation_transform import (
    _least_squares,
    _Moments,
    transform_activation_matching,
)
from lmckit.models import build_model, permutation_spec
from lmckit.tracing import GraphTaps, symmetry_kinds, trace
from lmckit.transform import Transform, fold_norms, head_matrix
from tests.tracing.test_kinds import randomized_norms, relu_gpt2_config

T = pytest.importorskip("transformers", reason="a dev dependency: pip install -e '.[dev]'")


def _zoo_gpt():
    torch.manual_seed(0)
    model = build_model("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32)
    model = randomized_norms(model.double().eval())
    data = [(torch.randint(0, 20, (64, 8)), None) for _ in range(3)]
    return model, permutation_spec(model), data


def _relu_gpt2():
    torch.manual_seed(0)
    model = randomized_norms(T.GPT2LMHeadModel(relu_gpt2_config()).double().eval())
    with torch.no_grad():  # tokens, not the random biases, dominate the stream, so that
        model.transformer.wte.weight.normal_()  # each hidden unit fires for some tokens and
        model.transformer.wpe.weight.normal_()  # not others (a unit that is dead or always
        for block in model.transformer.h:  # on has no ReLU to recover its scale across)
            block.mlp.c_fc.bias.zero_()
    data = [(torch.randint(0, 40, (64, 7)), None) for _ in range(3)]
    return model, trace(model, data[0][0][:4]), data


def _zoo_vit():
    torch.manual_seed(0)
    model = build_model("vit", image_size=28, patch_size=7, dim=16, depth=2, heads=4)
    model = randomized_norms(model.double().eval())
    data = [(torch.randn(64, 1, 28, 28, dtype=torch.float64), None) for _ in range(3)]
    return model, permutation_spec(model), data


def outputs(model, params, x):
    with torch.no_grad():
        out = torch.func.functional_call(model, params, (x,), tie_weights=False)
    return getattr(out, "logits", out)


@pytest.fixture(scope="module", params=["zoo-gpt", "gpt2-relu", "zoo-vit"])
def setting(request):
    model, spec, data = {"zoo-gpt": _zoo_gpt, "gpt2-relu": _relu_gpt2, "zoo-vit": _zoo_vit}[
        request.param
    ]()
    report = symmetry_kinds(model, data[0][0][:4], spec)
    params = fold_norms(report.spec, {k: v.detach() for k, v in model.state_dict().items()})
    return request.param, model, report.spec, data, params


def test_planted_transforms_of_every_kind_are_recovered(setting):
    name, model, spec, data, a = setting
    kinds = set(spec.kinds.values())
    assert "invertible" in kinds and ("scaling" in kinds) == (name == "gpt2-relu")
    scale = math.sqrt(sum(float((t.double() ** 2).sum()) for t in a.values()))
    for seed in range(2):
        planted = Transform.random(spec, seed)
        b = planted.apply(a)
        result = transform_activation_matching(spec, a, b, model=model, data=data, seed=seed)
        assert result.info["unused_sites"] == []
        assert result.distance_before / scale > 0.3
        assert result.distance_after / scale < 1e-8
        for g in spec.groups:
            error = (result.perm.matrix(g) - planted.inverse().matrix(g)).abs().max().item()
            assert error < 1e-8, (g, spec.kind(g), error)
        x = data[0][0]
        ref, out = outputs(model, a, x), outputs(model, result.perm.apply(b), x)
        assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-10


def test_queries_are_primal_and_keys_dual(setting):
    from lmckit.match.activation_transform import _site_sides

    _name, model, spec, data, a = setting
    reader = GraphTaps(model, spec, data[0][0][:4])
    sides = _site_sides(spec, reader, a, data[0][0][:8], 0)
    for qk, vo in spec.head_ties().values():  # (the query/key group comes first)
        found = [sides[s] for s in reader.taps()[qk]]
        assert sorted(found) == [False, True], (qk, found)  # a query site, a key site
        assert all(sides[s] for s in reader.taps()[vo])  # values, before and after softmax
    assert None not in sides.values()


def test_refinement_fits_the_invertible_blocks_and_keeps_the_rest(setting):
    """Weight matching's kind of result — the right heads, orthogonal maps — refined by
    least squares on the invertible and scaling groups gives back the planted transform."""
    _, model, spec, data, a = setting
    planted = Transform.random(spec, 3)
    b = planted.apply(a)
    truth = planted.inverse()
    refine = [g for g in spec.groups if spec.kind(g) in ("invertible", "scaling")]
    start = {}
    for g in refine:  # the heads and units right, the blocks and scales not
        if g in spec.heads:
            heads = spec.heads[g][1]
            d = spec.groups[g] // heads
            outer = truth.matrix(g).reshape(heads, d, heads, d).abs().sum((1, 3)).argmax(1)
            start[g] = head_matrix(outer, [torch.eye(d, dtype=torch.float64)] * heads)
        else:
            start[g] = truth.matrix(g).abs().argmax(1)
    init = truth.replace(**start)
    assert init.distance(a, b) > 1e-2
    result = transform_activation_matching(
        spec, a, b, model=model, data=data, init=init, refine=refine
    )
    assert result.method == "ls-refine"
    for g in spec.groups:
        assert (result.perm.matrix(g) - truth.matrix(g)).abs().max().item() < 1e-8, g
    # with the heads swapped in the start, refinement keeps them swapped (it does not LAP)
    g = next(g for g in refine if g in spec.heads)
    tie = [h for h in spec.groups if spec.heads.get(h, (None,))[0] == spec.heads[g][0]]
    swapped = {}
    for h in tie:
        heads = spec.heads[h][1]
        d = spec.groups[h] // heads
        outer = torch.arange(heads).roll(1)
        swapped[h] = (
            head_matrix(outer, [torch.eye(d, dtype=torch.float64)] * heads)
            if init.is_matrix(h)
            else (outer[:, None] * d + torch.arange(d)).reshape(-1)
        )
    result = transform_activation_matching(
        spec, a, b, model=model, data=data, init=init.replace(**swapped), refine=refine
    )
    assert result.distance_after > 1e-3


def test_least_squares_equals_a_direct_solve_on_the_samples():
    g = torch.Generator().manual_seed(0)
    za = torch.randn(500, 6, generator=g, dtype=torch.float64)
    zb = za @ torch.randn(6, 6, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        500, 6, generator=g, dtype=torch.float64
    )
    moments = _Moments(6)
    moments.add(za, zb)  # (samples, units): units on axis 1
    m = _least_squares(moments.ab, moments.aa, moments.bb, primal=True)
    direct = torch.linalg.lstsq(zb, za).solution.T  # min ‖za − zb Mᵀ‖
    assert torch.allclose(m, direct, atol=1e-10)
    m_dual = _least_squares(moments.ab, moments.aa, moments.bb, primal=False)
    direct_dual = torch.linalg.lstsq(za, zb).solution  # min ‖zb − za M‖ (M = (Mᵀ)ᵀ)
    assert torch.allclose(m_dual, direct_dual, atol=1e-10)


def test_bad_requests_are_refused():
    model, spec, data = _zoo_gpt()
    report = symmetry_kinds(model, data[0][0][:4], spec)
    a = fold_norms(report.spec, {k: v.detach() for k, v in model.state_dict().items()})
    with pytest.raises(ParamsError, match="refine names groups"):
        transform_activation_matching(report.spec, a, a, model=model, data=data, refine=["x"])
    with pytest.raises(ParamsError, match="needs"):
        transform_activation_matching(report.spec, a, a, model=model)
    with pytest.raises(ParamsError, match="n_batches"):
        transform_activation_matching(report.spec, a, a, model=model, data=data, n_batches=0)


@pytest.mark.parametrize("method", ["wm", "am"])
def test_the_command_line_fits_full_symmetries(tmp_path, capsys, digits, method):
    """``lmckit match --symmetries full`` on two ReLU MLPs: a transform file whose map is a
    symmetry (B's function unchanged) with positive scales that are not all 1, and that
    brings B's activations closer to A's than permutations alone."""
    from lmckit.checkpoint import load_checkpoint
    from lmckit.cli import main
    from lmckit.match import activation_matching
    from lmckit.workflows.matching import load_transform

    paths = []
    for seed in (0, 1):
        out = tmp_path / f"m{seed}"
        train = ["train", "--model", "mlp", "--dataset", "digits", "--hidden", "16", "-q"]
        assert main([*train, "--epochs", "2", "--seed", str(seed), "--out", str(out)]) == 0
        paths.append(next(out.glob("*.safetensors")))
    target = tmp_path / "t.json"
    args = ["match", *map(str, paths), "--method", method, "--symmetries", "full"]
    assert main([*args, "--out", str(target), "-q"]) == 0
    assert "scaling" in capsys.readouterr().out
    a, b = (load_checkpoint(p) for p in paths)
    transform = load_transform(target, a.spec)
    (group,) = transform.spec.groups
    assert transform.spec.kind(group) == "scaling"
    scales = transform.matrix(group).max(1).values
    assert bool((scales > 0).all()) and (scales - 1).abs().max() > 0.05
    x = digits.test_x
    moved = transform.apply(b.params)
    with torch.no_grad():
        ref = torch.func.functional_call(b.model, b.params, (x,))
        out = torch.func.functional_call(b.model, moved, (x,))
    assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-5
    # least squares on activations: B's hidden activations closer to A's than AM's permutation
    perm = activation_matching(a.spec, a.params, b.params, model=a.model, data=digits).perm

    def hidden(params):
        with torch.no_grad():
            return torch.relu(x.flatten(1) @ params["layers.0.weight"].T + params["layers.0.bias"])

    za = hidden(a.params)
    assert (za - hidden(moved)).norm() < (za - hidden(perm.apply(b.params))).norm()
    # rerun onto its own output: allowed (a transform file); orth on a model without one: no
    assert main([*args, "--out", str(target), "-q"]) == 0
    capsys.readouterr()
    assert main([*args[:-1], "orth", "--out", str(tmp_path / "u.json"), "-q"]) == 2
    assert "beyond permutations" in capsys.readouterr().err


def test_symmetry_matching_refuses_what_it_cannot_do():
    from lmckit.match import symmetry_matching
    from lmckit.perm import Permutation

    model, spec, data = _zoo_gpt()
    params = {k: v.detach() for k, v in model.state_dict().items()}
    x = data[0][0][:4]
    with pytest.raises(ParamsError, match="symmetries must be"):
        symmetry_matching(spec, params, params, model=model, data=data, symmetries="rot")
    with pytest.raises(ParamsError, match="start must be"):
        symmetry_matching(spec, params, params, model=model, data=data, start="sgd")
    with pytest.raises(ParamsError, match="needs data="):
        symmetry_matching(spec, params, params, model=model, example_inputs=x, start="am")
    with pytest.raises(ParamsError, match="needs data="):
        symmetry_matching(spec, params, params, model=model, example_inputs=x, symmetries="full")
    with pytest.raises(ParamsError, match="init"):
        symmetry_matching(
            spec, params, params, model=model, data=data, init=Permutation.identity(spec)
        )
    mlp = build_model("mlp", hidden=(8,))
    mlp_params = {k: v.detach() for k, v in mlp.state_dict().items()}
    with pytest.raises(ParamsError, match="beyond permutations"):
        symmetry_matching(
            permutation_spec(mlp), mlp_params, mlp_params, model=mlp,
            example_inputs=torch.randn(4, 1, 28, 28),
        )  # fmt: skip
    # weights only: an example batch is enough, and B = A aligns to itself
    result = symmetry_matching(spec, params, params, model=model, example_inputs=x)
    assert result.distance_after < 1e-9 and result.method == "wm-orth"


def test_the_fitted_maps_report_their_conditioning(setting):
    _, model, spec, data, a = setting
    planted = Transform.random(spec, 5)
    result = transform_activation_matching(spec, a, planted.apply(a), model=model, data=data)
    conditions = result.info["conditions"]
    assert set(conditions) == {g for g in spec.groups if spec.kind(g) == "invertible"}
    for g, value in conditions.items():  # the planted blocks' own conditioning, to rounding
        heads = spec.heads[g][1]
        d = spec.groups[g] // heads
        m = planted.inverse().matrix(g)
        blocks = [
            m[i * d : (i + 1) * d].reshape(d, heads, d)[:, int(j)]
            for i, j in enumerate(m.reshape(heads, d, heads, d).abs().sum((1, 3)).argmax(1))
        ]
        assert value == pytest.approx(max(float(torch.linalg.cond(b)) for b in blocks), rel=1e-6)


def test_symmetry_matching_caps_the_orthogonal_descent_at_max_iter():
    """``max_iter`` reaches the orthogonal descent: two sweeps from weight matching's
    permutation give exactly the descent's own two-sweep transform, which aligns less than
    six sweeps and more than none."""
    from lmckit.match import symmetry_matching, weight_matching
    from lmckit.match.orthogonal import orthogonal_weight_matching
    from lmckit.transform import orthogonal_subgroup

    model, spec, data = _zoo_gpt()
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    other = randomized_norms(
        build_model("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32)
        .double()
        .eval()
    )
    b = {k: v.detach().clone() for k, v in other.state_dict().items()}
    x = data[0][0][:4]
    capped = symmetry_matching(spec, a, b, model=model, example_inputs=x, max_iter=2)
    kinds = orthogonal_subgroup(symmetry_kinds(model, x, spec).spec)
    fa, fb = fold_norms(kinds, a), fold_norms(kinds, b)
    start = weight_matching(kinds, fa, fb, seed=0)
    direct = orthogonal_weight_matching(kinds, fa, fb, init=start.perm, max_iter=2)
    more = orthogonal_weight_matching(kinds, fa, fb, init=start.perm, max_iter=6)
    assert capped.iterations == 2 == direct.iterations < more.iterations
    assert capped.distance_after == pytest.approx(direct.distance_after, rel=1e-12)
    assert more.distance_after < capped.distance_after < start.distance_after
    with pytest.raises(ParamsError, match="max_iter"):
        symmetry_matching(spec, a, b, model=model, example_inputs=x, max_iter=0)
