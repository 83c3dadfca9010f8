"""Permutation core: conventions, algebra, serialisation, validation, cost matrices."""

import json
import math

import pytest
import torch

from lmckit import ParamsError, Permutation, PermutationError, PermutationSpec, SpecError
from lmckit.perm import check_params_compatible, group_cost_matrix, params_distance, params_inner


def tiny_spec() -> PermutationSpec:
    # 5 → 4 → 3 → 2 MLP with a BatchNorm on the first hidden layer
    return PermutationSpec(
        groups={"h0": 4, "h1": 3},
        axes={
            "l0.weight": ("h0", None),
            "l0.bias": ("h0",),
            "bn.weight": ("h0",),
            "bn.bias": ("h0",),
            "bn.running_mean": ("h0",),
            "bn.running_var": ("h0",),
            "bn.num_batches_tracked": (),
            "l1.weight": ("h1", "h0"),
            "l1.bias": ("h1",),
            "l2.weight": (None, "h1"),
            "l2.bias": (None,),
        },
    )


def tiny_params(seed: int = 0, dtype=torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "l0.weight": (4, 5),
        "l0.bias": (4,),
        "bn.weight": (4,),
        "bn.bias": (4,),
        "bn.running_mean": (4,),
        "bn.running_var": (4,),
        "l1.weight": (3, 4),
        "l1.bias": (3,),
        "l2.weight": (2, 3),
        "l2.bias": (2,),
    }
    params = {k: torch.randn(s, generator=g, dtype=dtype) for k, s in shapes.items()}
    params["bn.num_batches_tracked"] = torch.tensor(7)
    return params


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
    with pytest.raises(PermutationError, match="not lists of integers"):
        Permutation.from_dict({"h0": None, "h1": [0, 1, 2]}, spec)


def test_log10_num_symmetries_matches_git_rebasin_table_1():
    spec = PermutationSpec(
        groups={f"h{i}": 512 for i in range(3)},
        axes={"a": ("h0", None), "b": ("h1", "h0"), "c": ("h2", "h1"), "d": (None, "h2")},
    )
    assert round(spec.log10_num_symmetries(), 2) == 3499.62
    assert spec.log10_num_symmetries() == pytest.approx(3 * math.log10(math.factorial(512)))


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


def test_distance_and_inner_product_are_consistent():
    a, b = tiny_params(1), tiny_params(2)
    d2 = params_distance(a, b) ** 2
    assert d2 == pytest.approx(params_inner(a, a) + params_inner(b, b) - 2 * params_inner(a, b))
    assert params_distance(a, a) == 0.0
    # integer buffers do not count
    c = dict(a, **{"bn.num_batches_tracked": torch.tensor(99)})
    assert params_distance(a, c) == 0.0


def test_check_params_compatible_names_the_problem():
    a = tiny_params()
    with pytest.raises(ParamsError, match="only in A"):
        check_params_compatible(a, {k: v for k, v in a.items() if k != "l0.bias"})
    with pytest.raises(ParamsError, match=r"'l0.bias' has shape \(4,\) in A but \(5,\) in B"):
        check_params_compatible(a, dict(a, **{"l0.bias": torch.zeros(5, dtype=torch.float64)}))
    with pytest.raises(ParamsError, match="dtype"):
        check_params_compatible(a, dict(a, **{"l0.bias": torch.zeros(4, dtype=torch.float32)}))
