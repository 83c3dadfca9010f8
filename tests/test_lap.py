"""LAP solver: optimal for the original cost, cold and warm-started, on hard inputs."""

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lmckit.errors import LapError
from lmckit.lap import LapDuals, assign, solve_lap


def objective(c, p):
    return float(np.asarray(c)[np.arange(len(p)), np.asarray(p)].sum())


def best(c, maximize=True):
    r, col = linear_sum_assignment(c, maximize=maximize)
    return float(c[r, col].sum())


def assert_optimal(c, p, maximize=True):
    assert sorted(np.asarray(p).tolist()) == list(range(len(p)))
    ref = best(c, maximize)
    assert objective(c, p) == pytest.approx(ref, rel=1e-9, abs=1e-9 * max(1.0, abs(ref)))


def matrices():
    rng = np.random.default_rng(0)
    a = np.abs(rng.standard_normal(300)) + 1
    yield "random", rng.standard_normal((200, 200))
    yield "ties_zero", np.zeros((64, 64))
    yield "ties_int", rng.integers(0, 3, (150, 150)).astype(float)
    yield "large", rng.standard_normal((120, 120)) * 1e12
    yield "tiny", rng.standard_normal((50, 50)) * 1e-12
    yield "rank1", np.outer(a, a[::-1]) + 0.01 * rng.standard_normal((300, 300))
    yield "n1", np.array([[-3.5]])
    yield "n2", np.array([[1.0, 2.0], [3.0, 4.0]])


def assert_optimal_duals(c, p, duals, maximize=True):
    """LP duality: u_i + v_j ≤ C_min[i, j] everywhere, with equality on the assignment."""
    c_min = -c if maximize else c
    reduced = c_min - duals.u[:, None] - duals.v[None, :]
    scale = max(1.0, np.abs(c).max())
    assert reduced.min() >= -1e-9 * scale  # dual feasible
    assert np.abs(reduced[np.arange(len(p)), np.asarray(p)]).max() <= 1e-9 * scale  # slackness


@pytest.mark.parametrize(("name", "c"), list(matrices()), ids=[n for n, _ in matrices()])
@pytest.mark.parametrize("maximize", [True, False])
def test_cold_solution_is_optimal(name, c, maximize):
    p, duals = solve_lap(c, maximize=maximize)
    assert p.dtype == torch.long
    assert_optimal(c, p, maximize)
    assert_optimal_duals(c, p, duals, maximize)


@pytest.mark.parametrize(("name", "c"), list(matrices()), ids=[n for n, _ in matrices()])
def test_warm_start_is_optimal_for_the_original_cost(name, c):
    rng = np.random.default_rng(1)
    _, duals = solve_lap(c)
    for step in range(4):  # a drifting sequence of costs, as inside weight matching
        c = c + 0.05 * np.abs(c).max() * rng.standard_normal(c.shape) * (step % 2)
        p, duals = solve_lap(c, duals=duals)
        assert_optimal(c, p)
        assert_optimal_duals(c, p, duals)  # the returned duals are the original cost's
    p_stale, _ = solve_lap(c, duals=solve_lap(rng.standard_normal(c.shape))[1])
    assert_optimal(c, p_stale)  # even unrelated duals give the optimum


@pytest.fixture
def lapjv_inputs(monkeypatch):
    """The matrices ``lapjv`` is handed from now on, in call order."""
    import lmckit.lap as lap

    seen = []
    original = lap._lapjv.lapjv

    class Recorder:
        @staticmethod
        def lapjv(cost, **kwargs):
            seen.append(np.array(cost))
            return original(cost, **kwargs)

    monkeypatch.setattr(lap, "_lapjv", Recorder)
    return seen


def test_a_warm_start_solves_the_cost_reduced_by_the_given_duals(lapjv_inputs):
    """Alg. 3 of STE-MM: the solver sees C − u1ᵀ − 1vᵀ, which the given optimal duals
    leave already solved: zero on an optimal assignment, non-negative elsewhere."""
    seen = lapjv_inputs
    c = np.random.default_rng(3).standard_normal((60, 60))
    p, duals = solve_lap(c)
    again, _ = solve_lap(c, duals=duals)
    expected = -c - duals.u[:, None] - duals.v[None, :]
    assert np.allclose(seen[-1], expected)
    # feasible, and zero on the optimum up to the grid the reduced costs are rounded to
    assert seen[-1].min() >= 0 and np.abs(seen[-1][np.arange(60), p.numpy()]).max() < 1e-9
    assert torch.equal(again, p)
    solve_lap(c)  # a cold solve starts from the reduction duals instead
    assert not np.allclose(seen[-1], expected)


def test_stale_duals_are_made_feasible_by_lowering_each_rows_dual(lapjv_inputs):
    """Duals of another problem leave negative reduced costs, from which JV can be far
    slower than cold: each row's dual is lowered by its most negative entry first, so the
    solver sees C − u1ᵀ − 1vᵀ − min(row minimum, 0) — non-negative, a zero in every row
    that had a negative, the rest untouched — and the answer is still the optimum."""
    seen = lapjv_inputs
    rng = np.random.default_rng(4)
    old, new = rng.standard_normal((50, 50)), rng.standard_normal((50, 50))
    _, stale = solve_lap(old)
    p, duals = solve_lap(new, duals=stale)
    reduced = -new - stale.u[:, None] - stale.v[None, :]
    negative_rows = reduced.min(axis=1) < 0
    assert 0 < negative_rows.sum() < 50
    expected = reduced - np.minimum(reduced.min(axis=1), 0)[:, None]
    assert np.allclose(seen[-1], expected, atol=1e-9) and seen[-1].min() >= 0
    assert np.allclose(seen[-1][negative_rows].min(axis=1), 0, atol=1e-9)
    assert_optimal(new, p)
    # the returned duals are optimal for the new problem
    red = -new - duals.u[:, None] - duals.v[None, :]
    assert red.min() >= -1e-9 and np.abs(red[np.arange(50), p.numpy()]).max() < 1e-9


def test_backends_agree_and_accept_tensors():
    c = torch.randn(80, 80, dtype=torch.float32)
    p1, _ = solve_lap(c)
    p2, d2 = solve_lap(c, backend="scipy")
    assert objective(c.double().numpy(), p1) == pytest.approx(objective(c.double().numpy(), p2))
    assert not d2.exact


def test_bad_input_is_rejected():
    with pytest.raises(LapError, match="square"):
        solve_lap(np.zeros((3, 4)))
    with pytest.raises(LapError, match="square"):
        solve_lap(np.zeros((0, 0)))
    c = np.zeros((4, 4))
    c[1, 2] = np.nan
    with pytest.raises(LapError, match="1 non-finite"):
        solve_lap(c)
    c[1, 2] = np.inf
    with pytest.raises(LapError, match="non-finite"):
        solve_lap(torch.from_numpy(c))
    _, duals = solve_lap(np.zeros((5, 5)))
    with pytest.raises(LapError, match="duals have lengths"):
        solve_lap(np.zeros((4, 4)), duals=duals)
    with pytest.raises(LapError, match="backend"):
        solve_lap(np.zeros((4, 4)), backend="hungarian")


@pytest.mark.parametrize("maximize", [True, False])
def test_assign_is_optimal_by_brute_force(maximize):
    """Against every permutation, on random costs, ties and dead (all-zero) rows/columns —
    the correlation matrices of units that never fire, which is what activation matching
    hands it."""
    rng = np.random.default_rng(3)
    cases = [rng.standard_normal((6, 6)), rng.integers(0, 2, (7, 7)).astype(float)]
    dead = rng.standard_normal((7, 7))
    dead[[1, 4]] = 0.0
    dead[:, 2] = 0.0
    cases.append(dead)
    for c in cases:
        p = assign(torch.from_numpy(c), maximize=maximize)
        values = [objective(c, q) for q in itertools.permutations(range(len(c)))]
        assert p.dtype == torch.long and sorted(p.tolist()) == list(range(len(c)))
        assert objective(c, p) == pytest.approx(max(values) if maximize else min(values))


def test_assign_rejects_bad_costs():
    with pytest.raises(LapError, match="square"):
        assign(np.zeros((2, 3)))
    with pytest.raises(LapError, match="non-finite"):
        assign(np.array([[0.0, np.nan], [1.0, 2.0]]))


def test_a_matrix_that_stalled_lapjv_is_solved_optimally():
    """A warm-started 128×128 weight-matching gain of two trained MLPs on which raw lapjv
    never returned (tests/fixtures/lapjv_stall_128.npz): solved in a subprocess under a time
    limit, so that a regression fails instead of hanging the suite."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "lapjv_stall_128.npz"
    code = (
        "import numpy as np, sys\n"
        "from lmckit.lap import LapDuals, solve_lap\n"
        f"c = np.load({str(path)!r})['cost']\n"
        "p, d = solve_lap(c, maximize=False, duals=LapDuals(np.zeros(128), np.zeros(128)))\n"
        "np.save(sys.stdout.buffer, p.numpy())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    import io

    p = np.load(io.BytesIO(done.stdout))
    c = np.load(path)["cost"]
    assert_optimal(c, p, maximize=False)


def _contended_matrix(n, seed):
    """Every row prefers the same few columns (rank one plus noise), as the first sweep
    over a ResNet's convolutions produces."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0.5, 1.5, n), rng.uniform(0.0, 1.0, n) ** 4
    return np.outer(a, b) + 0.01 * rng.standard_normal((n, n))


@pytest.mark.parametrize("seed", [0, 1])
def test_duals_of_an_optimal_assignment_prove_it_optimal(seed):
    from lmckit.lap import duals_of

    rng = np.random.default_rng(seed)
    for c in (rng.standard_normal((40, 40)), -_contended_matrix(60, seed)):
        _, p = linear_sum_assignment(c)
        duals = duals_of(c, p)
        assert_optimal_duals(c, p, duals, maximize=False)
        reduced = c - duals.u[:, None] - duals.v[None, :]
        # a worse assignment has a negative cycle: its constraints never settle
        worse = p.copy()
        i, j = 0, int(np.argmax(reduced[0] > 1e-6))
        k = int(np.flatnonzero(p == j)[0])
        worse[[i, k]] = worse[[k, i]]
        assert objective(c, worse) > objective(c, p) + 1e-9
        assert duals_of(c, worse, max_passes=100) is None


def test_a_contended_cold_solve_goes_through_scipy_and_stays_optimal(monkeypatch):
    import lmckit.lap as lap

    calls = []
    original = lap.linear_sum_assignment

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lap, "linear_sum_assignment", counting)
    c = _contended_matrix(200, 3)
    p, duals = solve_lap(c)
    assert len(calls) == 1 and duals.exact
    assert_optimal(c, p)
    assert_optimal_duals(c, p, duals)
    # spread preferences (a Gaussian matrix) and warm solves stay with Jonker–Volgenant
    solve_lap(np.random.default_rng(3).standard_normal((200, 200)))
    solve_lap(c, duals=duals)
    assert len(calls) == 1


def test_float32_costs_are_read_exactly_without_a_float64_copy():
    """A float32 cost enters the float64 reduced costs exactly: the same permutations and
    bit-identical duals as the same matrix converted to float64 first, cold and warm."""
    rng = np.random.default_rng(7)
    c32 = rng.standard_normal((90, 90)).astype(np.float32)
    for maximize in (True, False):
        p32, d32 = solve_lap(c32, maximize=maximize)
        p64, d64 = solve_lap(c32.astype(np.float64), maximize=maximize)
        assert torch.equal(p32, p64)
        assert np.array_equal(d32.u, d64.u) and np.array_equal(d32.v, d64.v)
        drifted = (c32 + 0.1 * rng.standard_normal(c32.shape)).astype(np.float32)
        w32 = solve_lap(torch.from_numpy(drifted), maximize=maximize, duals=d32)
        w64 = solve_lap(drifted.astype(np.float64), maximize=maximize, duals=d64)
        assert torch.equal(w32[0], w64[0]) and np.array_equal(w32[1].u, w64[1].u)
        assert_optimal(drifted.astype(np.float64), w32[0], maximize)


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_is_named_on_the_warm_path_too(maximize, bad):
    """The warm path has no pass of its own for finiteness (the reduced costs' row minima
    and maximum show it); every kind of bad entry is still reported as such."""
    c = np.random.default_rng(8).standard_normal((30, 30))
    _, duals = solve_lap(c, maximize=maximize)
    c[4, 7] = bad
    with pytest.raises(LapError, match="1 non-finite"):
        solve_lap(c, maximize=maximize, duals=duals)
    with pytest.raises(LapError, match="1 non-finite"):
        solve_lap(c.astype(np.float32), maximize=maximize, duals=duals)

    with pytest.raises(LapError, match="1 non-finite"):  # 1×1: no grid, no solver call
        solve_lap(np.array([[bad]]), maximize=maximize, duals=LapDuals(np.zeros(1), np.zeros(1)))
    c[4, 7] = 0.0
    with pytest.raises(LapError, match="warm-start duals"):
        solve_lap(c, maximize=maximize, duals=LapDuals(duals.u, np.where(duals.v > 0, bad, 0.0)))


def test_the_grid_rounding_equals_scaling_rounding_and_scaling_back():
    """``_on_grid`` rounds by adding and subtracting 1.5·2^52 steps; the result must be
    ``rint(x / step) · step`` bit for bit — ties to even included — at every scale."""
    from lmckit.lap import _on_grid

    rng = np.random.default_rng(9)
    for scale in (1e-200, 1e-9, 1.0, 3.7e5, 1e12, 1e300, 1e307):  # the last: no magic
        x = np.abs(rng.standard_normal((40, 50))) * scale
        step = 2.0 ** (np.ceil(np.log2(x.max())) - 36)
        x[0, :6] = step * np.array([0.5, 1.5, 2.5, 7.5, 1.25, 3.0])  # ties and exact steps
        expected = np.rint(x / step) * step
        got = x.copy()
        assert _on_grid(got) == step
        assert np.array_equal(got, expected)
