"""The papers' random choices and temperatures are the ones the code makes — each test fails
for a plausible wrong version that a test looking only at outcomes would pass: a fixed
visiting order where Alg. 3 draws one, a temperature that is ignored, an initial
permutation placed as its inverse, one random permutation drawn for both models, a
calibration error over one bin too few."""

import math

import pytest
import torch

from lmckit import Permutation
from lmckit.analysis import random_permutation_merges
from lmckit.analysis.random_permutations import scored_logits
from lmckit.data import TensorLoader
from lmckit.evaluate import calibration_metrics
from lmckit.evaluate.calibration import calibrated_loss
from lmckit.match import sinkhorn_matching
from lmckit.match.sinkhorn import log_sinkhorn
from lmckit.merge import merge_many
from lmckit.metrics import predict
from lmckit.models import build_model, permutation_spec
from lmckit.params import lerp_params


def _mlp(seed: int, hidden=(5,), in_dim=4):
    torch.manual_seed(seed)
    return build_model("mlp", in_dim=in_dim, hidden=list(hidden), out_dim=3).double()


# -- ECE: n_bins equal-width bins, each example in the bin its confidence falls in -----------
def naive_ece(logits, labels, n_bins):
    probs = logits.double().softmax(-1)
    conf, pred = probs.max(-1)
    bins: dict[int, list[tuple[float, float]]] = {}
    for c, p, y in zip(conf.tolist(), pred.tolist(), labels.tolist(), strict=True):
        k = max(0, math.ceil(c * n_bins) - 1)  # (k/n, (k+1)/n], the first also holds 0
        bins.setdefault(k, []).append((c, float(p == y)))
    return sum(
        len(v) / len(labels) * abs(sum(c for c, _ in v) / len(v) - sum(a for _, a in v) / len(v))
        for v in bins.values()
    )


@pytest.mark.parametrize("n_bins", [2, 5, 15])
def test_ece_has_n_bins_and_equals_the_naive_sum(n_bins):
    g = torch.Generator().manual_seed(0)
    # confidences spread over the whole range, many in the top bin
    logits = (
        torch.randn(400, 4, generator=g, dtype=torch.float64) * torch.linspace(0, 8, 400)[:, None]
    )
    labels = torch.randint(0, 4, (400,), generator=g)
    result = calibration_metrics(logits, labels, n_bins=n_bins)
    assert len(result["bins"]) == n_bins
    assert result["bins"][-1]["upper"] == 1.0 and result["bins"][0]["lower"] == 0.0
    assert sum(b["count"] for b in result["bins"]) == 400
    assert result["ece"] == pytest.approx(naive_ece(logits, labels, n_bins), abs=1e-12)


def test_the_calibrated_loss_uses_the_fitted_temperature():
    """β fitted on the held-out part scales the logits of the rest: the reported loss is
    the cross-entropy of ``β · logits`` there — not of the raw logits."""
    g = torch.Generator().manual_seed(1)
    logits = 6 * torch.randn(500, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (500,), generator=g)
    out = calibrated_loss(logits, labels, fraction=0.3, seed=2)
    beta = 1 / out["temperature"]
    rest = out["rest"]
    expected = torch.nn.functional.cross_entropy(beta * logits[rest], labels[rest]).item()
    raw = torch.nn.functional.cross_entropy(logits[rest], labels[rest]).item()
    assert out["loss"] == pytest.approx(expected, rel=1e-12)
    assert abs(raw - expected) > 0.1  # the temperature matters here


# -- Sinkhorn: temperature and initial permutation ----------------------------------------------
def _one_hidden_l2(a, b, p):
    """‖θ_A − P(θ_B)‖² / ‖θ_A‖² for a one-hidden-layer MLP, P acting as lmckit's convention
    (``aligned[i] = Σ_j P[i, j] B[j]``): rows of layer 0, columns of layer 1."""
    w0, b0 = p @ b["layers.0.weight"], p @ b["layers.0.bias"]
    w1 = b["layers.1.weight"] @ p.T
    diffs = (
        a["layers.0.weight"] - w0,
        a["layers.0.bias"] - b0,
        a["layers.1.weight"] - w1,
        a["layers.1.bias"] - b["layers.1.bias"],
    )
    return float(sum((d**2).sum() for d in diffs) / sum((v**2).sum() for v in a.values()))


@pytest.mark.parametrize("tau", [0.05, 1.0])
def test_sinkhorn_first_loss_is_the_closed_form_at_its_temperature_and_start(tau):
    """The first step's loss is ‖θ_A − P(θ_B)‖²/‖θ_A‖² with P = Sinkhorn(logits / τ), the
    logits being the seeded noise plus 5 on the initial permutation's entries (i, p[i])."""
    a, b = _mlp(0).state_dict(), _mlp(1).state_dict()
    spec = permutation_spec(_mlp(0))
    (group,) = spec.groups
    init = Permutation(spec, {group: torch.tensor([1, 2, 0, 4, 3])})  # a 3-cycle: p⁻¹ ≠ p
    result = sinkhorn_matching(spec, a, b, init=init, tau=tau, steps=1, seed=3, sinkhorn_iters=20)
    base = 0.01 * torch.randn(5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    base[torch.arange(5), init[group]] += 5.0
    p = log_sinkhorn(base / tau, 20).exp()
    assert result.history[0] == pytest.approx(_one_hidden_l2(a, b, p), rel=1e-9)
    # the wrong placements give other numbers (so the check above can fail)
    inverse = 0.01 * torch.randn(
        5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    inverse[init[group], torch.arange(5)] += 5.0
    assert (
        abs(_one_hidden_l2(a, b, log_sinkhorn(inverse / tau, 20).exp()) - result.history[0]) > 1e-6
    )
    if tau != 1.0:
        untempered = log_sinkhorn(base, 20).exp()
        assert abs(_one_hidden_l2(a, b, untempered) - result.history[0]) > 1e-6


def test_sinkhorn_started_at_a_permutation_returns_it_after_a_negligible_step():
    a, b = _mlp(0).state_dict(), _mlp(1).state_dict()
    spec = permutation_spec(_mlp(0))
    (group,) = spec.groups
    init = Permutation(spec, {group: torch.tensor([1, 2, 0, 4, 3])})
    result = sinkhorn_matching(spec, a, b, init=init, steps=1, lr=1e-12, tau=0.5)
    assert result.perm == init and result.perm != init.inverse()


# -- MergeMany: each round visits the models in a fresh random order (Git Re-Basin Alg. 3) -----
def test_merge_many_visits_the_models_in_the_seeded_random_order(monkeypatch):
    import lmckit.merge.many as many

    visits: list[int] = []
    index: dict[int, int] = {}

    class Recording(many.WeightMatcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            index[id(self)] = len(index)

        def match(self, *args, **kwargs):
            visits.append(index[id(self)])
            return super().match(*args, **kwargs)

    monkeypatch.setattr(many, "WeightMatcher", Recording)
    models = [_mlp(s, hidden=(6, 6)).state_dict() for s in range(5)]
    spec = permutation_spec(_mlp(0, hidden=(6, 6)))
    orders = {}
    for seed in (0, 1, 2):
        visits.clear()
        index.clear()
        result = merge_many(spec, models, seed=seed, max_rounds=3)
        rounds = [visits[i : i + 5] for i in range(0, len(visits), 5)]
        assert len(rounds) == result.iterations and all(sorted(r) == list(range(5)) for r in rounds)
        generator = torch.Generator().manual_seed(seed)
        expected = [torch.randperm(5, generator=generator).tolist() for _ in rounds]
        assert rounds == expected
        orders[seed] = rounds[0]
    assert len({tuple(o) for o in orders.values()}) > 1  # not one fixed order


# -- random permutation merges: π_A and π_B drawn independently --------------------------------
def test_random_permutation_merges_permute_both_models_independently():
    model = _mlp(0, hidden=(16,), in_dim=6)
    spec = permutation_spec(model)
    a, b = model.state_dict(), _mlp(1, hidden=(16,), in_dim=6).state_dict()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(200, 6, generator=g, dtype=torch.float64)
    loader = TensorLoader(x, torch.randint(0, 3, (200,), generator=g), batch_size=50)
    result = random_permutation_merges(model, spec, a, b, loader, n=2, seed=9)
    generator = torch.Generator().manual_seed(9)
    for i in range(2):
        pi_a, pi_b = Permutation.random(spec, generator), Permutation.random(spec, generator)
        merged = lerp_params(pi_a.apply(a), pi_b.apply(b), 0.5)
        logits, labels = predict(model, merged, loader)
        expected = scored_logits(logits, labels, fraction=0.2, seed=9)
        assert result.merges[f"random{i}"]["loss"] == pytest.approx(expected["loss"], rel=1e-12)
        assert pi_a != pi_b
    # one permutation for both would merge π(A) with π(B): the naive merge, permuted
    naive, random0 = result.merges["none"], result.merges["random0"]
    assert naive["loss"] != pytest.approx(random0["loss"], rel=1e-6)
