"""LAP solver: optimal for the original cost, cold and warm-started, on hard inputs."""

import importlib.util
import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lmckit.errors import LapError
from lmckit.lap import LapDuals, assign, solve_lap

# lmckit's compiled solver needs numba (a dependency); where it is missing — a device machine
# without the wheel — "jv" solves through lapjv, and the tests of the kernel itself skip
needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed"
)


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


@pytest.mark.parametrize("backend", ["jv", "lapjv"])
@pytest.mark.parametrize(("name", "c"), list(matrices()), ids=[n for n, _ in matrices()])
def test_warm_start_is_optimal_for_the_original_cost(name, c, backend):
    rng = np.random.default_rng(1)
    _, duals = solve_lap(c, backend=backend)
    for step in range(4):  # a drifting sequence of costs, as inside weight matching
        c = c + 0.05 * np.abs(c).max() * rng.standard_normal(c.shape) * (step % 2)
        p, duals = solve_lap(c, duals=duals, backend=backend)
        assert_optimal(c, p)
        assert_optimal_duals(c, p, duals)  # the returned duals are the original cost's
        assert np.array_equal(duals.assignment, p.numpy())
    stale = solve_lap(rng.standard_normal(c.shape), backend=backend)[1]
    p_stale, _ = solve_lap(c, duals=stale, backend=backend)
    assert_optimal(c, p_stale)  # even unrelated duals give the optimum


def _hints(n, rng):
    """Earlier assignments a warm solve may be handed: right, wrong, or malformed."""
    yield None
    yield rng.permutation(n)
    yield np.arange(n)[::-1].copy()
    yield np.zeros(n, dtype=np.int64)  # every row claims column 0
    yield np.full(n, n + 3, dtype=np.int64)  # out of range
    yield np.arange(n + 1)  # wrong length: ignored


@pytest.mark.parametrize("maximize", [True, False])
def test_the_compiled_warm_solver_is_optimal_by_brute_force_whatever_its_hint(maximize):
    """lmckit's own Jonker–Volgenant (the default backend): against every permutation, on
    random costs, integer ties, dead rows and columns, from cold, exact and stale duals,
    with earlier assignments that are right, wrong or malformed — a hint may cost time,
    never optimality — and with duals that prove the answer."""
    rng = np.random.default_rng(11)
    cases = []
    for n in (2, 3, 5, 7):
        cases += [rng.standard_normal((n, n)), rng.integers(0, 3, (n, n)).astype(float)]
    dead = rng.standard_normal((7, 7))
    dead[[1, 4]] = 0.0
    dead[:, 2] = 0.0
    cases.append(dead)
    for c in cases:
        n = len(c)
        values = [objective(c, q) for q in itertools.permutations(range(n))]
        want = max(values) if maximize else min(values)
        exact = solve_lap(c, maximize=maximize, backend="scipy")[1]
        starts = [solve_lap(c, maximize=maximize)[1], solve_lap(-c, maximize=maximize)[1]]
        for start in [*starts, LapDuals(np.zeros(n), np.zeros(n)), exact]:
            for hint in _hints(n, rng):
                duals = LapDuals(start.u, start.v, assignment=hint)
                p, out = solve_lap(c, maximize=maximize, duals=duals)
                assert sorted(p.tolist()) == list(range(n))
                assert objective(c, p) == pytest.approx(want, abs=1e-9)
                assert_optimal_duals(c, p, out, maximize)


@needs_numba
def test_a_warm_solve_keeps_an_earlier_assignment_that_is_still_optimal():
    """Where many assignments are optimal (ties), the warm solve returns the earlier one
    handed to it — its rows are kept, not solved again — while ``lapjv``, which takes no
    assignment, settles on whichever optimum its search meets first."""
    rng = np.random.default_rng(12)
    for c in (np.zeros((40, 40)), rng.integers(0, 2, (60, 60)).astype(float)):
        n = len(c)
        p0, duals = solve_lap(c)
        # another optimum: p0 with two rows swapped where that keeps the objective
        swapped = p0.numpy().copy()
        i, k = next(
            (i, k)
            for i in range(n)
            for k in range(i + 1, n)
            if c[i, swapped[k]] + c[k, swapped[i]] == c[i, swapped[i]] + c[k, swapped[k]]
        )
        swapped[[i, k]] = swapped[[k, i]]
        hint = LapDuals(duals.u, duals.v, assignment=swapped)
        p, _ = solve_lap(c, duals=hint)
        assert np.array_equal(p.numpy(), swapped)
        p, _ = solve_lap(c, duals=hint, backend="lapjv")
        assert not np.array_equal(p.numpy(), swapped)


def _record_solver_inputs(monkeypatch, backends=("jv", "lapjv")):
    """``{backend: [...]}``: from now on, each named backend's Jonker–Volgenant records the
    reduced matrices it is handed (and the compiled kernel its row minima, under
    ``"jv_row_min"``)."""
    import types

    import lmckit.lap as lap

    seen = {b: [] for b in (*backends, "jv_row_min")}
    if "lapjv" in backends:
        original = lap._lapjv.lapjv

        def lapjv(cost, **kwargs):
            seen["lapjv"].append(np.array(cost))
            return original(cost, **kwargs)

        monkeypatch.setattr(lap, "_lapjv", types.SimpleNamespace(lapjv=lapjv))
    if "jv" in backends:
        kernels = lap._warm_kernels()

        def warm_jv(reduced, row_min, previous):
            seen["jv"].append(np.array(reduced))
            seen["jv_row_min"].append(np.array(row_min))
            return kernels.warm_jv(reduced, row_min, previous)

        recorder = types.SimpleNamespace(
            reduce_on_grid=kernels.reduce_on_grid, warm_jv=warm_jv, certified=kernels.certified
        )
        monkeypatch.setattr(lap, "_warm_kernels", lambda: recorder)
    return seen


@pytest.fixture(params=["jv", "lapjv"])
def solver_inputs(request, monkeypatch):
    """``(backend, seen)``: the reduced matrices that backend's Jonker–Volgenant is handed
    from now on, in call order."""
    if request.param == "jv" and importlib.util.find_spec("numba") is None:
        pytest.skip("numba is not installed")
    return request.param, _record_solver_inputs(monkeypatch, (request.param,))[request.param]


def test_a_warm_start_solves_the_cost_reduced_by_the_given_duals(solver_inputs):
    """Alg. 3 of STE-MM: the solver sees C − u1ᵀ − 1vᵀ, which the given optimal duals
    leave already solved: zero on an optimal assignment, non-negative elsewhere."""
    backend, seen = solver_inputs
    c = np.random.default_rng(3).standard_normal((60, 60))
    p, duals = solve_lap(c, backend=backend)
    again, _ = solve_lap(c, duals=duals, backend=backend)
    expected = -c - duals.u[:, None] - duals.v[None, :]
    assert np.allclose(seen[-1], expected)
    # feasible, and zero on the optimum up to the grid the reduced costs are rounded to
    assert seen[-1].min() >= 0 and np.abs(seen[-1][np.arange(60), p.numpy()]).max() < 1e-9
    assert torch.equal(again, p)
    solve_lap(c, backend=backend)  # a cold solve starts from the reduction duals instead
    assert not np.allclose(seen[-1], expected)


def test_stale_duals_are_made_feasible_by_lowering_each_rows_dual(solver_inputs):
    """Duals of another problem leave negative reduced costs, from which JV can be far
    slower than cold: each row's dual is lowered by its most negative entry first, so the
    solver sees C − u1ᵀ − 1vᵀ − min(row minimum, 0) — non-negative, a zero in every row
    that had a negative, the rest untouched — and the answer is still the optimum."""
    backend, seen = solver_inputs
    rng = np.random.default_rng(4)
    old, new = rng.standard_normal((50, 50)), rng.standard_normal((50, 50))
    _, stale = solve_lap(old, backend=backend)
    p, duals = solve_lap(new, duals=stale, backend=backend)
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


@pytest.mark.parametrize("backend", ["jv", "lapjv"])
def test_a_contended_cold_solve_goes_through_scipy_and_stays_optimal(monkeypatch, backend):
    import lmckit.lap as lap

    calls = []
    original = lap.linear_sum_assignment

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lap, "linear_sum_assignment", counting)
    c = _contended_matrix(200, 3)
    p, duals = solve_lap(c, backend=backend)
    assert len(calls) == 1 and duals.exact
    assert_optimal(c, p)
    assert_optimal_duals(c, p, duals)
    # spread preferences (a Gaussian matrix) and warm solves stay with Jonker–Volgenant
    solve_lap(np.random.default_rng(3).standard_normal((200, 200)), backend=backend)
    solve_lap(c, duals=duals, backend=backend)
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


@pytest.mark.parametrize("backend", ["jv", "lapjv"])
@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_is_named_on_the_warm_path_too(maximize, bad, backend):
    """The warm path has no pass of its own for finiteness (the reduced costs' row minima
    and maximum show it); every kind of bad entry is still reported as such."""
    c = np.random.default_rng(8).standard_normal((30, 30))
    _, duals = solve_lap(c, maximize=maximize, backend=backend)
    c[4, 7] = bad
    with pytest.raises(LapError, match="1 non-finite"):
        solve_lap(c, maximize=maximize, duals=duals, backend=backend)
    with pytest.raises(LapError, match="1 non-finite"):
        solve_lap(c.astype(np.float32), maximize=maximize, duals=duals, backend=backend)

    with pytest.raises(LapError, match="1 non-finite"):  # 1×1: no grid, no solver call
        one = LapDuals(np.zeros(1), np.zeros(1))
        solve_lap(np.array([[bad]]), maximize=maximize, duals=one, backend=backend)
    c[4, 7] = 0.0
    with pytest.raises(LapError, match="warm-start duals"):
        broken = LapDuals(duals.u, np.where(duals.v > 0, bad, 0.0))
        solve_lap(c, maximize=maximize, duals=broken, backend=backend)


@needs_numba
def test_both_backends_hand_their_solver_the_same_reduced_costs(monkeypatch):
    """The compiled kernel forms, lowers and rounds the reduced costs in one pass of its
    own; they must be the NumPy path's bit for bit — cold and warm, stale duals (rows
    lowered), float32 and float64 costs, both senses, and at a scale where the grid
    rounding cannot use its magic constant."""
    seen = _record_solver_inputs(monkeypatch)
    rng = np.random.default_rng(13)
    for scale in (1.0, 1e-30, 1e303):
        old, new = (rng.standard_normal((70, 70)) * scale for _ in range(2))
        for dtype in (np.float64, np.float32):
            if dtype == np.float32 and scale != 1.0:
                continue
            for maximize in (True, False):
                _, stale = solve_lap(old, maximize=maximize, backend="scipy")
                for backend in ("jv", "lapjv"):
                    solve_lap(new.astype(dtype), maximize=maximize, backend=backend)
                    solve_lap(new.astype(dtype), maximize=maximize, duals=stale, backend=backend)
    assert len(seen["jv"]) == len(seen["lapjv"]) == 16
    for reduced, row_min, expected in zip(
        seen["jv"], seen["jv_row_min"], seen["lapjv"], strict=True
    ):
        assert np.array_equal(reduced, expected)
        assert np.array_equal(row_min, expected.min(axis=1))


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


def test_without_numba_the_default_backend_solves_through_lapjv(monkeypatch):
    """numba is a dependency, but an environment without it (an old wheel, a machine
    without a compiler cache) must still solve optimally: through ``lapjv``, warm and cold."""
    import lmckit.lap as lap

    seen = _record_solver_inputs(monkeypatch, ("lapjv",))["lapjv"]
    monkeypatch.setattr(lap, "_warm_kernels", lambda: None)
    rng = np.random.default_rng(14)
    c = rng.standard_normal((40, 40))
    p, duals = solve_lap(c)
    drifted = c + 0.1 * rng.standard_normal(c.shape)
    q, again = solve_lap(drifted, duals=duals)
    assert [m.shape for m in seen] == [(40, 40), (40, 40)]
    assert_optimal(c, p)
    assert_optimal(drifted, q)
    assert_optimal_duals(drifted, q, again)


@needs_numba
def test_compile_kernels_readies_the_default_backend_for_both_dtypes():
    """``make setup`` calls it so that numba's compilation is paid at install, not inside
    the first match: afterwards every kernel has machine code for float32 and float64 costs
    (what weight matching and a user's float64 matrices hand it)."""
    import lmckit.lap as lap

    assert lap.compile_kernels() > 0.0
    kernels = lap._warm_kernels()
    costs = {str(signature[0].dtype) for signature in kernels.reduce_on_grid.signatures}
    assert {"float32", "float64"} <= costs
    assert kernels.warm_jv.signatures and kernels.certified.signatures
    rng = np.random.default_rng(15)
    for dtype in (np.float32, np.float64):
        c = rng.standard_normal((30, 30)).astype(dtype)
        p, duals = solve_lap(c)
        q, _ = solve_lap(c, duals=duals)
        assert torch.equal(p, q)
        assert_optimal(c.astype(np.float64), q)
