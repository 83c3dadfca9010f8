"""Every random draw whose law matters is checked for its law, not only for its support: a
sampler that returns valid elements from the wrong distribution (a Haar sampler without the
QR sign fix, a permutation that is never the one drawn, a scale drawn on the wrong range)
passes every test of the values it returns, and biases every probe and every random
restart built on it.

Each test draws many samples under a fixed seed and compares moments or frequencies with
their closed forms, with bounds of about five standard errors: deterministic, and far
outside what the wrong laws give (each says how far in its comment)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from lmckit.perm import PermutationSpec, random_index_vectors
from lmckit.transform import haar_orthogonal, mean_free_basis, random_map

DRAWS = 4000


def _draws(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([random_map(kind, n, g) for _ in range(DRAWS)])


def _within(value: float, expected: float, std: float, draws: int = DRAWS) -> bool:
    return abs(value - expected) <= 5 * std / math.sqrt(draws)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_haar_orthogonal_matrices_have_the_haar_moments(n):
    """Under Haar measure on O(n): every entry has mean 0 and variance 1/n, the determinant
    is ±1 with probability ½ each, and the trace has mean 0 and second moment 1 (Diaconis
    & Shahshahani 1994). QR without the sign fix gives a first entry that is always
    negative (mean ≈ −0.9 for n = 2) and a determinant of one sign for some n."""
    g = torch.Generator().manual_seed(n)
    q = torch.stack([haar_orthogonal(n, g) for _ in range(DRAWS)])
    eye = torch.eye(n, dtype=torch.float64)
    assert torch.allclose(q @ q.transpose(1, 2), eye.expand_as(q), atol=1e-12)
    sd = math.sqrt(1 / n)
    for i, j in itertools.product(range(n), repeat=2):
        assert _within(q[:, i, j].mean().item(), 0.0, sd), (i, j, q[:, i, j].mean())
    assert q.pow(2).mean(0).sub(1 / n).abs().max().item() < 5 * math.sqrt(2 / n**2 / DRAWS) + 0.01
    det = torch.linalg.det(q)
    assert _within((det > 0).double().mean().item(), 0.5, 0.5)
    trace = q.diagonal(dim1=1, dim2=2).sum(-1)
    assert _within(trace.mean().item(), 0.0, 1.0)
    assert _within(trace.pow(2).mean().item(), 1.0, math.sqrt(2))


def test_orthogonal_mean_free_maps_fix_the_mean_and_are_haar_on_the_rest():
    """``orthogonal-mean-free``: Q·1 = 1, and on the mean-free subspace Q is Haar on O(n−1):
    E[Q] = 11ᵀ/n (the projection onto 1) and E[tr Q] = 1, E[(tr Q − 1)²] = 1."""
    n = 4
    q = _draws("orthogonal-mean-free", n)
    ones = torch.ones(n, dtype=torch.float64)
    assert torch.allclose(q @ ones, ones.expand(DRAWS, n), atol=1e-12)
    expected = torch.full((n, n), 1 / n, dtype=torch.float64)
    assert (q.mean(0) - expected).abs().max().item() < 5 * math.sqrt(1 / (n - 1) / DRAWS)
    trace = q.diagonal(dim1=1, dim2=2).sum(-1)
    assert _within(trace.mean().item(), 1.0, 1.0)
    assert _within((trace - 1).pow(2).mean().item(), 1.0, math.sqrt(2))
    # the basis the kind is built on: first column 1/√n, orthonormal
    basis = mean_free_basis(n)
    assert torch.allclose(basis[:, 0], ones / math.sqrt(n), atol=1e-15)
    assert torch.allclose(basis.T @ basis, torch.eye(n, dtype=torch.float64), atol=1e-14)


def test_invertible_maps_have_their_stated_singular_values_and_haar_factors():
    """``Q₁ diag(s) Q₂`` with ``log s ~ U(−½, ½)``: singular values inside [e^−½, e^½] with
    log-mean 0 and log-variance 1/12; Haar factors make every entry's mean 0."""
    n = 3
    m = _draws("invertible", n)
    logs = torch.linalg.svdvals(m).log()
    assert logs.min().item() >= -0.5 - 1e-12 and logs.max().item() <= 0.5 + 1e-12
    assert _within(logs.mean().item(), 0.0, math.sqrt(1 / 12), DRAWS * n)
    assert abs(logs.var().item() - 1 / 12) < 0.01
    assert m.mean(0).abs().max().item() < 5 * math.sqrt(1.2 / n / DRAWS)


def test_scaling_maps_are_a_uniform_permutation_times_log_uniform_scales():
    """``scaling``: each of the n! permutations equally often, scales ``exp(U(−1, 1))``
    (log-mean 0, log-variance 1/3)."""
    n = 3
    m = _draws("scaling", n)
    support = m != 0
    assert (support.sum(-1) == 1).all() and (support.sum(-2) == 1).all()
    counts: dict[tuple[int, ...], int] = {}
    for row in support.double().argmax(-1).tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert len(counts) == math.factorial(n)
    expected = DRAWS / math.factorial(n)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 20.5  # χ² with 5 degrees of freedom: P(> 20.5) ≈ 0.001
    logs = m[support].log()
    assert logs.abs().max().item() <= 1 + 1e-12
    assert _within(logs.mean().item(), 0.0, math.sqrt(1 / 3), DRAWS * n)
    assert abs(logs.var().item() - 1 / 3) < 0.03


@pytest.mark.parametrize("moving", [False, True])
def test_random_index_vectors_are_uniform_over_their_permutations(moving):
    """Uniform over S₃ (all six equally often); with ``moving=True`` uniform over the five
    that are not the identity — a redraw, not a fixed replacement (a shifted identity, say,
    which would give one permutation a sixth of the mass twice)."""
    spec = PermutationSpec({"g": 3}, {"w": ("g",)})
    g = torch.Generator().manual_seed(5)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(DRAWS):
        p = tuple(random_index_vectors(spec, g, moving=moving)["g"].tolist())
        counts[p] = counts.get(p, 0) + 1
    perms = [p for p in itertools.permutations(range(3)) if not moving or p != (0, 1, 2)]
    assert sorted(counts) == sorted(perms)
    expected = DRAWS / len(perms)
    chi2 = sum((counts[p] - expected) ** 2 / expected for p in perms)
    assert chi2 < 20.5  # χ² with ≤ 5 degrees of freedom: P(> 20.5) ≈ 0.001


def test_head_structured_draws_permute_heads_uniformly_and_rotate_inside_each():
    """A head-structured orthogonal group of three heads: the head permutation uniform over
    the five of S₃ that move (``Transform.random`` draws moving parts) and each head's block
    Haar (its entries mean 0), not one block repeated."""
    from lmckit.transform import Transform, head_blocks

    spec = PermutationSpec(
        {"h": 6}, {"w": ("h", None)}, heads={"h": ("t", 3)}, kinds={"h": "orthogonal"}
    )
    g = torch.Generator().manual_seed(2)
    draws = DRAWS // 2
    counts: dict[tuple[int, ...], int] = {}
    blocks = []
    for _ in range(draws):
        outer, inner = head_blocks(Transform.random(spec, g).matrix("h"), 3)
        key = tuple(outer.tolist())
        counts[key] = counts.get(key, 0) + 1
        blocks.append(torch.stack(list(inner)))
    moving = [p for p in itertools.permutations(range(3)) if p != (0, 1, 2)]
    assert sorted(counts) == sorted(moving)
    expected = draws / len(moving)
    assert sum((counts[p] - expected) ** 2 / expected for p in moving) < 18.5  # χ²₄, 0.001
    stacked = torch.stack(blocks)  # (draws, heads, 2, 2)
    assert stacked.mean(0).abs().max().item() < 5 * math.sqrt(0.5 / draws)
    assert not torch.allclose(stacked[:, 0], stacked[:, 1])


def _chi2(counts: list[int]) -> float:
    expected = sum(counts) / len(counts)
    return sum((c - expected) ** 2 / expected for c in counts)


def test_crop_and_flip_draw_every_offset_and_the_flip_uniformly_and_independently():
    """``random_crop_flip`` with padding 1 on a 4 × 4 image: each of the 3 × 3 crop offsets
    with and without a flip — 18 outcomes, told apart because every pixel differs — a
    1/18 each (a flip drawn once per batch, or offsets skewed to the centre, fail)."""
    import torch.nn.functional as F

    from lmckit.data.loaders import random_crop_flip

    n, p = 3600, 1
    image = torch.arange(1, 17, dtype=torch.float64).reshape(1, 1, 4, 4)
    out = random_crop_flip(image.expand(n, 1, 4, 4), torch.Generator().manual_seed(3), padding=p)
    padded = F.pad(image, (p,) * 4)[0, 0]
    candidates = []
    for dy in range(2 * p + 1):
        for dx in range(2 * p + 1):
            crop = padded[dy : dy + 4, dx : dx + 4]
            candidates += [crop, crop.flip(1)]
    stacked = torch.stack(candidates)  # (18, 4, 4), all distinct
    hits = (out[:, 0, None] == stacked[None]).flatten(2).all(-1)  # (n, 18)
    assert (hits.sum(1) == 1).all()
    counts = hits.sum(0).tolist()
    assert _chi2(counts) < 40.8, counts  # χ² with 17 degrees of freedom: P(> 40.8) ≈ 0.001


def test_a_shuffled_loader_visits_every_order_start_uniformly_and_anew_each_epoch():
    """The first example of an epoch is uniform over the N examples, and the epochs' orders
    are independent draws (each epoch seeded by (seed, epoch)), not one order repeated."""
    from lmckit.data import TensorLoader

    n = 6
    loader = TensorLoader(torch.arange(n), torch.zeros(n, dtype=torch.long), batch_size=n,
                          shuffle=True, seed=11)  # fmt: skip
    firsts, orders = [0] * n, set()
    for epoch in range(3000):
        loader.set_epoch(epoch)
        ((x, _),) = list(loader)
        firsts[int(x[0])] += 1
        orders.add(tuple(x.tolist()))
    assert _chi2(firsts) < 20.5, firsts  # χ² with 5 degrees of freedom
    assert len(orders) > 600  # of 720: 3000 independent draws leave few unseen
