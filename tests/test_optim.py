"""Sophia against its update rule by hand and its GNB estimator against the exact
Gauss–Newton diagonal of a softmax-linear model."""

import pytest
import torch

from lmckit.data import load_dataset
from lmckit.optim import SophiaG
from lmckit.train import TrainConfig, _gnb_estimate, init_model, train


def test_one_step_follows_the_update_rule():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64))
    opt = SophiaG([p], lr=0.1, betas=(0.9, 0.99), rho=0.5, weight_decay=0.2, eps=1e-12)
    g_hat = torch.tensor([2.0, 0.0, 1.0, 4.0], dtype=torch.float64)
    p.grad = g_hat.clone()
    opt.update_hessian(batch_size=3)
    h = 0.01 * 3 * g_hat**2  # (1 − β₂) · B · ĝ²
    g = torch.tensor([0.3, -0.7, 0.05, -8.0], dtype=torch.float64)
    p.grad = g.clone()
    before = p.detach().clone()
    opt.step()
    m = 0.1 * g
    ratio = (m / torch.clamp(0.5 * h, min=1e-12)).clamp(-1, 1)
    expected = before * (1 - 0.1 * 0.2) - 0.1 * ratio
    assert torch.allclose(p.detach(), expected, rtol=0, atol=1e-15)
    # the second coordinate had h = 0: its step is the full clipped −lr·sign(m)
    assert ratio[1] == -1.0 and ratio[3] == -1.0 and abs(ratio[2]) < 1


def test_coupled_weight_decay_enters_the_moment_as_l2():
    """``coupled_weight_decay``: ``m = (1 − β₁)(g + λθ)`` and no decoupled shrink — the
    width study's Sophia with Adam's (coupled) weight decay."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    opt = SophiaG([p], lr=0.1, betas=(0.9, 0.99), rho=0.5, weight_decay=0.2, eps=1e-12,
                  coupled_weight_decay=True)  # fmt: skip
    p.grad = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    opt.update_hessian(batch_size=2)
    h = 0.01 * 2 * p.grad**2
    g = torch.tensor([0.01, -0.02, 0.3], dtype=torch.float64)
    p.grad = g.clone()
    before = p.detach().clone()
    opt.step()
    m = 0.1 * (g + 0.2 * before)
    expected = before - 0.1 * (m / (0.5 * h)).clamp(-1, 1)
    assert torch.allclose(p.detach(), expected, rtol=0, atol=1e-15)
    # the decoupled rule from the same state is another point
    decoupled = before * (1 - 0.1 * 0.2) - 0.1 * (0.1 * g / (0.5 * h)).clamp(-1, 1)
    assert not torch.allclose(expected, decoupled, atol=1e-6)


def test_sophia_l2_is_a_training_option():
    digits = load_dataset("digits")
    runs = {}
    for name in ("sophia", "sophia-l2"):
        cfg = TrainConfig(epochs=1, batch_size=64, optimizer=name, lr=1e-3, weight_decay=0.5)
        model = init_model("mlp", {"in_dim": 64, "hidden": [16], "out_dim": 10}, seed=0)
        train(model, digits, cfg)
        runs[name] = model.state_dict()["layers.0.weight"]
    assert not torch.allclose(runs["sophia"], runs["sophia-l2"])


def test_gnb_estimator_is_unbiased_for_the_gauss_newton_diagonal():
    """For logits z = W x, E_ŷ[B ĝ²] = diag of (1/B) Σ_b J_bᵀ (diag p_b − p_b p_bᵀ) J_b."""
    torch.manual_seed(0)
    b, d, c = 6, 3, 4
    x = torch.randn(b, d, dtype=torch.float64)
    w = torch.randn(c, d, dtype=torch.float64, requires_grad=True)
    logits = x @ w.T
    p = logits.detach().softmax(-1)
    exact = torch.zeros(c, d, dtype=torch.float64)
    for i in range(b):
        cov = torch.diag(p[i]) - torch.outer(p[i], p[i])  # (c, c)
        exact += torch.diag(cov)[:, None] * (x[i] ** 2)[None, :]
    exact /= b
    # lmckit's estimator as the training loop calls it (β₂ = 0: h is this draw's B·ĝ²)
    opt = SophiaG([w], lr=1e-3, betas=(0.9, 0.0))
    total = torch.zeros_like(exact)
    n = 4000
    for step in range(n):
        logits = x @ w.T
        _gnb_estimate(opt, logits, seed=1, step=step)
        total += opt.state[w]["hessian"]
    estimate = total / n
    assert torch.allclose(estimate, exact, rtol=0.15, atol=2e-3)
    assert w.grad is None  # the loss gradients (none here) are left as they were


def test_sophia_trains_an_mlp_deterministically():
    digits = load_dataset("digits")
    cfg = TrainConfig(epochs=3, batch_size=64, optimizer="sophia", lr=1e-3, weight_decay=3e-3)
    runs = []
    for _ in range(2):
        model = init_model("mlp", {"in_dim": 64, "hidden": [64], "out_dim": 10}, seed=0)
        result = train(model, digits, cfg)
        runs.append((model.state_dict(), result.test.accuracy))
    assert runs[0][1] > 0.85
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])


def test_bad_settings_are_refused():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="invalid Sophia"):
        SophiaG(p, lr=-1)
    with pytest.raises(ValueError, match="invalid Sophia"):
        SophiaG(p, weight_decay=-0.1)


@pytest.mark.parametrize(
    "name, cls, settings",
    [
        ("sgd", torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
        ("adam", torch.optim.Adam, {"decoupled_weight_decay": False}),
        ("adamw", torch.optim.AdamW, {}),
        ("sophia", SophiaG, {"coupled_weight_decay": False}),
        ("sophia-l2", SophiaG, {"coupled_weight_decay": True}),
    ],
)
def test_each_optimizer_name_builds_its_own_optimizer(name, cls, settings):
    """Option routing: every name reaches its own class and settings — a swap of two names
    (sophia ↔ sophia-l2) gives two runs that still differ, so only the built optimiser
    tells them apart."""
    from lmckit.train import _make_optimizer

    cfg = TrainConfig(
        optimizer=name, lr=0.01, weight_decay=0.25, momentum=0.9, nesterov=name == "sgd"
    )
    model = init_model("mlp", {"in_dim": 4, "hidden": [3], "out_dim": 2}, seed=0)
    opt = _make_optimizer(model, cfg)
    assert type(opt) is cls
    group = opt.param_groups[0]
    assert group["lr"] == 0.01 and group["weight_decay"] == 0.25
    for key, value in settings.items():
        assert group[key] == value, (name, key)
