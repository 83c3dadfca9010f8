"""CCMM: Frank–Wolfe over doubly-stochastic maps, started from star-WM or a given start."""

import sys

import numpy as np
import pytest
import torch

from lmckit.lap import assign_groups
from lmckit.merge import ccmm, star
from lmckit.merge.ccmm import _aligned, _line_search
from lmckit.params import pairwise_inner_sum
from lmckit.perm import Permutation, PermutationSpec
from tests.merge.common import random_models


def test_ccmm_objective_never_decreases_and_beats_the_unaligned_models():
    _, spec, params = random_models(4, hidden=(32, 32))
    fw = ccmm(spec, params)
    assert all(b >= a - 1e-6 * abs(a) for a, b in zip(fw.history, fw.history[1:], strict=False))
    aligned = [p.apply(x) for p, x in zip(fw.perms, params, strict=True)]
    assert float(pairwise_inner_sum(aligned)) > float(pairwise_inner_sum(params))
    assert fw.info["init"] == "star-wm"


def test_ccmm_takes_a_start_per_model():
    _, spec, params = random_models(3)
    default = ccmm(spec, params, seed=0)
    start = list(star(spec, params, seed=0).perms)
    given = ccmm(spec, params, seed=0, init=start)
    assert given.perms == default.perms and given.info["init"] == "given"
    from_identity = ccmm(spec, params, init=[Permutation.identity(spec)] * 3)
    assert from_identity.history[0] == float(pairwise_inner_sum(params))


def test_ccmm_improves_strictly_beyond_its_star_start():
    for seed in range(2):
        _, spec, params = random_models(4, hidden=(32, 32), seed=seed)
        start = float(
            pairwise_inner_sum(
                [p.apply(x) for p, x in zip(star(spec, params).perms, params, strict=True)]
            )
        )
        fw = ccmm(spec, params)
        assert fw.history[0] == pytest.approx(start)
        aligned = [p.apply(x) for p, x in zip(fw.perms, params, strict=True)]
        assert float(pairwise_inner_sum(aligned)) > 1.1 * start
        assert fw.iterations > 1


def _frank_wolfe_step(spec, params, seed):
    """A doubly-stochastic start per model (Sinkhorn-normalised noise) and the Frank–Wolfe
    vertex from it: the permutation maximising the objective's linearisation."""
    g = torch.Generator().manual_seed(seed)

    def doubly_stochastic(m):
        x = torch.rand(m, m, generator=g, dtype=torch.float64) + 0.1
        for _ in range(50):
            x = x / x.sum(0, keepdim=True)
            x = x / x.sum(1, keepdim=True)
        return x

    soft = [{k: doubly_stochastic(m).requires_grad_() for k, m in spec.groups.items()}
            for _ in params]  # fmt: skip
    f = pairwise_inner_sum(_aligned(spec, params, soft))
    grads = iter(torch.autograd.grad(f, [m for s in soft for m in s.values()]))
    vertices = []
    for s in soft:
        best = assign_groups({k: next(grads) for k in s}, spec.heads)
        vertices.append({k: torch.eye(m.shape[0], dtype=m.dtype)[best[k]] for k, m in s.items()})
    return [{k: m.detach() for k, m in s.items()} for s in soft], vertices


@pytest.mark.parametrize("case", ["mlp", "three-axis tensor"])
def test_the_line_search_finds_the_step_a_dense_search_of_the_objective_finds(case, monkeypatch):
    # against the objective evaluated directly (every model aligned anew) at 201 steps, a
    # subset of the search's grid; a tensor permuted on three axes makes f a sextic, which
    # a quartic fit (two group actions per tensor assumed) misses; a Gram chunk of 7
    # entries splits every tensor
    if case == "mlp":
        _, spec, params = random_models(3, hidden=(12, 10))
        params = [{k: v.double() for k, v in p.items()} for p in params]
    else:
        spec = PermutationSpec(
            groups={"a": 4, "b": 5, "c": 3},
            axes={"t": ("a", "b", "c"), "u": ("a",), "w": ("c", None)},
        )
        g = torch.Generator().manual_seed(3)
        shapes = {"t": (4, 5, 3), "u": (4,), "w": (3, 7)}
        params = [
            {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
            for _ in range(3)
        ]
    steps = []
    for seed in range(4):
        soft, vertices = _frank_wolfe_step(spec, params, seed)

        def f(gamma, soft=soft, vertices=vertices):
            mix = [
                {k: s[k] + gamma * (v[k] - s[k]) for k in s}
                for s, v in zip(soft, vertices, strict=True)
            ]
            return float(pairwise_inner_sum(_aligned(spec, params, mix)))

        best = max(f(float(x)) for x in np.linspace(0.0, 1.0, 201))
        for chunk in (1 << 20, 7):
            monkeypatch.setattr(sys.modules["lmckit.merge.ccmm"], "_GRAM_CHUNK", chunk)
            step = _line_search(spec, params, soft, vertices, _aligned(spec, params, soft))
            assert f(step) >= best - 1e-9 * abs(best), chunk
        steps.append(step)
    assert any(0.05 < step < 0.95 for step in steps)  # maxima inside, not only at the ends
