"""Switches whose effect is only on the work done, never on the result: LAP duals carried
from solve to solve (STE-MM Alg. 3), the LAP backend, the threads of STE-MM's projections.
By design the results are the same whichever way a switch is set, so a test of results
cannot tell a switch that works from one that is ignored; these tests watch the calls the
switch is meant to change (what every LAP solve is handed, which solver runs)."""

from __future__ import annotations

import pytest

import lmckit.lap as lap
from lmckit.match import WeightMatcher, ste_matching, weight_matching
from lmckit.merge import ste_mm
from tests.merge.common import random_models


@pytest.fixture
def solves(monkeypatch):
    """Every LAP solve weight matching makes: the duals it was handed (None when cold)."""
    handed: list = []
    original = WeightMatcher.solve

    def recording(self, gains, duals):
        handed.append(duals)
        return original(self, gains, duals)

    monkeypatch.setattr(WeightMatcher, "solve", recording)
    return handed


def _pair():
    model, spec, params = random_models(2, hidden=(16, 16))
    return model, spec, params[0], params[1]


def test_weight_matching_hands_duals_only_when_warm(solves):
    _, spec, a, b = _pair()
    warm = weight_matching(spec, a, b, seed=1)
    handed_warm = list(solves)
    solves.clear()
    cold = WeightMatcher(spec, b).match(a, seed=1, warm_start=False)
    assert cold.perm == warm.perm
    assert solves and all(d is None for d in solves)
    # warm: the first solve of each group starts cold, every later one from kept duals
    assert handed_warm[: len(spec.groups)] == [None] * len(spec.groups)
    assert len(handed_warm) > len(spec.groups)
    assert all(d is not None for d in handed_warm[len(spec.groups) :])


@pytest.mark.parametrize("warm", [True, False])
def test_ste_hands_every_projection_the_last_duals_only_when_warm(solves, digits, warm):
    model, spec, a, b = _pair()
    batches = [(digits.train_x[i : i + 64], digits.train_y[i : i + 64]) for i in range(0, 192, 64)]
    result = ste_matching(
        spec, a, b, model=model, data=batches, epochs=1, lr=0.05, seed=1, warm_duals=warm
    )
    assert result.info["warm_duals"] is warm
    projections = 1 + len(batches) + 1  # the start, one per step, the epoch's last
    assert len(solves) >= projections * len(spec.groups)
    if warm:
        # only the very first projection's first solves start cold
        assert sum(d is None for d in solves) == len(spec.groups)
    else:
        assert all(d is None for d in solves)


@pytest.mark.parametrize("warm", [True, False])
def test_ste_mm_hands_every_projection_the_last_duals_only_when_warm(solves, digits, warm):
    model, spec, params = random_models(3, hidden=(16, 16))
    batches = [next(iter(digits.loader("train", batch_size=128)))] * 2
    result = ste_mm(
        spec, params, model=model, data=batches, epochs=1, lr=1e-2, seed=1, warm_duals=warm
    )
    assert result.info["warm_duals"] is warm
    others = len(params) - 1
    if warm:
        assert sum(d is None for d in solves) == others * len(spec.groups)
        assert len(solves) > others * len(spec.groups)
    else:
        assert solves and all(d is None for d in solves)


@pytest.mark.parametrize("backend", ["jv", "lapjv", "scipy"])
def test_the_lap_backend_asked_for_is_the_one_that_solves(monkeypatch, backend):
    """The same permutation from every backend, each solve by the backend's own solver
    (the compiled JV kernels, the ``lapjv`` package, SciPy)."""
    from types import SimpleNamespace

    _, spec, a, b = _pair()
    expected = weight_matching(spec, a, b, seed=2).perm
    reached: list[str] = []

    def spy(label, original):
        def wrapper(*args, **kwargs):
            reached.append(label)
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(lap, "_solve_warm", spy("jv", lap._solve_warm))
    monkeypatch.setattr(lap, "_fallback", spy("scipy", lap._fallback))
    if lap._lapjv is not None:
        monkeypatch.setattr(lap, "_lapjv", SimpleNamespace(lapjv=spy("lapjv", lap._lapjv.lapjv)))
    result = weight_matching(spec, a, b, seed=2, lap_backend=backend)
    assert result.perm == expected and result.info["lap_backend"] == backend
    if backend == "jv" and lap._warm_kernels() is None:
        backend = "lapjv"  # numba missing: the documented stand-in
    if backend == "lapjv" and lap._lapjv is None:
        backend = "scipy"
    assert reached and set(reached) == {backend}, reached
