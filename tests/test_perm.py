"""Permutation core: conventions, algebra, serialisation, validation, cost matrices."""

import json
import math

import pytest
import torch

from lmckit import Permutation, PermutationError, PermutationSpec, SpecError
from lmckit.params import params_inner
from lmckit.perm import group_cost_matrix
from tests.zoo import tiny_params, tiny_spec


def test_convention_aligned_i_is_b_at_p_i():
    spec = tiny_spec()
    b = tiny_params()
    p = Permutation(spec, {"h0": torch.tensor([2, 0, 3, 1]), "h1": torch.tensor([1, 2, 0])})
    out = p.apply(b)
    for i in range(4):
        assert torch.equal(out["l0.weight"][i], b["l0.weight"][p["h0"][i]])
        assert out["bn.running_var"][i] == b["bn.running_var"][p["h0"][i]]
        # l1.weight: rows by h1, columns by h0
        for j in range(3):
            assert out["l1.weight"][j, i] == b["l1.weight"][p["h1"][j], p["h0"][i]]
    assert torch.equal(out["l2.bias"], b["l2.bias"])
    assert out["bn.num_batches_tracked"] == 7


def test_apply_returns_new_tensors_and_leaves_input_untouched():
    spec = tiny_spec()
    b = tiny_params()
    before = {k: v.clone() for k, v in b.items()}
    out = Permutation.identity(spec).apply(b)
    for k in b:
        assert torch.equal(out[k], b[k])
        out[k].add_(1)  # must not write through to the input
        assert torch.equal(b[k], before[k])
    Permutation.random(spec, 3).apply(b)
    assert all(torch.equal(b[k], before[k]) for k in b)


def test_inverse_undoes_apply():
    spec = tiny_spec()
    b = tiny_params()
    p = Permutation.random(spec, 1)
    assert not p.is_identity()
    back = p.inverse().apply(p.apply(b))
    assert all(torch.equal(back[k], b[k]) for k in b)
    assert p.compose(p.inverse()) == Permutation.identity(spec)
    assert p.inverse().compose(p) == Permutation.identity(spec)


def test_compose_is_associative_and_matches_sequential_application():
    spec = tiny_spec()
    b = tiny_params()
    p, q, r = (Permutation.random(spec, s) for s in (1, 2, 3))
    assert p.compose(q).compose(r) == p.compose(q.compose(r))
    seq = p.apply(q.apply(b))
    comp = p.compose(q).apply(b)
    assert all(torch.equal(seq[k], comp[k]) for k in b)
    # order matters: p∘q ≠ q∘p for these draws
    assert p.compose(q) != q.compose(p)


def test_random_is_seeded_and_serialises_through_json():
    spec = tiny_spec()
    assert Permutation.random(spec, 5) == Permutation.random(spec, 5)
    assert Permutation.random(spec, torch.Generator().manual_seed(9)) == Permutation.random(spec, 9)
    p = Permutation.random(spec, 5)
    data = json.loads(json.dumps(p.to_dict()))
    assert Permutation.from_dict(data, spec) == p
    assert data["h0"] == p["h0"].tolist()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.pop("l1.bias"), r"missing parameter\(s\) \['l1.bias'\]"),
        (
            lambda p: p.update({"l3.weight": torch.zeros(2)}),
            r"unknown parameter\(s\) \['l3.weight'\]",
        ),
        (lambda p: p.update({"l0.bias": torch.zeros(4, 1)}), r"'l0.bias'\] has 2 axes .* lists 1"),
        (
            lambda p: p.update({"l1.weight": torch.zeros(3, 5)}),
            r"'l1.weight'\] axis 1 has length 5 but group 'h0' has size 4",
        ),
    ],
)
def test_validate_rejects_params_that_do_not_fit(edit, message):
    params = tiny_params()
    edit(params)
    with pytest.raises(SpecError, match=message):
        tiny_spec().validate(params)
    with pytest.raises(SpecError, match=message):
        Permutation.identity(tiny_spec()).apply(params)


def test_spec_construction_errors():
    with pytest.raises(SpecError, match=r"'w' uses group 'g' twice \(axes 0 and 1\)"):
        PermutationSpec(groups={"g": 3}, axes={"w": ("g", "g")})
    # declared self-maps (a residual stream mapped onto itself) are allowed
    PermutationSpec(groups={"g": 3}, axes={"w": ("g", "g")}, self_maps={"w"})
    with pytest.raises(SpecError, match=r"names group 'h9', which is not declared"):
        PermutationSpec(groups={"g": 3}, axes={"w": ("g", "h9")})
    with pytest.raises(SpecError, match=r"groups \['unused'\] act on no axis"):
        PermutationSpec(groups={"g": 3, "unused": 2}, axes={"w": ("g", None)})
    with pytest.raises(SpecError, match="size 0"):
        PermutationSpec(groups={"g": 0}, axes={"w": ("g",)})
    with pytest.raises(SpecError, match="self_maps names unknown"):
        PermutationSpec(groups={"g": 3}, axes={"w": ("g",)}, self_maps={"v"})


def test_permutation_construction_errors():
    spec = tiny_spec()
    good = {"h0": torch.arange(4), "h1": torch.arange(3)}
    with pytest.raises(PermutationError, match=r"missing \['h1'\]"):
        Permutation(spec, {"h0": torch.arange(4)})
    with pytest.raises(PermutationError, match="length 4"):
        Permutation(spec, {**good, "h0": torch.arange(5)})
    with pytest.raises(PermutationError, match="not a permutation"):
        Permutation(spec, {**good, "h0": torch.tensor([0, 0, 1, 2])})
    with pytest.raises(PermutationError, match="not integer"):
        Permutation(spec, {**good, "h0": torch.arange(4.0)})
    with pytest.raises(PermutationError, match="expected a list of integers"):
        Permutation.from_dict({"h0": None, "h1": [0, 1, 2]}, spec)
    # a file of floats or booleans is not a permutation, even where truncation would be one
    for values in ([0.0, 1.0, 2.0, 3.0], [0, 1, 2.7, 3], [True, False, 2, 3]):
        with pytest.raises(PermutationError, match="indices must be integers"):
            Permutation.from_dict({"h0": values, "h1": [0, 1, 2]}, spec)
    perm = Permutation.from_dict({"h0": [3, 2, 1, 0], "h1": [0, 1, 2]}, spec)
    assert perm["h0"].tolist() == [3, 2, 1, 0]


def test_log10_num_symmetries_matches_git_rebasin_table_1():
    spec = PermutationSpec(
        groups={f"h{i}": 512 for i in range(3)},
        axes={"a": ("h0", None), "b": ("h1", "h0"), "c": ("h2", "h1"), "d": (None, "h2")},
    )
    assert round(spec.log10_num_symmetries(), 2) == 3499.62
    assert spec.log10_num_symmetries() == pytest.approx(3 * math.log10(math.factorial(512)))


def test_log10_num_symmetries_counts_the_permutations_a_head_spec_admits():
    """Brute force: every tuple of index vectors the spec accepts, counted. Two groups share
    the permutation of 2 heads, one of them pinned (rotary query/key), beside a plain group:
    2! · (2!)² · 3! = 48, not (4!)² · 3! as a count that ignores the heads would say."""
    import itertools

    spec = PermutationSpec(
        groups={"qk": 4, "vo": 4, "mlp": 3},
        axes={"q": ("qk", None), "v": ("vo", None), "o": ("mlp", "vo"), "d": (None, "mlp")},
        heads={"qk": ("t", 2), "vo": ("t", 2)},
        pinned=frozenset({"qk"}),
    )
    valid = 0
    for qk, vo, mlp in itertools.product(
        itertools.permutations(range(4)), itertools.permutations(range(4)),
        itertools.permutations(range(3)),
    ):  # fmt: skip
        try:
            Permutation(spec, {"qk": torch.tensor(qk), "vo": torch.tensor(vo),
                               "mlp": torch.tensor(mlp)})  # fmt: skip
        except PermutationError:
            continue
        valid += 1
    assert valid == 48
    assert spec.log10_num_symmetries() == pytest.approx(math.log10(valid), abs=1e-12)


@pytest.mark.parametrize("group", ["h0", "h1"])
def test_group_cost_matrix_is_the_exact_linear_part_of_the_objective(group):
    """<A, π(B)> with only `group` varying equals Σ_i C[i, p[i]] + const."""
    spec = tiny_spec()
    a, b = tiny_params(1), tiny_params(2)
    base = Permutation.random(spec, 7)
    cost = group_cost_matrix(spec, a, b, base, group)
    n = spec.groups[group]
    assert cost.shape == (n, n)
    offsets = []
    for s in range(6):
        p = torch.randperm(n, generator=torch.Generator().manual_seed(s))
        perm = base.replace(**{group: p})
        offsets.append(params_inner(a, perm.apply(b)) - cost[torch.arange(n), p].sum().item())
    assert max(offsets) - min(offsets) < 1e-9


def test_group_cost_matrix_names_selects_the_contributing_tensors():
    spec = tiny_spec()
    a, b = tiny_params(1), tiny_params(2)
    perm = Permutation.random(spec, 3)
    names = {k for k in a if not k.startswith("bn.running")}
    zeroed = {k: v if k in names else torch.zeros_like(v) for k, v in a.items()}
    assert torch.allclose(
        group_cost_matrix(spec, a, b, perm, "h0", names=names),
        group_cost_matrix(spec, zeroed, b, perm, "h0"),
    )
    assert torch.equal(
        group_cost_matrix(spec, a, b, perm, "h0", names=set()),
        torch.zeros(4, 4, dtype=a["l0.weight"].dtype),
    )


def test_distance_equals_the_distance_to_the_permuted_copy():
    from lmckit.merge.result import merge_with
    from lmckit.models import build_model, permutation_spec
    from lmckit.params import average_params, params_distance

    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=12, hidden=[10, 8], out_dim=3) for _ in range(3)]
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    perms = [Permutation.random(spec, seed) for seed in range(3)]
    for p, b in zip(perms, params, strict=True):
        assert p.distance(params[0], b) == pytest.approx(
            params_distance(params[0], p.apply(b)), rel=1e-12
        )
    # the streamed merge equals the average of the permuted copies, exactly
    naive = average_params([p.apply(b) for p, b in zip(perms, params, strict=True)])
    streamed = merge_with(params, perms)
    assert all(torch.equal(naive[k], streamed[k]) for k in naive)
