"""The weight-matching engine: reuse across calls, profiling that measures without changing."""

import torch

from lmckit.match import ProfiledWeightMatcher, WeightMatcher, weight_matching
from lmckit.models import build_model, permutation_spec
from lmckit.perm import group_cost_matrix
from tests.match.test_weight import double
from tests.zoo import random_pair


def test_reuse_across_calls_agrees_with_fresh_calls():
    torch.manual_seed(0)
    models = [build_model("resnet20", width_multiplier=0.5, in_channels=1) for _ in range(4)]
    spec = permutation_spec(models[0])
    b = models[0].state_dict()
    matcher = WeightMatcher(spec, b)
    previous = None
    for m in models[1:] + models[1:2]:  # revisit a model after the caches have moved on
        a = m.state_dict()
        reused = matcher.match(a, init=previous)
        fresh = weight_matching(spec, a, b, init=previous)
        assert reused.perm == fresh.perm and reused.history == fresh.history
        previous = reused.perm


def test_profiling_counts_the_products_it_forms_and_changes_nothing():
    torch.manual_seed(0)
    hidden = [32, 24, 16]
    a_model, b_model = (build_model("mlp", in_dim=20, hidden=hidden, out_dim=5) for _ in range(2))
    spec = permutation_spec(a_model)
    a, b = a_model.state_dict(), b_model.state_dict()
    solved = []

    class Recording(ProfiledWeightMatcher):
        def products(self, group, a2, perm):
            solved.append(group)
            return super().products(group, a2, perm)

    plain = WeightMatcher(spec, b).match(a, seed=3)
    profiled = Recording(spec, b).match(a, seed=3)
    assert profiled.perm == plain.perm and profiled.history == plain.history
    assert len(solved) == profiled.info["lap_solves"] > 0
    # forming C_g costs 2·n·numel(A's tensor) FLOPs per tensor on the group's axes
    per_group = {
        g: sum(2 * n * a[name].numel() for name, _ in spec.group_axes(g))
        for g, n in spec.groups.items()
    }
    assert profiled.info["gemm_flops"] == sum(per_group[g] for g in solved)
    assert profiled.info["gemm_seconds"] > 0 and profiled.info["lap_seconds"] > 0
    assert "gemm_flops" not in plain.info


def test_warm_duals_are_kept_optimal_and_handed_to_the_next_solve():
    _, spec, a, b = random_pair("mlp", {"in_dim": 20, "hidden": [24, 16, 12], "out_dim": 5})
    a, b = double(a), double(b)
    result = weight_matching(spec, a, b, seed=1)
    assert set(result.duals) == set(spec.groups)
    for g, duals in result.duals.items():
        # the duals of each group's last solve are optimal for its final cost matrix
        cost = group_cost_matrix(spec, a, b, result.perm, g).numpy()
        reduced = -cost - duals.u[:, None] - duals.v[None, :]
        assert reduced.min() >= -1e-9
        assert abs(reduced[range(len(duals.u)), result.perm[g].numpy()]).max() <= 1e-9
    received = {}

    class Recording(WeightMatcher):
        def solve(self, gains, duals):
            received.setdefault(len(received), duals)
            return super().solve(gains, duals)

    resumed = Recording(spec, b).match(a, init=result.perm, duals=result.duals, seed=2)
    assert resumed.perm == result.perm and resumed.iterations == 1
    assert all(any(d is given for given in result.duals.values()) for d in received.values())
    cold = WeightMatcher(spec, b).match(a, seed=1, warm_start=False)
    assert cold.duals is None and cold.perm == result.perm
