"""Sophia (Liu et al. 2023, "Sophia: A Scalable Stochastic Second-order Optimizer for
Language Model Pre-training"), the second-order optimiser of the width study's App. F.10,
written from the paper's Algorithm 3 with the Gauss–Newton–Bartlett (GNB) estimator of
Algorithm 2. No maintained package provides it: the authors' code is a research release
beside their GPT-2 scripts, and PyPI ``sophia-opt`` is a third party's repackaging of it.

Per parameter, with gradient ``g_t`` of the minibatch loss:

* ``m_t = β₁ m_{t−1} + (1 − β₁) g_t``;
* every ``k`` steps (the first step included), with ``ĝ`` the gradient of the loss on
  labels *sampled* from the model's own softmax over the same minibatch of size ``B``:
  ``h_t = β₂ h_{t−k} + (1 − β₂) · B · ĝ ⊙ ĝ`` (GNB: an unbiased estimate of the
  Gauss–Newton diagonal), otherwise ``h_t = h_{t−1}``;
* ``θ ← θ − η λ θ`` (decoupled weight decay), then
  ``θ ← θ − η · clip(m_t / max(γ h_t, ε), 1)`` elementwise, ``clip(z, 1) = max(−1, min(z, 1))``.

With ``coupled_weight_decay=True`` the decay is an L2 penalty instead, as Adam's
``weight_decay`` is: ``g_t ← g_t + λ θ`` enters the moment and there is no decoupled step.
The width study gave Sophia its Adam recipe's weight decay 3e-3; read as Sophia's
decoupled decay at η = 1e-3 that is ``ηλ = 3e-6`` per step (almost none), read as Adam's
coupled L2 it is the recipe's regularisation — the two readings are separate optimisers
(``"sophia"`` and ``"sophia-l2"`` in :class:`lmckit.train.TrainConfig`). Measured side by
side (``experiments/lewc-ablations-fmnist.toml``, MLPs of three hidden layers of 256
and 1,024 units on Fashion-MNIST, 10 epochs, three pairs): decoupled (ηλ = 3e-6, or
3e-3) models merge without permutation at chance (calibrated barrier 1.8–1.9); coupled L2
ones connect (0.347 → 0.206 with width) at 2–3 points less accuracy. Neither is a default: the paper
does not say which it used.

Defaults are those of the authors' released optimiser: ``β = (0.965, 0.99)``, ``γ = 0.04``,
``k = 10``, ``ε = 1e-15``. The width study kept its first-order learning rate and weight
decay for Sophia; so does :func:`lmckit.train.train`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["HESSIAN_INTERVAL", "SophiaG"]

HESSIAN_INTERVAL = 10
"""``k``: steps between GNB Hessian estimates."""


class SophiaG(torch.optim.Optimizer):
    """Sophia with the GNB Hessian estimator (see the module docstring).

    The training loop calls :meth:`update_hessian` every ``k`` steps, after a backward pass
    of the loss on sampled labels has put ``ĝ`` into ``p.grad``, and :meth:`step` after
    the ordinary backward pass as for any optimiser.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.965, 0.99),
        rho: float = 0.04,
        weight_decay: float = 0.0,
        eps: float = 1e-15,
        coupled_weight_decay: bool = False,
    ) -> None:
        if not lr > 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or not rho > 0:
            raise ValueError(f"invalid Sophia settings lr={lr}, betas={betas}, rho={rho}")
        if weight_decay < 0 or not eps > 0:
            raise ValueError(f"invalid Sophia settings weight_decay={weight_decay}, eps={eps}")
        defaults = dict(
            lr=lr,
            betas=betas,
            rho=rho,
            weight_decay=weight_decay,
            eps=eps,
            coupled_weight_decay=coupled_weight_decay,
        )
        super().__init__(params, defaults)

    def _state(self, p: Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p)
            state["hessian"] = torch.zeros_like(p)
        return state

    @torch.no_grad()
    def update_hessian(self, batch_size: int) -> None:
        """``h ← β₂ h + (1 − β₂) · B · ĝ ⊙ ĝ`` from the gradients now in ``p.grad`` (those
        of the loss on labels sampled from the model, mean over a batch of ``B``)."""
        for group in self.param_groups:
            beta2 = group["betas"][1]
            for p in group["params"]:
                if p.grad is None:
                    continue
                h = self._state(p)["hessian"]
                h.mul_(beta2).addcmul_(p.grad, p.grad, value=(1 - beta2) * batch_size)

    @torch.no_grad()
    def step(self, closure=None):
        """One Sophia update of every parameter with a gradient (see the module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1 = group["betas"][0]
            lr, rho, eps, wd = group["lr"], group["rho"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p)
                m, h = state["exp_avg"], state["hessian"]
                grad = p.grad
                if wd and group["coupled_weight_decay"]:
                    grad = grad.add(p, alpha=wd)  # L2 in the gradient, as Adam's decay
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                if wd and not group["coupled_weight_decay"]:
                    p.mul_(1 - lr * wd)
                ratio = (m / (rho * h).clamp_min(eps)).clamp_(-1.0, 1.0)
                p.add_(ratio, alpha=-lr)
        return loss
