"""Direct-sum axes (a tuple in PermutationSpec.axes): an axis made of consecutive segments,
each moved by its own group or fixed — the input of a layer after a ``cat`` — checked
against the same tensors cut into one tensor per segment, where every axis is plain."""

import json

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.analysis.spectral import alignment
from lmckit.match import weight_matching
from lmckit.match.sinkhorn import soft_apply
from lmckit.params import params_distance
from lmckit.perm import axis_index, group_cost_matrix, group_rows, put_group_rows

A, B, FIXED, BLOCK, OUT = 3, 4, 2, 2, 5


def sum_spec() -> PermutationSpec:
    """Two branches of A and B units, concatenated with FIXED·BLOCK entries nothing moves
    between them, each unit a block of BLOCK entries, read by fc (OUT, (A+FIXED+B)·BLOCK)."""
    return PermutationSpec(
        groups={"a": A, "b": B, "out": OUT},
        axes={"a.weight": ("a", None), "b.weight": ("b", None),
              "fc.weight": ("out", ("a", FIXED * BLOCK, "b")), "head.weight": (None, "out")},
        blocks={"fc.weight": (1, BLOCK)},
    )  # fmt: skip


def sliced_spec() -> PermutationSpec:
    """The same symmetry with fc cut into one tensor per segment."""
    return PermutationSpec(
        groups={"a": A, "b": B, "out": OUT},
        axes={"a.weight": ("a", None), "b.weight": ("b", None), "fc_a": ("out", "a"),
              "fc_fixed": ("out", None), "fc_b": ("out", "b"), "head.weight": (None, "out")},
        blocks={"fc_a": (1, BLOCK), "fc_b": (1, BLOCK)},
    )  # fmt: skip


def params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(A, 6, generator=g),
        "b.weight": torch.randn(B, 6, generator=g),
        "fc.weight": torch.randn(OUT, (A + FIXED + B) * BLOCK, generator=g),
        "head.weight": torch.randn(3, OUT, generator=g),
    }


def sliced(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    fc_a, fc_fixed, fc_b = p["fc.weight"].split([A * BLOCK, FIXED * BLOCK, B * BLOCK], dim=1)
    rest = {k: v for k, v in p.items() if k != "fc.weight"}
    return {**rest, "fc_a": fc_a, "fc_fixed": fc_fixed, "fc_b": fc_b}


def test_apply_equals_permuting_each_segment_alone():
    spec, p = sum_spec(), params()
    perm = Permutation.random(spec, 3)
    out = perm.apply(p)
    expected = Permutation(sliced_spec(), dict(perm.items())).apply(sliced(p))
    assert all(torch.equal(v, expected[k]) for k, v in sliced(out).items())
    # the fixed segment's columns stay where they were (its rows move with "out")
    assert torch.equal(sliced(out)["fc_fixed"], sliced(p)["fc_fixed"][perm["out"]])
    index = axis_index(spec, "fc.weight", 1, perm)
    assert sorted(index.tolist()) == list(range((A + FIXED + B) * BLOCK))
    assert params_distance(perm.inverse().apply(out), p) == 0


def test_the_function_is_unchanged():
    """relu(a x) ⊕ fixed ⊕ tanh(b x), each unit repeated BLOCK times, through fc and head."""
    spec, p = sum_spec(), params()
    x = torch.randn(7, 6)
    fixed = torch.randn(7, FIXED)

    def f(q):
        h = torch.cat([torch.relu(x @ q["a.weight"].T), fixed, torch.tanh(x @ q["b.weight"].T)], 1)
        h = h.repeat_interleave(BLOCK, dim=1)
        return torch.relu(h @ q["fc.weight"].T) @ q["head.weight"].T

    perm = Permutation.random(spec, 5)
    assert torch.allclose(f(perm.apply(p)), f(p), atol=1e-5)


@pytest.mark.parametrize("group", ["a", "b", "out"])
def test_cost_matrix_equals_the_sliced_one(group):
    spec, pa, pb = sum_spec(), params(0), params(1)
    perm = Permutation.random(spec, 2)
    sliced_perm = Permutation(sliced_spec(), dict(perm.items()))
    got = group_cost_matrix(spec, pa, pb, perm, group)
    want = group_cost_matrix(sliced_spec(), sliced(pa), sliced(pb), sliced_perm, group)
    assert torch.allclose(got, want, atol=1e-5)


def test_weight_matching_recovers_a_planted_permutation_and_agrees_with_the_sliced_spec():
    spec, a = sum_spec(), params(0)
    truth = Permutation.random(spec, 9)
    b = truth.inverse().apply(a)
    result = weight_matching(spec, a, b)
    assert result.perm == truth
    other = params(1)
    ours = weight_matching(spec, a, other).perm
    theirs = weight_matching(sliced_spec(), sliced(a), sliced(other)).perm
    assert ours.to_dict() == theirs.to_dict()


def test_rows_of_a_group_and_back():
    spec, p = sum_spec(), params()
    t = p["fc.weight"]
    rows = group_rows(spec, "fc.weight", 1, "b", t)
    assert rows.shape == (B, OUT * BLOCK)
    # row u: unit u of b, its BLOCK entries in every output row
    start = (A + FIXED) * BLOCK
    assert torch.equal(rows[1], t[:, start + BLOCK : start + 2 * BLOCK].T.reshape(-1))
    assert torch.equal(put_group_rows(spec, "fc.weight", 1, "b", t, rows), t)
    zeroed = put_group_rows(spec, "fc.weight", 1, "b", t, torch.zeros_like(rows))
    assert torch.equal(zeroed[:, :start], t[:, :start]) and not zeroed[:, start:].any()


def test_soft_apply_of_hard_permutations_is_apply():
    spec, p = sum_spec(), params()
    perm = Permutation.random(spec, 4)
    soft = {g: torch.eye(n)[perm[g]] for g, n in spec.groups.items()}
    out = soft_apply(spec, p, soft)
    assert all(torch.allclose(v, perm.apply(p)[k]) for k, v in out.items())


def test_alignment_of_a_model_with_its_permuted_self_is_one():
    spec, p = sum_spec(), params()
    perm = Permutation.random(spec, 6)
    moved = perm.inverse().apply(p)
    assert alignment(spec, p, moved, perm, gamma=0.0).total == pytest.approx(1.0, abs=1e-6)
    assert alignment(spec, p, moved, None, gamma=0.0).total < 0.99


def test_round_trip_through_json_and_restrict():
    spec = sum_spec()
    again = PermutationSpec(**json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert spec.group_axes("a") == (("a.weight", 0), ("fc.weight", 1))
    small = spec.restrict(["fc.weight"])
    assert set(small.groups) == {"a", "b", "out"}
    assert spec.segments("fc.weight", 1) == (
        ("a", 0, A * BLOCK),
        (None, A * BLOCK, FIXED * BLOCK),
        ("b", (A + FIXED) * BLOCK, B * BLOCK),
    )


@pytest.mark.parametrize(
    ("entry", "extra", "message"),
    [
        (("a",), {}, "at least two segments"),
        (("a", 0), {}, "at least two segments"),
        ((2, 3), {}, "at least two segments"),
        (("a", "nope"), {}, "'nope', which is not declared"),
        (("a", 1.5), {}, "at least two segments"),
        (("a", "b"), {"repeats": {"fc.weight": (1, 2)}}, "direct sum and has a repeat"),
    ],
)
def test_bad_direct_sums_are_named(entry, extra, message):
    with pytest.raises(SpecError, match=message):
        PermutationSpec(
            groups={"a": A, "b": B},
            axes={"a.weight": ("a", None), "b.weight": ("b", None), "fc.weight": (None, entry)},
            **extra,
        )


def test_a_direct_sum_of_the_wrong_length_is_named():
    spec = sum_spec()
    p = params()
    p["fc.weight"] = p["fc.weight"][:, :-1]
    with pytest.raises(SpecError, match=r"axis 1 has length 17 but its direct sum"):
        spec.validate(p)


def test_a_group_in_two_segments_counts_both():
    """``("a", "b", "a")``: a's cost matrix sums its two segments (a fused projection whose
    query and key move with one group)."""
    spec = PermutationSpec(
        groups={"a": A, "b": B},
        axes={"w": (None, ("a", "b", "a")), "a.weight": ("a", None), "b.weight": ("b", None)},
    )
    cut = PermutationSpec(
        groups={"a": A, "b": B},
        axes={"w1": (None, "a"), "w2": (None, "b"), "w3": (None, "a"),
              "a.weight": ("a", None), "b.weight": ("b", None)},
    )  # fmt: skip

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        p = {"w": torch.randn(OUT, 2 * A + B, generator=g)}
        p.update(
            {"a.weight": torch.randn(A, 2, generator=g), "b.weight": torch.randn(B, 2, generator=g)}
        )
        w1, w2, w3 = p["w"].split([A, B, A], dim=1)
        return p, {
            "w1": w1,
            "w2": w2,
            "w3": w3,
            "a.weight": p["a.weight"],
            "b.weight": p["b.weight"],
        }

    (pa, ca), (pb, cb) = make(0), make(1)
    perm = Permutation.random(spec, 1)
    for g in ("a", "b"):
        got = group_cost_matrix(spec, pa, pb, perm, g)
        want = group_cost_matrix(cut, ca, cb, Permutation(cut, dict(perm.items())), g)
        assert torch.allclose(got, want, atol=1e-5)
