"""Weight matching over orthogonal maps (lmckit.match.orthogonal) and the Transform it
returns: closed forms (Procrustes against sampled competitors), planted transforms
recovered to 1e-8 on a zoo GPT with trained-looking norms, and the permutation-only case
held to weight matching's reference."""

from __future__ import annotations

import math

import pytest
import torch

from lmckit.errors import PermutationError, SpecError
from lmckit.match import weight_matching, weight_matching_reference
from lmckit.match.orthogonal import orthogonal_weight_matching, procrustes
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation, PermutationSpec
from lmckit.tracing import symmetry_kinds
from lmckit.transform import (
    Transform,
    fold_norms,
    haar_orthogonal,
    mean_free_basis,
    orthogonal_subgroup,
)
from tests.tracing.test_kinds import randomized_norms


def test_procrustes_beats_every_sampled_orthogonal_matrix():
    g = torch.Generator().manual_seed(0)
    gains = torch.randn(6, 6, generator=g, dtype=torch.float64)
    best = procrustes(gains)
    value = (best * gains).sum().item()
    assert torch.allclose(best @ best.T, torch.eye(6, dtype=torch.float64), atol=1e-12)
    assert value == pytest.approx(torch.linalg.svdvals(gains).sum().item(), rel=1e-12)
    for _ in range(200):
        other = haar_orthogonal(6, g)
        assert (other * gains).sum().item() <= value + 1e-12


def _gpt(seed: int):
    torch.manual_seed(seed)
    model = build_model("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32)
    return randomized_norms(model.double().eval(), seed)


@pytest.fixture(scope="module")
def kinds():
    model = _gpt(0)
    x = torch.randint(0, 20, (3, 8))
    return model, x, symmetry_kinds(model, x, permutation_spec(model)).spec


def _folded(spec, model):
    return fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})


def test_a_planted_transform_is_recovered_to_1e_8(kinds):
    model, x, spec = kinds
    a = _folded(spec, model)
    for seed in range(3):  # (weight matching searches the orthogonal maps of each kind)
        planted = Transform.random(orthogonal_subgroup(spec), seed)
        b = planted.apply(a)
        result = orthogonal_weight_matching(spec, a, b, seed=seed)
        assert result.perm.spec == spec
        scale = math.sqrt(sum(float((t.double() ** 2).sum()) for t in a.values()))
        assert result.distance_after / scale < 1e-8, (seed, result.distance_after)
        for g in spec.groups:  # the maps themselves: the planted one's inverse
            want = planted.inverse().matrix(g)
            assert (result.perm.matrix(g) - want).abs().max().item() < 1e-8, g
        with torch.no_grad():
            ref = torch.func.functional_call(model, a, (x,))
            out = torch.func.functional_call(model, result.perm.apply(b), (x,))
        assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-10


def test_the_stream_map_of_a_layer_norm_model_fixes_the_ones_vector(kinds):
    model, _, spec = kinds
    a, b = _folded(spec, model), _folded(spec, _gpt(1))
    result = orthogonal_weight_matching(spec, a, b)
    stream = spec.axes["pos"][2]
    assert spec.kind(stream) == "orthogonal-mean-free"
    m = result.perm.matrix(stream)
    assert torch.allclose(m.sum(1), torch.ones(16, dtype=torch.float64), atol=1e-12)
    # and within that subgroup it is optimal: no sampled mean-free rotation of the stream
    # (others held) does better
    basis = mean_free_basis(16)
    aligned = result.perm.apply(b)
    best = result.perm.distance(a, b)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        inner = torch.eye(16, dtype=torch.float64)
        inner[1:, 1:] = haar_orthogonal(15, g)
        nudge = Transform.identity(spec).replace(**{stream: basis @ inner @ basis.T})
        assert nudge.distance(a, aligned) >= best - 1e-9


def test_orthogonal_maps_get_closer_than_permutations_and_never_lose_ground(kinds):
    model, _, spec = kinds
    a, b = _folded(spec, model), _folded(spec, _gpt(1))
    wm = weight_matching(spec, a, b)
    result = orthogonal_weight_matching(spec, a, b, init=wm.perm)
    assert result.distance_after < 0.9 * wm.distance_after
    assert all(y >= x - 1e-9 for x, y in zip(result.history, result.history[1:], strict=False))


def test_without_kinds_it_is_weight_matching():
    model_a, model_b = _gpt(0), _gpt(1)
    spec = permutation_spec(model_a)
    a = {k: v.detach() for k, v in model_a.state_dict().items()}
    b = {k: v.detach() for k, v in model_b.state_dict().items()}
    result = orthogonal_weight_matching(spec, a, b, seed=3)
    assert result.perm.is_permutation()
    reference = weight_matching_reference(spec, a, b, seed=3)
    perm = result.perm.to_permutation()
    assert perm.distance(a, b) == pytest.approx(reference.distance(a, b), rel=1e-9)


def test_unfolded_inputs_and_bad_maps_are_refused(kinds):
    model, _, spec = kinds
    raw = {k: v.detach() for k, v in model.state_dict().items()}
    with pytest.raises(PermutationError, match="not folded"):
        orthogonal_weight_matching(spec, raw, raw)
    stream = spec.axes["pos"][2]
    mlp = spec.axes["blocks.0.fc1.weight"][0]
    identity = Transform.identity(spec)
    with pytest.raises(PermutationError, match="permutation group"):
        identity.replace(**{mlp: torch.eye(32, dtype=torch.float64)})
    with pytest.raises(PermutationError, match="not orthogonal"):
        identity.replace(**{stream: 2 * torch.eye(16, dtype=torch.float64)})
    with pytest.raises(PermutationError, match="all-ones"):  # a rotation moving the mean
        identity.replace(**{stream: haar_orthogonal(16, torch.Generator().manual_seed(0))})
    qk = spec.axes["blocks.0.attn.q.weight"][0]
    with pytest.raises(PermutationError, match="different heads"):
        identity.replace(**{qk: haar_orthogonal(16, torch.Generator().manual_seed(0))})


def test_transform_algebra_and_json_round_trip(kinds):
    _, _, spec = kinds
    t, u = Transform.random(spec, 0), Transform.random(spec, 1)
    for g in spec.groups:
        assert torch.allclose(t.compose(u).matrix(g), t.matrix(g) @ u.matrix(g), atol=1e-12)
        assert torch.allclose(
            t.compose(t.inverse()).matrix(g), torch.eye(spec.groups[g], dtype=torch.float64),
            atol=1e-12,
        )  # fmt: skip
    again = Transform.from_dict(t.to_dict(), spec)
    assert all(torch.equal(again.matrix(g), t.matrix(g)) for g in spec.groups)
    perm = Permutation.random(spec, 0)
    assert Transform.from_permutation(perm).to_permutation() == perm


def test_spec_kinds_are_validated():
    base = {"groups": {"h": 4}, "axes": {"w": ("h", None), "g": ("h",)}}
    with pytest.raises(SpecError, match="a kind is one of"):
        PermutationSpec(**base, kinds={"h": "unitary"})
    with pytest.raises(SpecError, match="not declared"):
        PermutationSpec(**base, kinds={"x": "orthogonal"})
    with pytest.raises(SpecError, match="does not carry"):
        PermutationSpec(**base, kinds={"h": "orthogonal"}, folds={"g": (("w", 1),)})
    spec = PermutationSpec(**base, kinds={"h": "orthogonal"}, folds={"g": (("w", 0),)})
    assert spec.to_dict()["kinds"] == {"h": "orthogonal"}
    assert spec.restrict(["w"]).folds == {}


def test_the_command_line_writes_a_transform_that_aligns_b(tmp_path, capsys):
    import json

    from lmckit.checkpoint import save_checkpoint
    from lmckit.cli import main

    models = [_gpt(0).float(), _gpt(1).float()]
    paths = [save_checkpoint(tmp_path / f"m{i}", m) for i, m in enumerate(models)]
    out = tmp_path / "t.json"
    args = ["match", *map(str, paths), "--symmetries", "orth", "--out", str(out), "-q"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "orthogonal-mean-free" in printed and "wm-orth" in printed
    data = json.loads(out.read_text())
    assert data["format"] == "lmckit-transform" and data["kinds"]
    from lmckit.workflows.matching import load_transform

    transform = load_transform(out, permutation_spec(models[0]))
    spec = transform.spec
    assert "invertible" not in spec.kinds.values()  # orth: the orthogonal maps of each kind
    a, b = (_folded(spec, m) for m in models)
    assert transform.distance(a, b) == pytest.approx(data["distance_after"], rel=1e-5)
    assert [s["method"] for s in data["stages"]] == ["weight_matching[warm]", "wm-orth"]
    wm_distance = data["stages"][0]["distance"]
    assert data["distance_after"] < wm_distance < data["distance_before"]
    # not for the permutation readers, and not with other matchers
    from lmckit.workflows.matching import load_permutation

    with pytest.raises(PermutationError, match="orthogonal maps"):
        load_permutation(out, permutation_spec(models[0]))
    assert main([*args[:-3], "--method", "sinkhorn", "--out", str(tmp_path / "u.json")]) == 2
    assert "weight matching" in capsys.readouterr().err
    # a budget: refused up front where the descent's copies exceed it, for wm-orth; the
    # methods that hold activations or gradients do not take it
    assert main([*args, "--max-memory", "1K"]) == 2
    assert "allowed by max_memory" in capsys.readouterr().err
    ste = ["--method", "ste", "--max-memory", "1G"]
    assert main([*args[:-1], *ste, "--dataset", "synthetic", "-q"]) == 2
    assert "--max-memory does not apply here" in capsys.readouterr().err
    assert main([*args, "--max-memory", "1G"]) == 0


def test_in_float32_the_descent_stops_where_its_gains_reach_rounding(kinds):
    """In float32 the maps never settle to the 1e-12 step test (rounding of the moved
    weights), so the descent ran to max_iter; the default gain_tol (float32's eps) ends it
    where two sweeps in a row gain less than that, at an objective within a few rounding
    steps of the capped run's. In float64 the default is off: the same run as gain_tol=0."""
    model, _, spec64 = kinds
    a64, b64 = _folded(spec64, model), _folded(spec64, _gpt(1))
    a = {k: v.float() for k, v in a64.items()}
    b = {k: v.float() for k, v in b64.items()}
    init = weight_matching(spec64, a, b).perm
    capped = orthogonal_weight_matching(spec64, a, b, init=init, max_iter=300, gain_tol=0)
    assert capped.iterations == 300 and capped.info["stopped"] == "max_iter"
    early = orthogonal_weight_matching(spec64, a, b, init=init, max_iter=300)
    eps = torch.finfo(torch.float32).eps
    assert early.info == {**early.info, "stopped": "gain_tol", "gain_tol": eps}
    assert early.iterations < 300
    tail = early.history[-3:]
    assert tail[1] - tail[0] <= eps * abs(tail[1]) and tail[2] - tail[1] <= eps * abs(tail[2])
    best = max(capped.history)
    assert early.history[-1] >= best - 1e-5 * abs(best)
    wm64 = weight_matching(spec64, a64, b64).perm
    default = orthogonal_weight_matching(spec64, a64, b64, init=wm64, max_iter=40)
    off = orthogonal_weight_matching(spec64, a64, b64, init=wm64, max_iter=40, gain_tol=0)
    assert default.info["gain_tol"] == 0 and default.history == off.history
    with pytest.raises(PermutationError, match="gain_tol must be a non-negative"):
        orthogonal_weight_matching(spec64, a64, b64, gain_tol=-1.0)


def test_the_kinds_check_in_float32_finds_what_float64_finds_and_leaves_the_model_alone():
    """A float32 model checked in float32 (the model itself runs the check: no twin) finds
    the same kinds, folds, biases and duals as its float64 twin's check; a budget too
    small for the float64 copies picks float32 without being asked."""
    from lmckit.tracing.kinds import kinds_check_bytes, kinds_check_precision

    model = _gpt(0)
    x = torch.randint(0, 20, (3, 8))
    spec = permutation_spec(model)
    want = symmetry_kinds(model, x, spec)
    assert want.precision == "float64"
    model32 = model.float().train()
    before = {k: v.clone() for k, v in model32.state_dict().items()}
    found = symmetry_kinds(model32, x, spec, precision="float32")
    assert found.precision == "float32" and found.spec == want.spec
    # a refusal in float32 says rounding may be why; in float64 it does not
    from lmckit.tracing.kinds import FLOAT32_CAVEAT

    assert found.reasons and set(found.reasons) == set(want.reasons)
    assert all(found.reasons[g] == want.reasons[g] + FLOAT32_CAVEAT for g in want.reasons)
    assert model32.training  # its mode restored, its weights untouched
    assert all(torch.equal(v, model32.state_dict()[k]) for k, v in before.items())
    state = model32.state_dict()
    floats = sum(t.numel() for t in state.values() if t.is_floating_point())
    assert kinds_check_bytes(state, "float64") == 24 * floats
    assert kinds_check_bytes(state, "float32") == 8 * floats  # no twin of a float32 model
    model_bytes = 4 * floats
    assert kinds_check_precision(state, model_bytes + 24 * floats) == "float64"
    assert kinds_check_precision(state, model_bytes + 24 * floats - 1) == "float32"
    budget = symmetry_kinds(model32, x, spec, max_memory=model_bytes + 24 * floats - 1)
    assert budget.precision == "float32" and budget.spec == want.spec
    with pytest.raises(SpecError, match="precision must be"):
        symmetry_kinds(model32, x, spec, precision="float16")
    with pytest.raises(SpecError, match="max_memory must be"):
        symmetry_kinds(model32, x, spec, max_memory=0)
    with pytest.raises(SpecError, match="max_memory must be"):
        kinds_check_precision(state, max_memory=0.5)
    with pytest.raises(SpecError, match="precision must be"):
        kinds_check_bytes(state, "float16")


def test_wm_orth_within_a_budget_is_the_same_match_and_a_budget_too_small_is_refused():
    from lmckit.budget import ResourceError
    from lmckit.errors import ParamsError
    from lmckit.match import symmetry_matching
    from lmckit.match.symmetries import descent_bytes

    models = [_gpt(0).float(), _gpt(1).float()]
    a, b = ({k: v.detach() for k, v in m.state_dict().items()} for m in models)
    x = torch.randint(0, 20, (3, 8))
    spec = permutation_spec(models[0])
    free = symmetry_matching(spec, a, b, model=models[0], example_inputs=x)
    kinds = symmetry_kinds(models[0], x, spec).spec
    need = descent_bytes(kinds, a, b)
    floats = sum(t.numel() for t in a.values() if t.is_floating_point())
    # the models and B's moved copy in full; the readers of the folded gains, each model's
    assert need["models"] == need["moved"] * 2 == 8 * floats
    readers = {k for r in kinds.folds.values() for k, _ in r} | set(kinds.folds)
    readers |= set(kinds.norm_biases.values())
    assert need["folded"] == 2 * sum(4 * a[k].numel() for k in readers) > 0
    fits = sum(need.values()) + 4 * floats  # room for the descent, not the float64 check
    bounded = symmetry_matching(spec, a, b, model=models[0], example_inputs=x, max_memory=fits)
    assert free.info["kinds_precision"] == "float64"
    assert bounded.info["kinds_precision"] == "float32"
    assert bounded.distance_after == pytest.approx(free.distance_after, rel=1e-6)
    with pytest.raises(ResourceError, match="folded readers"):
        symmetry_matching(
            spec, a, b, model=models[0], example_inputs=x, max_memory=sum(need.values()) - 1
        )
    # a budget below the models and B's moved copy is refused before the kinds check runs
    import lmckit.tracing as tracing

    def no_check(*args, **kwargs):
        raise AssertionError("the kinds check ran")

    small = need["models"] + need["moved"] - 1
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracing, "symmetry_kinds", no_check)
        with pytest.raises(ResourceError, match="B moved"):
            symmetry_matching(spec, a, b, model=models[0], example_inputs=x, max_memory=small)
    with pytest.raises(ParamsError, match="max_memory bounds start='wm' only"):
        symmetry_matching(spec, a, b, model=models[0], data=[(x, x)], start="am", max_memory=fits)
