"""The weight-matching engine: reuse across calls, profiling that measures without changing."""

import pytest
import torch

from lmckit.match import ProfiledWeightMatcher, WeightMatcher, weight_matching
from lmckit.match.weight import weight_matching_reference
from lmckit.match.weight_matcher import DeltaPolicy
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation, group_cost_matrix, group_rows
from lmckit.tracing import trace
from tests.match.test_weight import double
from tests.zoo import SMALL_ZOO, SMALL_ZOO_IDS, nontrivial, random_pair


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
        def cost(self, group, a2, perm):
            solved.append(group)
            return super().cost(group, a2, perm)

    plain = WeightMatcher(spec, b).match(a, seed=3)
    profiled = Recording(spec, b).match(a, seed=3)
    assert profiled.perm == plain.perm and profiled.history == plain.history
    assert len(solved) == profiled.info["lap_solves"] > 0
    # forming C_g costs 2·n·numel(A's tensor) FLOPs per tensor on the group's axes
    per_group = {
        g: sum(2 * n * a[name].numel() for name, _ in spec.group_axes(g))
        for g, n in spec.groups.items()
    }
    assert profiled.info["full_recompute_flops"] == sum(per_group[g] for g in solved)
    assert profiled.info["gemm_flops"] < profiled.info["full_recompute_flops"]
    assert profiled.info["gemm_seconds"] > 0 and profiled.info["lap_seconds"] > 0
    assert "gemm_flops" not in plain.info
    # without updates every requested term is formed in full
    solved.clear()
    full = Recording(spec, b, delta=None).match(a, seed=3)
    assert full.info["gemm_flops"] == full.info["full_recompute_flops"]
    assert full.info["gemm_flops"] == sum(per_group[g] for g in solved)


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


def near_pair(model, spec, noise=0.3, seed=0):
    """A and a noisy, permuted copy of it as B, in float64: WM then runs several sweeps,
    the late ones moving few units — where updated products differ from re-formed ones."""
    g = torch.Generator().manual_seed(seed)
    a = double({k: v.detach().clone() for k, v in model.state_dict().items()})
    b = Permutation.random(spec, seed).apply(a)
    b = {
        k: v + noise * v.std() * torch.randn(v.shape, generator=g, dtype=v.dtype)
        if v.is_floating_point() and v.numel() > 1
        else v
        for k, v in b.items()
    }
    return a, b


def traced_models():
    from tests.tracing.test_trace import DigitsSums

    torch.manual_seed(0)
    transformer = build_model("transformer", in_dim=8, length=8, dim=12, depth=2, heads=3)
    return [
        (nontrivial(DigitsSums()), torch.randn(4, 1, 8, 8)),
        (nontrivial(transformer), torch.randn(2, 8, 8)),
    ]


@pytest.mark.parametrize(("name", "config", "shape"), SMALL_ZOO, ids=SMALL_ZOO_IDS)
def test_updated_cost_matrices_choose_what_re_formed_ones_choose_on_the_zoo(name, config, shape):
    """float64: the same permutations and objectives (to rounding) as forming every term
    anew, with fewer multiply-adds."""
    torch.manual_seed(0)
    model = nontrivial(build_model(name, **config))
    assert_updates_choose_as_re_forming(model, permutation_spec(model), seed=1)


@pytest.mark.parametrize("index", [0, 1], ids=["direct sums and BN", "heads"])
def test_updated_cost_matrices_choose_what_re_formed_ones_choose_on_traced_specs(index):
    # groups of 2–7 units, whose neighbours move most columns at once: updates are forced
    # (the default policy would re-form them, which is cheaper there)
    model, x = traced_models()[index]
    policy = DeltaPolicy(max_fraction=1.0)
    assert_updates_choose_as_re_forming(model, trace(model, x), seed=2, policy=policy)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("mlp", {"in_dim": 20, "hidden": [24, 16, 12, 10], "out_dim": 5}),
        ("resnet20", {"width_multiplier": 0.5, "in_channels": 1}),
        ("transformer", {"in_dim": 8, "length": 8, "dim": 12, "depth": 2, "heads": 3}),
    ],
)
def test_forming_the_next_units_matrices_ahead_changes_nothing(name, config):
    """The overlap (the next unit's products formed while this LAP runs in a thread, where
    this solve cannot change them): every solve, skip, objective and permutation as without
    it, and matrices really formed ahead."""
    torch.manual_seed(0)
    model = nontrivial(build_model(name, **config))
    spec = permutation_spec(model)
    a, b = near_pair(model, spec)
    for seed in range(3):
        ahead = WeightMatcher(spec, b, overlap=True).match(a, seed=seed)
        plain = WeightMatcher(spec, b, overlap=False).match(a, seed=seed)
        assert ahead.perm == plain.perm and ahead.history == plain.history
        assert ahead.info["lap_solves"] == plain.info["lap_solves"]
        assert ahead.info["skipped_solves"] == plain.info["skipped_solves"]
        assert ahead.info["formed_ahead"] > 0 and plain.info["formed_ahead"] == 0
    # on by default, on a CPU too
    assert WeightMatcher(spec, b).match(a).info["formed_ahead"] > 0


def test_on_a_gpu_only_costly_matrices_are_updated():
    """An update's fixed costs on a GPU (a host synchronisation, small kernels) exceed
    forming a small matrix again; on a CPU every kept matrix is worth updating."""
    policy = DeltaPolicy(gpu_min_flops=1e11)
    assert policy.updates_pay(10, on_gpu=False) and policy.updates_pay(10**13, on_gpu=False)
    assert not policy.updates_pay(2 * 2048 * 2 * 2048 * 2048, on_gpu=True)  # 3×2048 hidden
    assert policy.updates_pay(2 * 8192 * 2 * 8192 * 8192, on_gpu=True)  # 3×8192 hidden


def assert_updates_choose_as_re_forming(model, spec, seed, policy=None):
    a, b = near_pair(model, spec)
    policy = DeltaPolicy() if policy is None else policy
    updated = ProfiledWeightMatcher(spec, b, delta=policy).match(a, seed=seed)
    formed = ProfiledWeightMatcher(spec, b, delta=None).match(a, seed=seed)
    assert updated.perm == formed.perm
    assert updated.history == pytest.approx(formed.history, rel=1e-12)
    assert updated.info["gemm_flops"] < formed.info["gemm_flops"]


@pytest.mark.parametrize("which", ["resnet20", "direct sums and BN", "heads"])
def test_an_updated_term_equals_the_naive_cost_matrix_after_many_moves(which):
    """Random walks of the permutations (a few units swapped per step, then a full
    reshuffle): every group's summed terms equal group_cost_matrix, formed from scratch."""
    if which == "resnet20":
        torch.manual_seed(0)
        model = nontrivial(build_model("resnet20", width_multiplier=0.5, in_channels=1))
        spec = permutation_spec(model)
    else:
        model, x = traced_models()[0 if which == "direct sums and BN" else 1]
        spec = trace(model, x)
    a, b = near_pair(model, spec)
    matcher = WeightMatcher(spec, b, delta=DeltaPolicy(max_fraction=1.0, refresh=10**6))
    a2 = {
        (g, t.name, t.axis): group_rows(spec, t.name, t.axis, g, a[t.name])
        for g in matcher.groups
        for t in matcher.terms[g]
    }
    g_rng = torch.Generator().manual_seed(5)
    current = Permutation.identity(spec)
    updates = 0
    for step in range(12):
        if step == 8:
            current = Permutation.random(spec, g_rng)
        else:
            moved = {}
            for g, n in spec.groups.items():
                p = current[g].clone()
                if g not in spec.heads and n > 1:
                    i, j = torch.randperm(n, generator=g_rng)[:2].tolist()
                    p[[i, j]] = p[[j, i]]
                moved[g] = p
            current = current.replace(**moved)
        perm = dict(current.items())
        for g in matcher.groups:
            got = matcher.cost(g, a2, perm)
            updates += sum(
                0 < t.flops < 2 * spec.groups[g] * t.b_moved.numel() for t in matcher.terms[g]
            )
            want = group_cost_matrix(
                spec, a, b, current, g, names={t.name for t in matcher.terms[g]}
            )
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), g
    assert updates > 0


@pytest.mark.parametrize("inside_blocks", [True, False], ids=["head-repeats", "blocks"])
def test_blocked_input_axes_are_kept_as_views_and_choose_as_the_reference(inside_blocks):
    """A Llama's output projections carry each key/value head's value dimensions on the
    input axis once per query head of the group (a head repeat; traced without the insides
    of blocks, the key/value groups in blocks): their (n, -1) rows would be copies kept for
    the whole match (0.74 GB of a 1.1 B Llama's), so the engine keeps (h, d, r, -1) views
    (or (n, block, -1) ones) — and forms and updates through them exactly what the
    reference computes."""
    T = pytest.importorskip("transformers", reason="a dev dependency")
    config = T.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=100,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(config).double()
    spec = trace(model, torch.randint(0, 100, (2, 8)), inside_blocks=inside_blocks)
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    b = {k: v.detach() for k, v in T.LlamaForCausalLM(config).double().state_dict().items()}
    matcher = WeightMatcher(spec, b)
    viewed = [t for g in matcher.groups for t in matcher.terms[g] if t.b_rows.dim() > 2]
    assert {t.b_rows.dim() for t in viewed} == ({4} if inside_blocks else {3})
    # with head repeats the query rows too (each key/value head's dimensions once per query
    # head: pinned rotary dimensions), and the output projection's columns
    projections = {"o_proj", "q_proj"} if inside_blocks else {"o_proj"}
    assert len(viewed) == 3 * len(projections)
    assert {t.name.split(".")[-2] for t in viewed} == projections
    assert all(t.b_rows.data_ptr() == b[t.name].data_ptr() for t in viewed)  # no copies
    for seed in range(3):
        engine = weight_matching(spec, a, b, seed=seed)
        assert engine.perm == weight_matching_reference(spec, a, b, seed=seed)
