"""Linear assignment with dual variables and dual warm starts.

Two entry points: :func:`solve_lap`, for solves that warm-start one another and need the
dual variables ``u, v`` — by default over lmckit's own compiled Jonker–Volgenant
(:mod:`lmckit._warm_jv`, numba), or over the PyPI package ``lapjv`` — and :func:`assign` —
one cold assignment whose duals nobody needs — over ``scipy.optimize.linear_sum_assignment``.

Warm start (STE-MM, Alg. 3): given duals ``(u, v)`` of a previous, similar problem, solve
the reduced problem ``C' = C − u1ᵀ − 1vᵀ`` — which has the same optimal assignment — and
return ``(u + u', v + v')``. When the duals are still nearly optimal, ``C'`` is almost
solved already and Jonker–Volgenant finishes in a fraction of a cold solve. ``lapjv`` takes
no initial assignment, so from ``C'`` it still runs its column reduction and row reductions
over every row; lmckit's solver also takes the previous solve's assignment
(``LapDuals.assignment``) and keeps every pair of it that is tight after the reduction of
``C'`` — on weight matching's solves four rows in five (3×512 MLP: 407 of 512) — so that
only the rest are reduced and augmented. Replayed on every LAP of ten WM runs of a trained
3×512 Fashion-MNIST pair, warm solves took 0.63 s against ``lapjv``'s 1.08 s (3×1024, three
runs: 1.19 s against 2.40 s), the same permutations. Its cold solves, from the
row-then-column reduction with each column given to a row at its minimum, were faster than
``lapjv``'s from the same duals on those runs' first sweeps (3.5–6 against 5–18 ms at
n = 512, 22–42 against 32–84 ms at 1024) and level with it on the rank-one-dominated costs
of ``benchmarks/bench_lap.py`` (interleaved, 2048: 9.3–13.6 against 10.1–12.3 s; 4096: 73
against 72 s).

Four traps, measured on this machine with ``lapjv`` and handled here for both
Jonker–Volgenant backends alike (the compiled one is started from the same reduced costs,
on the same grid, and certified the same way):

* ``lapjv`` computes in float32 unless ``force_doubles=True``; we always pass float64.
* Cold Jonker–Volgenant can be pathologically slow on cost matrices with strong row/column
  structure, as weight-matching gains are (``benchmarks/bench_lap.py``, a rank-one-dominated
  2048×2048 matrix: 286 s, against 17.7 s for JV started from reduced costs and 9.5 s for
  SciPy). A solve without duals therefore starts from the row-then-column reduction duals
  ``u = minᵢ C, v = minⱼ (C − u)``; every later solve starts from the previous duals.
  Even so, JV stalls on some real matrices: activation matching's 2048×2048 correlation
  gains of two trained MLPs (width 4 × 512 on Fashion-MNIST, with dead units) took over
  120 s per group from reduced costs, against 0.4–0.6 s for SciPy. A solve that needs no
  duals therefore goes through :func:`assign` (SciPy); on benign matrices (uniform or
  correlated Gaussian, n ≤ 2048) JV is at most 2.7× faster than SciPy, so nothing is lost
  that matters.
* Warm duals whose problem has moved on are infeasible (some reduced costs negative), and
  JV started from them can be far slower than cold: in weight matching's second sweep,
  after the first sweep's permutations moved every neighbour, one warm 1024×1024 solve
  took 1.0 s against 0.05 s cold. Each row dual is therefore first lowered by its row's
  most negative reduced cost, which makes the duals feasible while keeping them as close
  to the previous ones as feasibility allows; measured over all the LAPs of WM runs on
  trained 3×512 / 3×1024 Fashion-MNIST MLPs: 0.40 → 0.17 s and 2.24 → 0.75 s (cold
  starts: 0.25 s and 1.22 s).
* Cold JV is slowest where nearly every row prefers the same few columns, as in the
  first sweep over a ResNet's convolutions (ResNet-20 ×8: in under 3 % of the columns lie
  the rows' smallest reduced costs; one 512×512 took 0.5 s, SciPy 0.12 s; the MLPs' are
  spread over 40–60 % and JV is fastest there). Such a cold solve goes through SciPy, and
  the duals for later warm starts come from its assignment (:func:`duals_of`); over the
  cold solves of that ResNet's match 1.3 → 0.5 s.
* Jonker–Volgenant can loop for hours when two reduced costs of a row differ by a few ulps
  (a warm-started 128×128 weight-matching gain of two trained Fashion-MNIST MLPs with
  weight decay never returned). Reduced costs are therefore rounded to a power-of-two grid
  ~2e-11 of their largest entry before the solve (:func:`_on_grid`), and every answer is
  checked against its duals (:func:`_certified`) before it is trusted.

Duals always refer to the *minimisation* form: ``C_min = −C`` when ``maximize=True``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lmckit.errors import LapError

try:  # pragma: no branch
    import lapjv as _lapjv
except ImportError:  # pragma: no cover - lapjv is a dependency; scipy still solves exactly
    _lapjv = None

BACKENDS = ("jv", "lapjv", "scipy")


@dataclass(frozen=True)
class LapDuals:
    """Dual variables of ``min Σ C_min[i, p[i]]``: row duals ``u`` and column duals ``v``
    (float64 arrays of length n) with ``C_min − u1ᵀ − 1vᵀ ≥ 0`` at optimality.

    ``exact`` is False when they are only a warm-start guess (the SciPy backend returns no
    duals, so it hands back the ones it was given); they still warm-start correctly.
    ``assignment`` is the solve's answer (``p``, int64), which the ``"jv"`` backend's next
    warm solve keeps wherever it is still optimal for its row — only a hint: a wrong or
    missing one costs time, never optimality."""

    u: np.ndarray
    v: np.ndarray
    exact: bool = True
    assignment: np.ndarray | None = None


def _as_cost(cost: Tensor | np.ndarray) -> np.ndarray:
    """``cost`` as a checked float64 array (square, non-empty, finite) for SciPy."""
    c = cost_array(cost).astype(np.float64, copy=False)
    _check_entries(c)
    return c


def reduction_duals(c_min: np.ndarray) -> LapDuals:
    """Row-then-column reduction: ``u = row minima``, ``v = column minima of C − u``."""
    u = c_min.min(axis=1).astype(np.float64)  # float64 even for a float32 cost
    v = np.subtract(c_min, u[:, None]).min(axis=0)
    return LapDuals(u, v, exact=False)


ROW_BLOCK = 256
"""Rows per block where a pass over an ``n × n`` matrix needs a temporary: it stays a
block, not a matrix."""

CONTENDED = 0.25
"""A cold solve goes through SciPy when its rows' smallest reduced costs (after the
row-then-column reduction) lie in fewer than this fraction of the columns."""

DUAL_PASSES = 200
"""Passes :func:`duals_of` may take before giving up (measured: 21–61 on weight
matching's matrices, n = 128 … 1024)."""


def duals_of(c_min: np.ndarray, perm: np.ndarray, max_passes: int = DUAL_PASSES) -> LapDuals | None:
    """Optimal duals of ``min Σ c_min[i, perm[i]]`` for an optimal assignment ``perm``.

    Complementary slackness fixes ``u_i = c[i, p(i)] − v_{p(i)}``; feasibility then asks
    ``v_j ≤ v_{p(i)} + c[i, j] − c[i, p(i)]`` for every ``i, j`` — difference constraints,
    without negative cycles because ``perm`` is optimal. Bellman–Ford from ``v = 0``
    solves them, one pass over the matrix (by row blocks) per round. Returns None if they
    have not settled after ``max_passes`` rounds (then ``perm`` may not be optimal, or
    rounding left a cycle a few ulps below zero).
    """
    n = len(perm)
    diag = c_min[np.arange(n), perm]
    v = np.zeros(n)
    for _ in range(max_passes):
        reach = np.full(n, np.inf)
        offset = diag - v[perm]  # c[i, j] − offset[i] bounds v_j through row i
        for i in range(0, n, ROW_BLOCK):
            block = c_min[i : i + ROW_BLOCK] - offset[i : i + ROW_BLOCK, None]
            np.minimum(reach, block.min(axis=0), out=reach)
        settled = np.minimum(v, reach)
        if np.array_equal(settled, v):
            return LapDuals(diag - v[perm], v)
        v = settled
    return None


def _contended(c_min: np.ndarray, duals: LapDuals) -> bool:
    """Whether the rows' smallest reduced costs lie in fewer than :data:`CONTENDED` of the
    columns (the matrices cold Jonker–Volgenant is slowest on)."""
    n = c_min.shape[0]
    best = np.empty(n, dtype=np.int64)
    for i in range(0, n, ROW_BLOCK):
        block = c_min[i : i + ROW_BLOCK] - duals.v[None, :]
        best[i : i + ROW_BLOCK] = block.argmin(axis=1)
    return np.unique(best).size < CONTENDED * n


def assign(cost: Tensor | np.ndarray, maximize: bool = True) -> Tensor:
    """One cold assignment ``max (or min) Σ_i cost[i, p[i]]``, without duals (SciPy).

    For callers that solve a matrix once and discard the duals (activation matching, the
    Sinkhorn and CCMM projections): SciPy's shortest-augmenting-path solver has no
    pathological inputs among those measured here, where cold Jonker–Volgenant has.

    Args:
        cost: ``(n, n)`` matrix (tensor or array; copied to CPU float64).
        maximize: maximise (gains, correlations) or minimise.

    Returns:
        ``p``: a CPU ``LongTensor`` with ``p[i]`` the column assigned to row ``i``.

    Raises:
        LapError: non-square, empty or non-finite cost.
    """
    c = _as_cost(cost)
    _, cols = linear_sum_assignment(c, maximize=maximize)
    return torch.from_numpy(cols.astype(np.int64))


def solve_lap(
    cost: Tensor | np.ndarray,
    maximize: bool = True,
    duals: LapDuals | None = None,
    *,
    backend: str = "jv",
) -> tuple[Tensor, LapDuals]:
    """Solve ``max (or min) Σ_i cost[i, p[i]]`` over permutations ``p``.

    Args:
        cost: ``(n, n)`` matrix, tensor or array, float32 or float64 (other dtypes are
            converted to float64). Read in place — a CPU float32 matrix is not copied to
            float64 first: its entries enter the float64 reduced costs exactly.
        maximize: maximise (weight matching's gains) or minimise.
        duals: duals of a similar earlier problem (minimisation form) to warm-start from.
        backend: ``"jv"`` (default): lmckit's own compiled Jonker–Volgenant
            (:mod:`lmckit._warm_jv`), started from the duals and keeping
            ``duals.assignment`` wherever it is still optimal (cold: from the
            row-then-column reduction; ``lapjv`` where numba is missing); ``"lapjv"``: the
            compiled ``lapjv`` package from the reduced costs (the earlier default, which
            takes no initial assignment); ``"scipy"``: the reference (no duals).

    Returns:
        ``(p, duals)``: ``p`` a CPU ``LongTensor`` with ``p[i]`` the column assigned to row
        ``i`` — with rows indexing model A's units and columns model B's, exactly lmckit's
        permutation convention — and the new duals for the next warm start.

    Raises:
        LapError: non-square, empty or non-finite cost; duals of the wrong length or
            not finite.
    """
    c = cost_array(cost)
    sign = -1.0 if maximize else 1.0  # duals refer to the minimisation form sign · c
    n = c.shape[0]
    if backend not in BACKENDS:
        raise LapError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if duals is not None and (duals.u.shape != (n,) or duals.v.shape != (n,)):
        raise LapError(f"duals have lengths {duals.u.shape}, {duals.v.shape}; the cost is {n}×{n}")
    cold = duals is None
    if cold or backend == "scipy" or _lapjv is None:  # checked before SciPy sees it
        _check_entries(c)
    if cold:
        c_min = sign * c
        duals = reduction_duals(c_min)
        if backend != "scipy" and n > 1 and _contended(c_min, duals):
            # SciPy's assignment, its exact duals, and JV from them (which then only certifies)
            _, cols = linear_sum_assignment(c, maximize=maximize)
            exact = duals_of(c_min, cols) or duals
            duals = LapDuals(exact.u, exact.v, assignment=cols.astype(np.int64))
    if backend == "jv" and (kernels := _warm_kernels()) is not None:
        return _solve_warm(kernels, c, maximize, duals)
    if backend == "scipy" or _lapjv is None:
        return _fallback(c, maximize, duals)
    # C_min − u1ᵀ − 1vᵀ in two passes over one new float64 array, the first reading the
    # cost in its own dtype (the solves are LAP-bound at large n, and each extra pass over
    # an n × n float64 matrix is a few percent of a warm solve)
    reduced = np.subtract(-duals.u[:, None], c) if maximize else np.subtract(c, duals.u[:, None])
    reduced -= duals.v[None, :]
    # a NaN or -inf in the reduced costs shows in its row's minimum, +inf in the maximum
    # that _on_grid takes: no separate pass over the cost for finiteness
    row_min = reduced.min(axis=1)
    if not np.isfinite(row_min).all():
        _raise_non_finite(c, duals)
    if n == 1:
        only = np.zeros(1, dtype=np.int64)
        return torch.from_numpy(only), LapDuals(
            duals.u + reduced[0], duals.v.copy(), assignment=only
        )
    # feasible duals near the given ones: each row dual lowered by its most negative entry
    shift = np.minimum(row_min, 0.0)
    if shift.any():  # in place over every row (x − 0 is x): no gather and scatter back
        reduced -= shift[:, None]
    u = duals.u + shift
    quantum = _on_grid(reduced)
    if not math.isfinite(quantum):
        _raise_non_finite(c, duals)
    cols, _, (_, du, dv) = _lapjv.lapjv(reduced, force_doubles=True)
    perm = cols.astype(np.int64)
    if not _certified(reduced, perm, du, dv, quantum):  # never seen; do not trust it
        return _fallback(c, maximize, LapDuals(u, duals.v))
    return torch.from_numpy(perm), LapDuals(u + du, duals.v + dv, assignment=perm)


def _fallback(c: np.ndarray, maximize: bool, duals: LapDuals) -> tuple[Tensor, LapDuals]:
    """SciPy's assignment where a compiled solver's answer failed its certificate; the
    (feasible) duals it was started from go back as a warm-start guess."""
    _, cols = linear_sum_assignment(c, maximize=maximize)
    perm = cols.astype(np.int64)
    return torch.from_numpy(perm), LapDuals(duals.u, duals.v, exact=False, assignment=perm)


@functools.cache
def _warm_kernels() -> ModuleType | None:
    """:mod:`lmckit._warm_jv`, imported on the first warm solve (numba's import and the
    loading of its cached machine code cost ~0.3 s, which a program that never warm-starts
    a LAP need not pay); None where numba is missing."""
    try:
        from lmckit import _warm_jv
    except ImportError:  # pragma: no cover - numba is a dependency; lapjv then solves warm
        return None
    return _warm_jv


def compile_kernels() -> float:
    """Compile (on a fresh install) or load (from numba's on-disk cache) the kernels of the
    default backend for float32 and float64 costs, and return the seconds it took — ~3 s
    the first time, ~0.3 s later — so that a caller can pay it before timing anything, as
    ``make setup`` and the benchmarks do. 0.0 where numba is missing."""
    start = time.perf_counter()
    if _warm_kernels() is None:
        return 0.0
    for dtype in (np.float32, np.float64):
        eye = np.eye(2, dtype=dtype)
        solve_lap(eye, duals=solve_lap(eye)[1])
    return time.perf_counter() - start


def _solve_warm(
    kernels: ModuleType, c: np.ndarray, maximize: bool, duals: LapDuals
) -> tuple[Tensor, LapDuals]:
    """A solve by :mod:`lmckit._warm_jv` from ``duals`` (a cold solve's are the reduction
    duals): what the ``lapjv`` path of :func:`solve_lap` does from the same duals — reduced
    costs, rows lowered to feasibility, the grid — in two passes of one kernel, then
    Jonker–Volgenant started from the earlier assignment's still-tight pairs, and the
    certificate."""
    n = c.shape[0]
    reduced = np.empty((n, n))
    shift, row_min, quantum, finite = kernels.reduce_on_grid(
        c, maximize, duals.u, duals.v, GRID_BITS, reduced
    )
    if not finite or not math.isfinite(quantum):
        _raise_non_finite(c, duals)
    u = duals.u + shift
    previous = duals.assignment
    if previous is None or previous.shape != (n,):
        previous = np.empty(0, dtype=np.int64)
    perm, du, dv = kernels.warm_jv(reduced, row_min, previous.astype(np.int64, copy=False))
    if not kernels.certified(reduced, perm, du, dv, _tolerance(quantum, n)):
        return _fallback(c, maximize, LapDuals(u, duals.v))  # never seen; do not trust it
    return torch.from_numpy(perm), LapDuals(u + du, duals.v + dv, assignment=perm)


def cost_array(cost: Tensor | np.ndarray) -> np.ndarray:
    """``cost`` as a CPU float32 or float64 NumPy array — a view, no copy, where it already
    is one (other dtypes become float64) — checked square and non-empty; finiteness is
    left to the solver's own passes. What :func:`solve_lap` reads."""
    if isinstance(cost, Tensor):
        cost = cost.detach()
        if cost.dtype not in (torch.float32, torch.float64):
            cost = cost.to(torch.float64)
        cost = cost.cpu().numpy()
    c = np.asarray(cost)
    if c.dtype not in (np.float32, np.float64):
        c = c.astype(np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] == 0:
        raise LapError(f"cost matrix must be square and non-empty, got shape {c.shape}")
    return c


def _check_entries(c: np.ndarray) -> None:
    """Raise if ``c`` has a NaN or infinite entry (one pass: such an entry makes its row's
    sum non-finite; a row sum that merely overflows is told apart by the exact count)."""
    if not np.isfinite(c.sum(axis=1)).all():
        _raise_if_non_finite(c)


def _raise_if_non_finite(c: np.ndarray) -> None:
    bad = int((~np.isfinite(c)).sum())
    if bad:
        raise LapError(f"cost matrix has {bad} non-finite entries (NaN or ±inf)")


def _raise_non_finite(c: np.ndarray, duals: LapDuals) -> None:
    """The reduced costs ``c − u − v`` came out non-finite: name the culprit."""
    _raise_if_non_finite(c)
    if not (np.isfinite(duals.u).all() and np.isfinite(duals.v).all()):
        raise LapError("warm-start duals have non-finite entries (NaN or ±inf)")
    raise LapError("reduced costs overflow float64: cost or duals too large in magnitude")


GRID_BITS = 36
"""Reduced costs are rounded to multiples of ``2^⌈log2 max|C'|⌉ · 2^−GRID_BITS`` (about
1.5e-11 to 3e-11 of the largest entry) before Jonker–Volgenant sees them; see
:func:`_on_grid`."""


def _on_grid(reduced: np.ndarray) -> float:
    """Round ``reduced`` (non-negative) in place to a power-of-two grid ~2e-11 of its
    largest entry; returns the grid step (0 for an all-zero matrix; the maximum itself,
    untouched, if it is not finite).

    Jonker–Volgenant's augmenting row reduction lowers a column's price by the gap between
    a row's two smallest reduced costs; on raw float64 costs that gap can be a few ulps, and
    ``lapjv`` then loops for hours (measured: a 128×128 weight-matching gain of two trained
    MLPs, warm-started, never returned; rounded to a power-of-two grid of 2^−30 … 2^−36 of
    its largest entry it is solved in 0.4 ms, to the non-dyadic step 1e-12 in 0.8 s). On
    the grid every gap is 0 or at least one step. The returned assignment is optimal for
    the rounded costs, so it is within ``n × step`` of optimal for the exact ones — ~3e-11
    relative per row, far below what float32 weights resolve.
    """
    scale = float(reduced.max())
    if scale == 0.0 or not math.isfinite(scale):
        return scale  # 0: nothing to round; ±inf/NaN: the caller reports it
    quantum = 2.0 ** (math.ceil(math.log2(scale)) - GRID_BITS)
    # Adding 1.5 · 2^52 steps puts every entry (all below 2^GRID_BITS steps) where float64's
    # spacing is exactly one step, so the sum is rounded to the grid (ties to even, as
    # np.rint); subtracting it again is exact. Two passes instead of scale, rint, unscale.
    magic = 1.5 * 2.0**52 * quantum
    if math.isfinite(magic):
        reduced += magic
        reduced -= magic
    else:  # scales near float64's largest: scale by a power of two, round, scale back
        reduced *= 1.0 / quantum
        np.rint(reduced, out=reduced)
        reduced *= quantum
    return quantum


def _tolerance(quantum: float, n: int) -> float:
    """How far a certificate's reduced costs may stray from feasibility and tightness:
    ``reduced`` is ≥ 0 with its largest entry below ``2^GRID_BITS`` grid steps."""
    return 1e-9 * max(quantum * 2.0**GRID_BITS, 1e-300) * n


def _certified(reduced: np.ndarray, perm: np.ndarray, du, dv, quantum: float) -> bool:
    """Whether ``perm`` is a permutation and ``(du, dv)`` prove it optimal for ``reduced``:
    dual feasible (``reduced − du − dv ≥ 0``) and tight on the assignment, up to rounding."""
    n = len(perm)
    if perm.min() < 0 or np.bincount(perm, minlength=n).max() != 1:
        return False
    tol = _tolerance(quantum, n)
    lowest = min(  # min over (reduced − du − dv), by row blocks (no n × n temporary)
        float(
            (
                np.subtract(reduced[i : i + ROW_BLOCK], dv[None, :]).min(axis=1)
                - du[i : i + ROW_BLOCK]
            ).min()
        )
        for i in range(0, n, ROW_BLOCK)
    )
    tight = reduced[np.arange(n), perm] - du - dv[perm]
    return bool(lowest >= -tol and np.abs(tight).max() <= tol)


def assign_heads(
    gains: Mapping[str, Tensor | np.ndarray],
    heads: int,
    pinned: Collection[str] = (),
    shared: Collection[str] = (),
) -> dict[str, Tensor]:
    """The best head-structured assignment of groups that share one permutation of heads
    (Verma & Elbayad 2024, "Merging Text Transformer Models from Different Initializations").

    Maximises ``Σ_g Σ_u gains[g][u, p_g[u]]`` over index vectors ``p_g[i·d + s] = π(i)·d_g +
    σ_{g,i}(s)`` with one head permutation ``π`` for all groups and their own inner
    permutations ``σ_{g,i}`` (see :class:`~lmckit.perm.PermutationSpec`'s ``heads``). The
    problem separates exactly: for every pair of heads ``(i, j)`` and group ``g`` the best
    ``σ`` is the LAP of the ``d_g × d_g`` block ``gains[g][i, j]``; the head permutation is
    then the LAP of the ``h × h`` sums of those optima. ``h² · |groups|`` small LAPs and one
    of size ``h``: exact, not a heuristic. A ``pinned`` group keeps ``σ`` the identity (its
    gain for a pair of heads is the trace of their block).

    Args:
        gains: group -> ``(h·d_g, h·d_g)`` gain matrix (rows: A's units, columns: B's).
        heads: ``h``, the number of heads (dividing every group's size).
        pinned: the groups whose heads move whole (``PermutationSpec.pinned``).
        shared: groups whose gains are one ``(d_g, d_g)`` block, the same for every pair of
            heads (a mixture's hidden units read from an activation that holds whichever
            expert each token chose): one LAP gives every pair's ``σ``, and no
            ``(h·d_g)²`` matrix is formed.

    Returns:
        group -> CPU ``LongTensor`` index vector.

    Raises:
        LapError: a matrix that is not square, not finite, or not divisible into ``h`` heads.
    """
    totals = np.zeros((heads, heads))
    inner: dict[str, np.ndarray] = {}
    for g, cost in gains.items():
        c = _as_cost(cost)
        if g in shared:  # one block for every pair of heads
            if c.ndim != 2 or c.shape[0] != c.shape[1]:
                raise LapError(f"group {g!r}: a shared block must be square, got {c.shape}")
            rows, cols = linear_sum_assignment(c, maximize=True)
            inner[g] = np.broadcast_to(cols, (heads, heads, len(cols)))
            totals += c[rows, cols].sum()
            continue
        n = c.shape[0]
        if n % heads:
            raise LapError(f"group {g!r}: {n} units do not split into {heads} heads")
        d = n // heads
        blocks = c.reshape(heads, d, heads, d).transpose(0, 2, 1, 3)  # [i, j] = head i vs j
        best = np.empty((heads, heads, d), dtype=np.int64)
        if g in pinned:
            best[:] = np.arange(d)
            totals += np.trace(blocks, axis1=2, axis2=3)
            inner[g] = best
            continue
        for i in range(heads):
            for j in range(heads):
                rows, cols = linear_sum_assignment(blocks[i, j], maximize=True)
                best[i, j] = cols
                totals[i, j] += blocks[i, j][rows, cols].sum()
        inner[g] = best
    _, outer = linear_sum_assignment(totals, maximize=True)
    out = {}
    for g, best in inner.items():
        d = best.shape[2]
        chosen = best[np.arange(heads), outer]  # (h, d): σ_i for the head placed at i
        out[g] = torch.from_numpy((outer[:, None] * d + chosen).reshape(-1).astype(np.int64))
    return out


def assign_groups(
    gains: Mapping[str, Tensor | np.ndarray],
    heads: Mapping[str, tuple[str, int]] | None = None,
    pinned: Collection[str] = (),
    shared: Collection[str] = (),
) -> dict[str, Tensor]:
    """One cold assignment per group (:func:`assign`, maximising), except that groups tied
    by a head permutation (``heads`` as in :class:`~lmckit.perm.PermutationSpec`) are
    solved together by :func:`assign_heads` — the projection every method that rounds
    per-group scores to a permutation needs. Only the tie members present in ``gains``
    are solved (a tie split across two calls would not share its heads: pass whole ties);
    ``pinned`` groups move whole heads and ``shared`` ones give one block for every pair
    of heads (:func:`assign_heads`)."""
    heads = heads or {}
    ties: dict[str, list[str]] = {}
    out: dict[str, Tensor] = {}
    for g, cost in gains.items():
        if g in heads:
            ties.setdefault(heads[g][0], []).append(g)
        else:
            out[g] = assign(cost, maximize=True)
    for members in ties.values():
        out.update(
            assign_heads({g: gains[g] for g in members}, heads[members[0]][1], pinned, shared)
        )
    return {g: out[g] for g in gains}
