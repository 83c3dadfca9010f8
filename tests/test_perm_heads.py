"""Head-structured groups (PermutationSpec.heads): one permutation of the heads shared by
the groups of an attention layer, one permutation inside each head per group — checked
against brute force, against the unstructured problem, and through every method."""

import itertools

import numpy as np
import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.data import TensorLoader
from lmckit.errors import PermutationError
from lmckit.lap import assign_groups, assign_heads
from lmckit.match import (
    sinkhorn_matching,
    ste_matching,
    weight_matching,
    weight_matching_reference,
)
from lmckit.merge import ccmm, merge_many, ste_mm
from lmckit.models import build_model, permutation_spec
from lmckit.perm import join_heads, random_index_vectors, split_heads

H, D = 3, 2


def tied_spec():
    """Q/K (heads of 2), V/O (heads of 2) and a plain group of 3 (a head-level quantity,
    d = 1), all sharing one permutation of the 3 heads."""
    return PermutationSpec(
        groups={"qk": H * D, "vo": H * D, "gate": H},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo"),
              "g": ("gate",)},
        heads={"qk": ("attn", H), "vo": ("attn", H), "gate": ("attn", H)},
    )  # fmt: skip


def tied_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(H * D, 4, generator=g),
        "k": torch.randn(H * D, 4, generator=g),
        "v": torch.randn(H * D, 4, generator=g),
        "o": torch.randn(4, H * D, generator=g),
        "g": torch.randn(H, generator=g),
    }


def test_split_and_join_heads_round_trip_and_catch_moves_between_heads():
    outer, inner = torch.tensor([2, 0, 1]), torch.tensor([[1, 0], [0, 1], [1, 0]])
    p = join_heads(outer, inner)
    assert p.tolist() == [5, 4, 0, 1, 3, 2]
    got = split_heads(p, 3)
    assert got is not None and torch.equal(got[0], outer) and torch.equal(got[1], inner)
    assert split_heads(torch.tensor([0, 2, 1, 3, 4, 5]), 3) is None  # 2 went to head 0


def structured(d_by_group, heads):
    """Every assignment of the tie, by brute force: (outer, {group: index vector})."""
    for outer in itertools.permutations(range(heads)):
        inner_choices = [
            itertools.product(itertools.permutations(range(d)), repeat=heads)
            for d in d_by_group.values()
        ]
        for inners in itertools.product(*inner_choices):
            yield {
                g: join_heads(torch.tensor(outer), torch.tensor(inner)).numpy()
                for g, inner in zip(d_by_group, inners, strict=True)
            }


def value(gains, perms):
    return sum(float(c[np.arange(len(perms[g])), perms[g]].sum()) for g, c in gains.items())


def test_assign_heads_is_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    dims = {"a": 2, "b": 1, "c": 3}
    for _ in range(3):
        gains = {g: rng.normal(size=(H * d, H * d)) for g, d in dims.items()}
        best = max(value(gains, p) for p in structured(dims, H))
        got = {g: p.numpy() for g, p in assign_heads(gains, H).items()}
        assert value(gains, got) == pytest.approx(best, abs=1e-12)
        assert all(split_heads(torch.from_numpy(p), H) is not None for p in got.values())
        # the unstructured LAP per group would do better — and be no symmetry of attention
        free = {g: assign_groups({g: c})[g].numpy() for g, c in gains.items()}
        assert value(gains, free) > best + 1e-9


def test_a_shared_block_gives_what_its_tiled_matrix_gives():
    """``shared``: one ``(d, d)`` block for every pair of heads (a mixture's hidden units
    read once per expert) solves as the ``(h·d, h·d)`` matrix tiled from it would, beside
    a head permutation group whose own gains decide the heads."""
    rng = np.random.default_rng(2)
    for _ in range(3):
        block = rng.normal(size=(3, 3))
        experts = rng.normal(size=(H, H))
        tiled = {"hidden": np.tile(block, (H, H)), "experts": experts}
        got = assign_heads({"hidden": block, "experts": experts}, H, shared={"hidden"})
        want = assign_heads(tiled, H)
        assert torch.equal(got["hidden"], want["hidden"])
        assert torch.equal(got["experts"], want["experts"])
        best = max(value(tiled, p) for p in structured({"hidden": 3, "experts": 1}, H))
        assert value(tiled, {g: p.numpy() for g, p in got.items()}) == pytest.approx(best)
    with pytest.raises(Exception, match="square"):
        assign_heads({"hidden": rng.normal(size=(3, 4))}, H, shared={"hidden"})


def test_assign_groups_solves_ties_together_and_the_rest_alone():
    rng = np.random.default_rng(1)
    gains = {"x": rng.normal(size=(4, 4)), "qk": rng.normal(size=(6, 6)),
             "vo": rng.normal(size=(6, 6))}  # fmt: skip
    heads = {"qk": ("t", 3), "vo": ("t", 3)}
    got = assign_groups(gains, heads)
    assert list(got) == ["x", "qk", "vo"]
    tied = assign_heads({"qk": gains["qk"], "vo": gains["vo"]}, 3)
    assert torch.equal(got["qk"], tied["qk"]) and torch.equal(got["vo"], tied["vo"])
    assert torch.equal(got["x"], assign_groups({"x": gains["x"]})["x"])


def test_permutations_must_respect_the_heads():
    spec = tied_spec()
    good = Permutation.random(spec, 3)
    assert torch.equal(split_heads(good["qk"], H)[0], split_heads(good["vo"], H)[0])
    assert torch.equal(split_heads(good["qk"], H)[0], good["gate"])
    for p in (good.inverse(), good.compose(Permutation.random(spec, 4))):
        Permutation(spec, dict(p.items()))  # still structured, still one head permutation
    with pytest.raises(PermutationError, match=r"'qk' is head-structured.*moves units between"):
        good.replace(qk=torch.tensor([1, 2, 0, 3, 4, 5]))
    swapped = join_heads(
        (split_heads(good["vo"], H)[0] + 1) % H, torch.tensor([[0, 1], [1, 0], [0, 1]])
    )
    with pytest.raises(PermutationError, match="share the head permutation 'attn'"):
        good.replace(vo=swapped)


def test_moving_random_vectors_move_every_part():
    spec = tied_spec()
    for seed in range(20):
        v = random_index_vectors(spec, torch.Generator().manual_seed(seed), moving=True)
        outer, inner = split_heads(v["qk"], H)
        assert not torch.equal(outer, torch.arange(H))
        assert all(not torch.equal(row, torch.arange(D)) for row in inner)


def test_bad_heads_are_named():
    groups = {"qk": 6, "vo": 6}
    axes = {"q": ("qk",), "v": ("vo",)}
    with pytest.raises(SpecError, match="heads names group 'x'"):
        PermutationSpec(groups=groups, axes=axes, heads={"x": ("t", 3)})
    with pytest.raises(SpecError, match="4 heads do not divide the group's 6 units"):
        PermutationSpec(groups=groups, axes=axes, heads={"qk": ("t", 4)})
    with pytest.raises(SpecError, match="'t' is given 3 heads by one group and 2 by 'vo'"):
        PermutationSpec(groups=groups, axes=axes, heads={"qk": ("t", 3), "vo": ("t", 2)})
    with pytest.raises(SpecError, match=r"must be \(head permutation name, number of heads\)"):
        PermutationSpec(groups=groups, axes=axes, heads={"qk": 3})
    spec = PermutationSpec(groups=groups, axes=axes, heads={"qk": ("t", 3), "vo": ("t", 3)})
    assert spec.update_units() == [("qk", "vo")]
    assert dict(spec.restrict({"q"}).heads) == {"qk": ("t", 3)}


def test_weight_matching_recovers_a_planted_tied_permutation_as_the_reference_does():
    spec, a = tied_spec(), tied_params()
    for seed in range(3):
        truth = Permutation.random(spec, seed)
        b = truth.inverse().apply(a)
        result = weight_matching(spec, a, b)
        assert result.perm == truth and result.distance_after == pytest.approx(0, abs=1e-5)
        assert weight_matching_reference(spec, a, b) == truth


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    config = {"in_dim": 8, "length": 8, "dim": 12, "depth": 2, "heads": 3}
    models = [build_model("transformer", **config) for _ in range(3)]
    spec = permutation_spec(models[0])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 8, 8, generator=g)
    y = torch.randint(0, 10, (48,), generator=g)
    return models[0], spec, [m.state_dict() for m in models], TensorLoader(x, y, batch_size=16)


def test_every_method_returns_head_structured_permutations(transformer):
    """Permutation() rejects a vector that moves a dimension to another head or permutes
    the heads of a tie differently, so each method passing through it is checked."""
    model, spec, (a, b, c), data = transformer
    assert spec.heads
    wm = weight_matching(spec, a, b)
    assert wm.perm == weight_matching_reference(spec, a, b)
    assert wm.distance_after < wm.distance_before
    assert isinstance(sinkhorn_matching(spec, a, b, steps=20).perm, Permutation)
    ste = ste_matching(spec, a, b, model=model, data=data, epochs=1)
    assert isinstance(ste.perm, Permutation)
    for merged in (
        merge_many(spec, [a, b, c]),
        ccmm(spec, [a, b, c], max_iter=5),
        ste_mm(spec, [a, b, c], model=model, data=data, epochs=1),
    ):
        assert len(merged.perms) == 3


def test_inner_permutations_lower_the_weight_matching_distance(transformer):
    """The inner permutations are extra freedom: with them WM ends at least as close as with
    whole heads only (the same model traced with inside_blocks=False), and here closer."""
    from lmckit.tracing import trace

    model, spec, (a, b, _), _ = transformer
    whole = trace(model, torch.randn(2, 8, 8), inside_blocks=False)
    assert not whole.heads and len(whole.groups) == len(spec.groups) - 2  # one tie per layer
    inner = min(weight_matching(spec, a, b, seed=s).distance_after for s in range(3))
    outer = min(weight_matching(whole, a, b, seed=s).distance_after for s in range(3))
    assert inner < outer


def test_tracing_without_inside_blocks_moves_whole_heads():
    from lmckit.tracing import trace_report

    torch.manual_seed(0)
    model = build_model("transformer", in_dim=8, length=8, dim=12, depth=1, heads=3)
    report = trace_report(model, torch.randn(2, 8, 8), inside_blocks=False)
    spec = report.spec
    heads = spec.axes["blocks.0.attn.q.weight"][0]
    assert not spec.heads and spec.groups[heads] == 3
    assert spec.axes["blocks.0.attn.v.weight"][0] == heads
    assert spec.blocks["blocks.0.attn.q.weight"] == (4, 1)
    assert report.whole_blocks[heads] == "inside_blocks=False"
