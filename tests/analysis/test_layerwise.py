"""Layerwise diagnostics (the width study) on constructed cases whose answers are known, and
against a naive implementation that keeps every activation in memory."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmckit.analysis.flatness import flatness, random_direction
from lmckit.analysis.layerwise import (
    GAUSSIAN_ADDITIVITY_LIMIT,
    Layer,
    gaussian_weak_additivity,
    layerwise,
    model_layers,
)
from lmckit.analysis.random_permutations import random_permutation_merges
from lmckit.data import TensorLoader, holdout_split
from lmckit.errors import DataError, ParamsError
from lmckit.evaluate.bn import bn_reset
from lmckit.evaluate.calibration import fit_temperature
from lmckit.metrics import evaluate
from lmckit.models import build_model
from lmckit.params import lerp_params
from lmckit.perm import Permutation
from tests.zoo import nontrivial


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mlp(seed, bias=True, hidden=(12, 12), **kw):
    torch.manual_seed(seed)
    return build_model("mlp", in_dim=10, hidden=list(hidden), out_dim=4, bias=bias, **kw)


def _loader(n=64, d=10, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorLoader(x, y, batch_size=batch)


def _disjoint_pair(bias=False):
    """Two bias-free ReLU MLPs whose hidden units live on disjoint halves: A writes and reads
    units 0..5 of every hidden layer, B units 6..11. Pre-activations never overlap (weak
    additivity holds exactly) and W_A z_B = 0 (reciprocal orthogonality), so Thm. 5.3 gives
    LEWC exactly, at every λ."""
    model = _mlp(0, bias=bias).double()
    a, b = _state(model), _state(_mlp(1, bias=bias).double())
    half = 6
    for i in range(3):
        w_a, w_b = a[f"layers.{i}.weight"], b[f"layers.{i}.weight"]
        if i < 2:  # rows: units written
            w_a[half:] = 0
            w_b[:half] = 0
        if i > 0:  # columns: units read
            w_a[:, half:] = 0
            w_b[:, :half] = 0
    return model, a, b


@pytest.mark.parametrize("lam", [0.1, 0.5, 0.8])
def test_lewc_is_exact_for_networks_on_orthogonal_subspaces(lam):
    model, a, b = _disjoint_pair()
    r = layerwise(model, a, b, _loader(), lam=lam)
    for row in r.layers:
        assert row["lewc"] == pytest.approx(1.0, abs=1e-12), row["name"]
        if row["name"] != "logits":
            assert row["weak_additivity"] == pytest.approx(1.0, abs=1e-12)
        if row["depth"] > 1:
            assert row["reciprocal_ab"] == pytest.approx(0.0, abs=1e-12)
            assert row["reciprocal_ba"] == pytest.approx(0.0, abs=1e-12)
            assert row["merged_cosine"] == pytest.approx(1.0, abs=1e-12)
    # LEWC's norm prediction holds exactly too: E‖f_C‖ / E‖f_A + f_B‖ as predicted.
    assert r.column("norm_ratio") == pytest.approx(r.column("lewc_norm_ratio"), rel=1e-12)
    if lam != 0.5:  # the linear (LLFC) mixture is not what the merged net computes
        assert r.layers[1]["llfc"] < 1 - 1e-6


def test_lewc_of_bias_free_linear_networks_is_exact_only_when_orthogonal():
    """Linear networks, layers given by the user: with A and B on orthogonal subspaces the
    merged net is exactly the λ^ℓ mixture; two generic linear nets have cross terms."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(6, 8, bias=False), nn.Linear(8, 8, bias=False), nn.Linear(8, 3, bias=False)
    ).double()
    layers = [Layer(f"l{i}", i + 1, post=str(i) if i < 2 else "", linear=str(i)) for i in range(3)]
    a = {k: torch.randn_like(v) for k, v in net.state_dict().items()}
    b = {k: torch.randn_like(v) for k, v in net.state_dict().items()}
    loader = _loader(d=6)
    generic = layerwise(net, a, b, loader, lam=0.3, layers=layers)
    assert generic.layers[0]["lewc"] == pytest.approx(1.0, abs=1e-12)  # one layer: linear
    assert generic.layers[1]["lewc"] < 0.999
    for i, w in enumerate(("0.weight", "1.weight")):  # A: units 0..3, B: units 4..7
        a[w][4:] = 0
        b[w][:4] = 0
        if i == 1:
            a[w][:, 4:] = 0
            b[w][:, :4] = 0
    a["2.weight"][:, 4:] = 0
    b["2.weight"][:, :4] = 0
    orth = layerwise(net, a, b, loader, lam=0.3, layers=layers)
    assert orth.column("lewc") == pytest.approx([1.0] * 3, abs=1e-12)


def test_weak_additivity_is_one_when_pre_activations_share_signs():
    """B = A with layer i's weight × c and bias × c^i: every pre-activation of B is c^i times
    A's, so the signs agree and σ is additive on the pair."""
    model = _mlp(0).double()
    a = _state(model)
    b = dict(a)
    c = 1.7
    for i in range(3):
        b[f"layers.{i}.weight"] = a[f"layers.{i}.weight"] * c
        b[f"layers.{i}.bias"] = a[f"layers.{i}.bias"] * c ** (i + 1)
    r = layerwise(model, a, b, _loader(), lam=0.3)
    for row in r.layers[:-1]:
        assert row["weak_additivity"] == pytest.approx(1.0, abs=1e-12)
        assert row["activation_cosine"] == pytest.approx(1.0, abs=1e-12)
        assert row["non_overlap"] == 0.0
    other = layerwise(model, a, _state(_mlp(5).double()), _loader(), lam=0.3)
    assert other.layers[0]["weak_additivity"] < 0.99


def test_identical_models_commute_and_equal_their_merge():
    model = _mlp(0).double()
    a = _state(model)
    r = layerwise(model, a, dict(a), _loader(), lam=0.4)
    for row in r.layers:
        assert row["commutativity"] == pytest.approx(0.0, abs=1e-12)
        assert row["llfc"] == pytest.approx(1.0, abs=1e-12)
        assert row["reciprocal_ab"] == pytest.approx(1.0, rel=1e-12)


# ---- against a naive implementation: every activation in memory, plain formulas ----


def _all_activations(model, params, loader, layers):
    modules = dict(model.named_modules())
    store = {}

    def hook(key, keep_input=False):
        def f(_m, inputs, output):
            store.setdefault(key, []).append(output.detach())
            if keep_input:
                store.setdefault(("in", key[1]), []).append(inputs[0].detach())

        return f

    handles = []
    for lay in layers:
        if lay.post:
            handles.append(modules[lay.post].register_forward_hook(hook(("post", lay.post))))
        if lay.pre:
            handles.append(modules[lay.pre].register_forward_hook(hook(("pre", lay.pre))))
        if lay.linear:
            handles.append(
                modules[lay.linear].register_forward_hook(hook(("out", lay.linear), True))
            )
    outs = []
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            outs.append(torch.func.functional_call(model, params, (x,)))
    for h in handles:
        h.remove()
    store = {k: torch.cat(v) for k, v in store.items()}
    store[("post", "")] = torch.cat(outs)
    return store


def _vectors(t):
    t = t.double()
    if t.ndim == 4:  # every position a sample, channels the units
        return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])
    return t


def _naive_cos(x, y):
    out = []
    for u, v in zip(x, y, strict=True):
        nu, nv = math.sqrt(float(u @ u)), math.sqrt(float(v @ v))
        out.append(1.0 if nu == nv == 0 else (0.0 if nu * nv == 0 else float(u @ v) / (nu * nv)))
    return sum(out) / len(out)


def _naive_wz(module, weight, z):
    if isinstance(module, nn.Linear):
        return z @ weight.T
    return F.conv2d(z, weight, None, module.stride, module.padding)


def _naive(model, a, b, c, loader, lam, small):
    layers = model_layers(model)
    acts = [_all_activations(model, p, loader, layers) for p in (a, b, c)]
    modules = dict(model.named_modules())
    rows = []
    for lay in layers:
        row = {}
        if lay.post is not None:
            fa, fb, fc = (_vectors(s[("post", lay.post)]) for s in acts)
            d = lay.depth
            row["lewc"] = _naive_cos(fc, (1 - lam) ** d * fa + lam**d * fb)
            row["activation_cosine"] = _naive_cos(fa, fb)
            norm = lambda t: float(t.norm(dim=1).mean())  # noqa: E731
            row["norm_ratio"] = norm(fc) / norm(fa + fb)
        if lay.pre is not None:
            za, zb = (_vectors(s[("pre", lay.pre)]) for s in acts[:2])
            row["weak_additivity"] = _naive_cos(
                F.relu((1 - lam) * za + lam * zb), (1 - lam) * F.relu(za) + lam * F.relu(zb)
            )
            moment_a, moment_b = (z.pow(2).mean(0) for z in (za, zb))  # E z̃², per unit
            rms_a = moment_a.sqrt()
            # Fig. 6: "second moment smaller than one hundredth of the maximum second moment"
            big_a = set(torch.nonzero(moment_a >= small * moment_a.max()).flatten().tolist())
            big_b = set(torch.nonzero(moment_b >= small * moment_b.max()).flatten().tolist())
            row["small_fraction_a"] = 1 - len(big_a) / len(rms_a)
            row["non_overlap"] = 1 - len(big_a & big_b) / len(big_a | big_b)
            row["rms_a"] = rms_a
        if lay.linear is not None:
            m = modules[lay.linear]
            wa, wb = a[f"{lay.linear}.weight"], b[f"{lay.linear}.weight"]
            za, zb, zc = (s[("in", lay.linear)].double() for s in acts)
            wa_za, wb_zb = _naive_wz(m, wa, za), _naive_wz(m, wb, zb)
            wa_zb, wb_za, wa_zc = _naive_wz(m, wa, zb), _naive_wz(m, wb, za), _naive_wz(m, wa, zc)
            norm = lambda t: float(_vectors(t).norm(dim=1).mean())  # noqa: E731
            row["reciprocal_ab"] = norm(wa_zb) / norm(wa_za)
            row["reciprocal_ba"] = norm(wb_za) / norm(wb_zb)
            row["merged_cosine"] = _naive_cos(_vectors(wa_zc), _vectors(wa_za))
            x, y = (wa_za + wb_zb).flatten(), (wa_zb + wb_za).flatten()
            row["commutativity"] = float((x - y) @ (x - y)) / float(x.norm() * y.norm())
        rows.append(row)
    return rows


@pytest.mark.parametrize("arch", ["mlp", "vgg"])
def test_layerwise_equals_the_naive_all_in_memory_version(arch):
    lam, small = 0.35, 0.3
    if arch == "mlp":
        model = _mlp(0).double()
        a, b = _state(model), _state(_mlp(1).double())
        loader = _loader()
        c = lerp_params(a, b, lam)
        r = layerwise(model, a, b, loader, lam=lam, small=small)
    else:
        torch.manual_seed(0)
        model = nontrivial(build_model("vgg", width_multiplier=0.125, in_channels=1)).double()
        a = _state(model)
        torch.manual_seed(1)
        b = _state(nontrivial(build_model("vgg", width_multiplier=0.125, in_channels=1), 2))
        b = {k: v.double() if v.is_floating_point() else v for k, v in b.items()}
        x = torch.randn(12, 1, 32, 32, dtype=torch.float64)
        loader = TensorLoader(x, torch.zeros(12, dtype=torch.long), batch_size=5)
        c = bn_reset(model, lerp_params(a, b, lam), loader)
        r = layerwise(model, a, b, loader, lam=lam, small=small, bn_reset_data=loader)
    expected = _naive(model, a, b, c, loader, lam, small)
    assert len(r.layers) == len(expected)
    for row, exp in zip(r.layers, expected, strict=True):
        for key, value in exp.items():
            if key == "rms_a":
                assert r.moments[row["name"]]["a"] == pytest.approx(value.tolist(), rel=1e-9)
            else:
                assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["name"], key)


def test_float32_batches_agree_with_float64():
    """Batches are reduced in the models' dtype and only running sums are float64: a float32
    pair must give the float64 pair's metrics to float32 accuracy, over many large batches."""
    model = _mlp(0).double()
    a, b = _state(model), _state(_mlp(1).double())
    x = torch.randn(4000, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.zeros(4000, dtype=torch.long)
    r64 = layerwise(model, a, b, TensorLoader(x, y, batch_size=1000), lam=0.3)
    single = {k: v.float() for k, v in a.items()}, {k: v.float() for k, v in b.items()}
    r32 = layerwise(model.float(), *single, TensorLoader(x.float(), y, batch_size=1000), lam=0.3)
    for row32, row64 in zip(r32.layers, r64.layers, strict=True):
        for key, value in row64.items():
            if isinstance(value, float):
                assert row32[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (row64["name"], key)


def test_resnet_layers_resolve_and_give_finite_metrics():
    torch.manual_seed(0)
    model = build_model("resnet20", width_multiplier=0.25, in_channels=1)
    a, b = _state(model), _state(build_model("resnet20", width_multiplier=0.25, in_channels=1))
    x = torch.randn(6, 1, 32, 32)
    loader = TensorLoader(x, torch.zeros(6, dtype=torch.long), batch_size=3)
    r = layerwise(model, a, b, loader, bn_reset_data=loader)
    assert [row["depth"] for row in r.layers] == list(range(1, 21))
    assert all(math.isfinite(v) for v in r.column("lewc"))
    assert r.column("weak_additivity")[2] is None  # the residual add's ReLU input: no module


def test_gaussian_simulation_concentrates_at_the_theorem_limit():
    assert abs(GAUSSIAN_ADDITIVITY_LIMIT - 0.9304) < 1e-4
    sim = gaussian_weak_additivity([4, 20000], samples=50, seed=0)
    mean, std = sim[20000]
    assert abs(mean - GAUSSIAN_ADDITIVITY_LIMIT) < 4 * std / math.sqrt(50) + 1e-3
    assert sim[4][1] > 10 * std  # small d: widely spread


# ---- flatness ----


def test_flatness_at_zero_is_the_model_and_the_direction_has_the_distance():
    model = _mlp(0).double()
    a, b = _state(model), _state(_mlp(1).double())
    loader = _loader()
    r = flatness(model, a, b, loader, lambdas=[0.0, 0.5, 1.0], seed=3)
    own = evaluate(model, a, loader)
    assert r.loss[0] == pytest.approx(own.loss, rel=1e-6)
    assert r.accuracy[0] == own.accuracy
    assert all(v[0] == pytest.approx(1.0, abs=1e-12) for v in r.cosine.values())
    names = [n for n, _ in model.named_parameters()]
    expected_d = math.sqrt(sum(float(((a[n] - b[n]) ** 2).sum()) for n in names))
    assert r.distance == pytest.approx(expected_d, rel=1e-12)
    u = random_direction(model, a, seed=3)
    assert math.sqrt(sum(float((t * t).sum()) for t in u.values())) == pytest.approx(1.0)
    end = {k: (a[k] + r.distance * u[k]) if k in u else a[k] for k in a}
    assert r.loss[2] == pytest.approx(evaluate(model, end, loader).loss, rel=1e-6)
    assert r.cosine["layer1"][2] < 1.0


# ---- random permutations ----


def test_random_permutation_merges_score_as_defined():
    model = _mlp(0).double()
    spec = model.permutation_spec()
    a = _state(model)
    planted = Permutation.random(spec, 7)
    b = planted.apply(a)  # B is A, hidden units shuffled
    loader = _loader(n=200, batch=50)
    r = random_permutation_merges(model, spec, a, b, loader, n=3, perm=planted.inverse(), seed=1)
    given = r.merges["given"]
    assert given["accuracy_barrier"] == pytest.approx(0.0, abs=1e-12)
    assert given["calibrated_loss_barrier"] == pytest.approx(0.0, abs=1e-9)
    assert set(r.merges) == {"none", "given", "random0", "random1", "random2"}
    assert r.held + r.rest == 200 and r.held == 40
    # "none" by hand: the merge's logits, β on the held-out 20 %, metrics on the rest.
    merged = lerp_params(a, b, 0.5)
    x, y = loader.x, loader.y
    with torch.no_grad():
        logits = torch.func.functional_call(model, merged, (x,))
    held, rest = holdout_split(200, 0.2, seed=1)
    beta = fit_temperature(logits[held], y[held])
    none = r.merges["none"]
    assert none["temperature"] == pytest.approx(1 / beta, rel=1e-6)
    assert none["calibrated_loss"] == pytest.approx(
        float(F.cross_entropy(logits[rest] * beta, y[rest])), rel=1e-6
    )
    assert none["accuracy"] == pytest.approx(
        float((logits[rest].argmax(1) == y[rest]).double().mean())
    )


# ---- bad input ----


def test_bad_inputs_are_named():
    model = _mlp(0).double()
    a, b = _state(model), _state(_mlp(1).double())
    with pytest.raises(ParamsError, match="not a module"):
        layerwise(model, a, b, _loader(), layers=[Layer("x", 1, post="nope")])
    with pytest.raises(ParamsError, match="not a Linear or Conv"):
        layerwise(model, a, b, _loader(), layers=[Layer("x", 1, linear="taps.0")])
    with pytest.raises(ParamsError, match="layerwise_layers"):
        layerwise(
            nn.Sequential(nn.Linear(10, 4)).double(),
            {
                "0.weight": torch.zeros(4, 10, dtype=torch.float64),
                "0.bias": torch.zeros(4, dtype=torch.float64),
            },
            {
                "0.weight": torch.ones(4, 10, dtype=torch.float64),
                "0.bias": torch.zeros(4, dtype=torch.float64),
            },
            _loader(),
        )
    with pytest.raises(ParamsError, match="empty loader"):
        layerwise(model, a, b, [])
    bad = dict(b)
    bad["layers.0.weight"] = bad["layers.0.weight"].clone()
    bad["layers.0.weight"][0, 0] = float("nan")
    with pytest.raises(ParamsError, match="NaN"):
        layerwise(model, a, bad, _loader())
    bn = build_model("mlp", in_dim=10, hidden=[8], out_dim=4, norm="batch")
    s = _state(bn)
    with pytest.raises(ParamsError, match="bn_reset_data"):
        layerwise(bn, s, dict(s), _loader(batch=64))
    with pytest.raises(ParamsError, match="bn_reset_data"):
        random_permutation_merges(bn, bn.permutation_spec(), s, dict(s), _loader())
    once = iter(list(_loader()))
    with pytest.raises((ParamsError, DataError)):
        random_permutation_merges(model, model.permutation_spec(), a, b, once)
