"""Copies groups (PermutationSpec.copies): grouped-query attention's query heads permuted
inside their key/value group — checked against attention written out head by head, index
vectors built by loops, a brute-force count of the group, and weight matching."""

import itertools

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.errors import PermutationError
from lmckit.match import weight_matching
from lmckit.match.weight import weight_matching_reference
from lmckit.perm import (
    axis_index,
    copies_gains,
    copies_gains_of_units,
    copies_value,
    random_index_vectors,
    solve_copies,
)
from tests.test_perm_head_repeats import attention, gqa_params

KV, R, D, W = 3, 2, 4, 5  # as tests/test_perm_head_repeats.py


def copies_spec(kv: int = KV, r: int = R, d: int = D, **extra) -> PermutationSpec:
    """The head-repeat spec of grouped-query attention with its copies group ``qc``."""
    return PermutationSpec(
        groups={"qk": kv * d, "vo": kv * d, "qc": kv * r},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo")},
        heads={"qk": ("kv", kv), "vo": ("kv", kv)},
        head_repeats={"q": (r, 1), "o": (1, r)},
        copies={"qc": "kv"},
        **extra,
    )


def moving(spec: PermutationSpec, seed: int) -> Permutation:
    """A random element whose every part of size > 1 moves (copies included)."""
    generator = torch.Generator().manual_seed(seed)
    return Permutation(spec, random_index_vectors(spec, generator, moving=True))


def test_a_random_element_with_copies_keeps_grouped_query_attention():
    spec, p = copies_spec(), gqa_params()
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for seed in range(5):
        perm = moving(spec, seed)
        assert not torch.equal(perm["qc"], torch.arange(KV * R))
        moved = perm.apply(p)
        assert torch.allclose(attention(moved, x), attention(p, x), rtol=1e-12, atol=1e-12)


def test_copies_alone_swap_query_heads_and_their_output_columns():
    spec, p = copies_spec(), gqa_params()
    qc = torch.arange(KV * R)
    qc[[0, 1]] = qc[[1, 0]]  # the two query heads of key/value head 0 trade places
    moved = Permutation.identity(spec).replace(qc=qc).apply(p)
    assert torch.equal(moved["q"][:D], p["q"][D : 2 * D])
    assert torch.equal(moved["o"][:, :D], p["o"][:, D : 2 * D])
    assert torch.equal(moved["k"], p["k"]) and torch.equal(moved["v"], p["v"])
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(attention(moved, x), attention(p, x), rtol=1e-12, atol=1e-12)


def test_the_query_rows_move_as_written_out_by_loops():
    """``(i, t, s) <- (π(i), ρ_π(i)(t), σ_i(s))``: ρ is indexed by B's head."""
    spec = copies_spec()
    for seed in range(4):
        perm = Permutation.random(spec, seed)
        qk, qc = perm["qk"].view(KV, D), perm["qc"].view(KV, R) % R
        pi = qk[:, 0] // D
        expected = [
            (int(pi[i]) * R + int(qc[pi[i], t])) * D + int(qk[i, s]) % D
            for i in range(KV)
            for t in range(R)
            for s in range(D)
        ]
        assert axis_index(spec, "q", 0, perm).tolist() == expected
        vo = perm["vo"].view(KV, D)
        expected_o = [
            (int(pi[i]) * R + int(qc[pi[i], t])) * D + int(vo[i, s]) % D
            for i in range(KV)
            for t in range(R)
            for s in range(D)
        ]
        assert axis_index(spec, "o", 1, perm).tolist() == expected_o


def test_compose_and_inverse_agree_with_applying_one_after_the_other():
    spec, p = copies_spec(), gqa_params()
    for seed in range(6):
        outer, inner = Permutation.random(spec, seed), Permutation.random(spec, seed + 50)
        both = outer.compose(inner).apply(p)
        one_by_one = outer.apply(inner.apply(p))
        assert all(torch.equal(both[k], one_by_one[k]) for k in p)
        back = outer.inverse().apply(outer.apply(p))
        assert all(torch.equal(back[k], p[k]) for k in p)


def test_the_symmetry_count_is_the_brute_force_count_of_distinct_actions():
    """KV = 2 key/value heads of d = 2, r = 2 query heads each: 2! · (2!)² (query/key
    dimensions) · (2!)² (value dimensions) · (2!)² (copies) = 128 distinct elements, each
    acting differently on generic weights."""
    kv, r, d = 2, 2, 2
    spec = copies_spec(kv, r, d)
    g = torch.Generator().manual_seed(0)
    p = {
        "q": torch.randn(kv * r * d, 3, generator=g),
        "k": torch.randn(kv * d, 3, generator=g),
        "v": torch.randn(kv * d, 3, generator=g),
        "o": torch.randn(3, kv * r * d, generator=g),
    }
    actions = set()
    for qk, vo, qc in itertools.product(itertools.permutations(range(4)), repeat=3):
        try:
            perm = Permutation(spec, {"qk": list(qk), "vo": list(vo), "qc": list(qc)})
        except PermutationError:
            continue
        moved = perm.apply(p)
        actions.add(tuple(tuple(moved[k].flatten().tolist()) for k in sorted(p)))
    assert len(actions) == 128
    assert 10 ** spec.log10_num_symmetries() == pytest.approx(128)


def test_query_heads_moved_across_key_value_groups_are_refused_and_break_attention():
    """The mutation 'query heads permuted across key/value groups': a copies vector that
    sends a query head to another key/value head is no element, and the same move of
    the query rows and output columns changes the attention's output."""
    spec, p = copies_spec(), gqa_params()
    across = torch.arange(KV * R)
    across[[1, 2]] = across[[2, 1]]  # query head 1 (of kv 0) <-> query head 2 (of kv 1)
    with pytest.raises(PermutationError, match="another key/value head"):
        Permutation.identity(spec).replace(qc=across)
    rows = (across[:, None] * D + torch.arange(D)).reshape(-1)
    moved = {**p, "q": p["q"][rows], "o": p["o"][:, rows]}
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert not torch.allclose(attention(moved, x), attention(p, x), atol=1e-6)


def test_the_copies_solve_maximises_the_inner_product_over_every_copies_vector():
    """Brute force over all (2!)³ copies vectors, the other groups at a random element."""
    spec = copies_spec()
    a, b = gqa_params(0), gqa_params(1)
    perm = Permutation.random(spec, 4)
    gains = copies_gains(spec, a, b, perm, "qc")
    best = solve_copies(gains)

    def inner(qc) -> float:
        moved = perm.replace(qc=qc).apply(b)
        return sum(float((a[k] * moved[k]).sum()) for k in a)

    candidates = [
        torch.tensor([j * R + t for j, rho in enumerate(rhos) for t in rho])
        for rhos in itertools.product(itertools.permutations(range(R)), repeat=KV)
    ]
    values = [inner(c) for c in candidates]
    assert inner(best) == pytest.approx(max(values), rel=1e-12)
    # and the gains are the inner product up to a constant
    offsets = [v - copies_value(gains, c) for v, c in zip(values, candidates, strict=True)]
    assert max(offsets) - min(offsets) < 1e-9


@pytest.mark.parametrize(("name", "axis"), [("q", 0), ("o", 1)])
def test_copies_gains_of_units_score_every_copies_vector_as_moving_the_activations(name, axis):
    """Activation matching's copies gains, from unit-by-unit scores: brute force over all
    (2!)³ copies vectors, B's activations (laid out as the weight's axis) moved by the
    whole element — the gains are their inner product with A's up to a constant, and
    the solve picks the best."""
    spec = copies_spec()
    g = torch.Generator().manual_seed(5)
    acts_a = torch.randn(40, KV * R * D, dtype=torch.float64, generator=g)
    acts_b = torch.randn(40, KV * R * D, dtype=torch.float64, generator=g)
    perm = Permutation.random(spec, 6)
    gains = copies_gains_of_units(spec, "qc", name, axis, acts_a.T @ acts_b, perm)
    best = solve_copies(gains)

    def inner(qc) -> float:
        moved = acts_b[:, axis_index(spec, name, axis, perm.replace(qc=qc))]
        return float((acts_a * moved).sum())

    candidates = [
        torch.tensor([j * R + t for j, rho in enumerate(rhos) for t in rho])
        for rhos in itertools.product(itertools.permutations(range(R)), repeat=KV)
    ]
    values = [inner(c) for c in candidates]
    assert inner(best) == pytest.approx(max(values), rel=1e-12)
    assert len(set(values)) == len(values)  # generic: the brute force has one best
    offsets = [v - copies_value(gains, c) for v, c in zip(values, candidates, strict=True)]
    assert max(offsets) - min(offsets) < 1e-9


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_weight_matching_recovers_a_planted_element_with_its_copies(engine):
    spec = copies_spec()
    a = gqa_params(3)
    for seed in range(3):
        truth = moving(spec, 10 + seed)
        b = truth.inverse().apply(a)
        if engine == "fast":
            found = weight_matching(spec, a, b).alignment
        else:
            found = weight_matching_reference(spec, a, b)
        assert found == truth
        assert found.distance(a, b) < 1e-10


def test_both_engines_choose_the_same_copies_on_unrelated_weights():
    spec = copies_spec()
    for seed in range(3):
        a, b = gqa_params(seed), gqa_params(seed + 20)
        fast = weight_matching(spec, a, b, seed=seed).alignment
        assert fast == weight_matching_reference(spec, a, b, seed=seed)


def test_copies_survive_restrict_and_to_dict():
    spec = copies_spec()
    assert spec.to_dict()["copies"] == {"qc": "kv"}
    assert spec.restrict(["q", "k", "v", "o"]).copies == {"qc": "kv"}
    assert "qc" not in spec.restrict(["k", "v"]).groups  # no head-repeated axis left
    assert spec.copies_axes("qc") == (("q", 0), ("o", 1))
    assert ("qc",) not in spec.update_units()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"copies": {"qc": "nope"}}, "no head permutation"),
        ({"copies": ["qc"]}, "must map a copies group"),
        ({"copies": "qc"}, "must map a copies group"),
        ({"copies": {"missing": "kv"}}, "not declared"),
        ({"groups": {"qk": KV * D, "vo": KV * D, "qc": KV * R + 1}}, "need 6"),
        ({"kinds": {"qc": "orthogonal"}}, "permutations only"),
        ({"heads": {"qk": ("kv", KV), "vo": ("kv", KV), "qc": ("kv", KV)}}, "head-structured"),
    ],
)
def test_bad_copies_are_named(change, message):
    fields = dict(
        groups={"qk": KV * D, "vo": KV * D, "qc": KV * R},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo")},
        heads={"qk": ("kv", KV), "vo": ("kv", KV)},
        head_repeats={"q": (R, 1), "o": (1, R)},
        copies={"qc": "kv"},
    )
    fields.update(change)
    with pytest.raises(SpecError, match=message):
        PermutationSpec(**fields)


def test_a_copies_group_on_an_axis_is_refused():
    with pytest.raises(SpecError, match="acts through its tie"):
        PermutationSpec(
            groups={"qk": KV * D, "qc": KV * R},
            axes={"q": ("qk", None), "k": ("qk", None), "x": ("qc",)},
            heads={"qk": ("kv", KV)},
            head_repeats={"q": (R, 1)},
            copies={"qc": "kv"},
        )


def test_a_file_written_before_copies_groups_reads_as_their_identity():
    """Permutation and transform files of a grouped-query model from before copies groups
    lack them: read back, they act as they did (the query heads inside their group kept)."""
    from lmckit.transform import Transform

    spec, p = copies_spec(), gqa_params()
    perm = moving(spec, 1)
    old = {g: v for g, v in perm.to_dict().items() if g != "qc"}
    read = Permutation.from_dict(old, spec)
    assert torch.equal(read["qc"], torch.arange(KV * R))
    assert all(
        torch.equal(read.apply(p)[k], perm.replace(qc=torch.arange(6)).apply(p)[k]) for k in p
    )
    assert torch.equal(Transform.from_dict(old, spec)["qc"], torch.arange(KV * R))


def test_transforms_with_matrices_compose_and_invert_with_their_copies():
    """A transform whose head groups hold orthogonal head-block matrices and whose copies
    move: compose and inverse agree with applying one after the other."""
    from lmckit.transform import Transform

    spec = copies_spec(kinds={"qk": "orthogonal", "vo": "orthogonal"})
    p = gqa_params()
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    for seed in range(4):
        outer, inner = Transform.random(spec, seed), Transform.random(spec, seed + 9)
        both, one_by_one = outer.compose(inner).apply(p), outer.apply(inner.apply(p))
        assert all(torch.allclose(both[k], one_by_one[k], atol=1e-12) for k in p)
        back = outer.inverse().apply(outer.apply(p))
        assert all(torch.allclose(back[k], p[k], atol=1e-12) for k in p)
        assert torch.allclose(attention(outer.apply(p), x), attention(p, x), atol=1e-12)
