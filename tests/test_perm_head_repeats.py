"""Head repeats (PermutationSpec.head_repeats): grouped-query attention, whose query heads
share their key/value head's dimensions — checked against attention written out head by
head, against index vectors built by loops, and through weight matching."""

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.match import weight_matching
from lmckit.perm import axis_index, group_cost_matrix, group_rows, put_group_rows

KV, R, D, W = 3, 2, 4, 5  # key/value heads, query heads per key/value head, head size, width


def gqa_spec(**extra) -> PermutationSpec:
    """Queries ``KV·R`` heads, keys and values ``KV`` heads of ``D``: the key/value groups
    (``kv``), each key/value head's query/key dimensions (``qk``, on the query rows once
    per query head) and value dimensions (``vo``, on the output columns once per query
    head)."""
    return PermutationSpec(
        groups={"qk": KV * D, "vo": KV * D},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo")},
        heads={"qk": ("kv", KV), "vo": ("kv", KV)},
        head_repeats={"q": (R, 1), "o": (1, R)},
        **extra,
    )


def gqa_params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(KV * R * D, W, generator=g, dtype=torch.float64),
        "k": torch.randn(KV * D, W, generator=g, dtype=torch.float64),
        "v": torch.randn(KV * D, W, generator=g, dtype=torch.float64),
        "o": torch.randn(W, KV * R * D, generator=g, dtype=torch.float64),
    }


def attention(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention over ``x`` (``(T, W)``), one query head at a time: query
    head ``j`` reads key/value head ``j // R``."""
    out = torch.zeros(x.shape[0], W, dtype=x.dtype)
    for j in range(KV * R):
        kv = j // R
        q = x @ p["q"][j * D : (j + 1) * D].T
        k = x @ p["k"][kv * D : (kv + 1) * D].T
        v = x @ p["v"][kv * D : (kv + 1) * D].T
        heads = torch.softmax(q @ k.T / D**0.5, dim=-1) @ v
        out += heads @ p["o"][:, j * D : (j + 1) * D].T
    return out


def test_a_random_element_keeps_grouped_query_attention():
    spec, p = gqa_spec(), gqa_params()
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for seed in range(5):
        perm = Permutation.random(spec, seed)
        moved = perm.apply(p)
        assert not torch.equal(moved["o"], p["o"])
        assert torch.allclose(attention(moved, x), attention(p, x), rtol=1e-12, atol=1e-12)


def test_the_output_columns_move_as_the_head_repeat_says():
    """Column ``(i·R + t)·D + s`` of the output projection reads ``(π(i)·R + t)·D + σ_i(s)``:
    built by loops here, against the spec's index vector."""
    spec = gqa_spec()
    perm = Permutation.random(spec, 3)
    vo = perm["vo"]
    expected = []
    for i in range(KV):
        for t in range(R):
            for s in range(D):
                unit = int(vo[i * D + s])
                head, dim = divmod(unit, D)
                expected.append((head * R + t) * D + dim)
    assert axis_index(spec, "o", 1, perm).tolist() == expected
    assert axis_index(spec, "v", 0, perm).tolist() == vo.tolist()


def test_a_units_rows_hold_every_copy_and_put_back_inverts_them():
    spec, p = gqa_spec(), gqa_params()
    rows = group_rows(spec, "o", 1, "vo", p["o"])
    assert rows.shape == (KV * D, W * R)
    for i in range(KV):
        for s in range(D):
            copies = [p["o"][:, (i * R + t) * D + s] for t in range(R)]
            assert torch.equal(rows[i * D + s].reshape(R, W), torch.stack(copies))
    assert torch.equal(put_group_rows(spec, "o", 1, "vo", p["o"], rows), p["o"])


def test_the_cost_matrix_sums_every_copy():
    """The gain of matching unit u of A to unit w of B on the output projection is
    ``Σ_t ⟨A[:, copy t of u], B[:, copy t of w]⟩``: by loops, against the spec's."""
    spec, a, b = gqa_spec(), gqa_params(0), gqa_params(1)
    identity = Permutation.identity(spec)
    cost = group_cost_matrix(spec, a, b, identity, "vo", names={"o"})
    naive = torch.zeros(KV * D, KV * D, dtype=torch.float64)
    for u in range(KV * D):
        for w in range(KV * D):
            for t in range(R):
                cu = (u // D * R + t) * D + u % D
                cw = (w // D * R + t) * D + w % D
                naive[u, w] += a["o"][:, cu] @ b["o"][:, cw]
    assert torch.allclose(cost, naive, rtol=1e-12)


def test_weight_matching_recovers_a_planted_element():
    spec, a = gqa_spec(), gqa_params()
    truth = Permutation.random(spec, 5)
    result = weight_matching(spec, a, truth.inverse().apply(a))
    assert result.perm == truth


def test_head_repeats_survive_restrict_and_to_dict():
    spec = gqa_spec()
    assert spec.to_dict()["head_repeats"] == {"q": [R, 1], "o": [1, R]}
    assert spec.restrict({"v", "o"}).head_repeats == {"o": (1, R)}


def test_bad_head_repeats_are_named():
    with pytest.raises(SpecError, match="needs a head-structured group"):
        PermutationSpec(groups={"a": 4}, axes={"w": ("a",)}, head_repeats={"w": (2,)})
    with pytest.raises(SpecError, match="a repeat or a head repeat"):
        gqa_spec(repeats={"q": (2, 1)})
    with pytest.raises(SpecError, match="head repeat 2"):
        p = gqa_params()
        p["o"] = p["o"][:, : KV * D]
        gqa_spec().validate(p)


def fused_gqa_spec(groups_extra=None, **extra) -> PermutationSpec:
    """The same attention with query, key and value fused into one projection ``qkv``, rows
    ``[q | k | v]`` (Phi-3 under grouped-query attention): a direct sum whose query segment
    is head-repeated (``segment_head_repeats``), the stream a group too."""
    return PermutationSpec(
        groups={"qk": KV * D, "vo": KV * D, "w": W, **(groups_extra or {})},
        axes={"qkv": (("qk", "qk", "vo"), "w"), "o": ("w", "vo")},
        heads={"qk": ("kv", KV), "vo": ("kv", KV)},
        head_repeats={"o": (1, R)},
        segment_head_repeats={"qkv": {0: (R, 1, 1)}},
        **extra,
    )


def fuse(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"qkv": torch.cat([p["q"], p["k"], p["v"]]), "o": p["o"]}


def unfuse(p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    q, k, v = p["qkv"].split([KV * R * D, KV * D, KV * D])
    return {"q": q, "k": k, "v": v, "o": p["o"]}


def test_a_head_repeated_segment_moves_as_the_separate_query_projection_does():
    """A fused projection whose query segment is head-repeated moves, segment by segment,
    exactly as the separate projections of ``gqa_spec`` do — checked on every axis and
    through the function — and its rows read back."""
    fused, separate = fused_gqa_spec(), gqa_spec()
    p = gqa_params(3)
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert [length for _, _, length in fused.segments("qkv", 0)] == [KV * R * D, KV * D, KV * D]
    fused.validate(fuse(p))
    for seed in range(4):
        perm = Permutation.random(fused, seed)
        moved = unfuse(perm.apply(fuse(p)))
        stream = perm["w"]
        alone = Permutation(separate, {"qk": perm["qk"], "vo": perm["vo"]}).apply(p)
        for name in ("q", "k", "v"):
            assert torch.equal(moved[name], alone[name][:, stream]), name
        assert torch.equal(moved["o"], alone["o"][stream])
        assert torch.allclose(attention(moved, x[:, stream]), attention(p, x)[:, stream],
                              rtol=1e-12, atol=1e-12)  # fmt: skip
    t = fuse(p)["qkv"]
    rows = group_rows(fused, "qkv", 0, "qk", t)
    assert rows.shape == (KV * D, (R + 1) * W)
    q_rows = group_rows(separate, "q", 0, "qk", p["q"])
    assert torch.equal(rows[:, : R * W], q_rows)
    assert torch.equal(put_group_rows(fused, "qkv", 0, "qk", torch.zeros_like(t), rows)[: -KV * D],
                       t[: -KV * D])  # fmt: skip


def test_a_copies_group_moves_the_head_repeated_segment_as_the_query_projection():
    """With a copies group, the query heads inside a key/value group move on the fused
    projection's query segment exactly as on the separate query projection, the key and
    value segments untouched by them."""
    copies = {"kv:copies": "kv"}
    fused = fused_gqa_spec(groups_extra={"kv:copies": KV * R}, copies=copies)
    separate = PermutationSpec(
        groups={"qk": KV * D, "vo": KV * D, "kv:copies": KV * R},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo")},
        heads={"qk": ("kv", KV), "vo": ("kv", KV)},
        head_repeats={"q": (R, 1), "o": (1, R)},
        copies=copies,
    )
    p = gqa_params(6)
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert fused.copies_axes("kv:copies") == (("o", 1), ("qkv", 0))
    for seed in range(4):
        perm = Permutation.random(fused, seed)
        moved = unfuse(perm.apply(fuse(p)))
        stream = perm["w"]
        alone = Permutation(separate, {g: perm[g] for g in separate.groups}).apply(p)
        for name in ("q", "k", "v"):
            assert torch.equal(moved[name], alone[name][:, stream]), name
        assert torch.equal(moved["o"], alone["o"][stream])
        assert torch.allclose(attention(moved, x[:, stream]), attention(p, x)[:, stream],
                              rtol=1e-12, atol=1e-12)  # fmt: skip
    a = fuse(p)
    truth = Permutation.random(fused, 3)
    init = Permutation.identity(fused).replace(w=truth["w"])
    found = weight_matching(fused, a, truth.inverse().apply(a), init=init, hold=["w"])
    assert found.alignment == truth


def test_a_fused_projection_with_a_head_repeated_segment_is_matched_exactly():
    """With the stream held where it was planted (a five-unit stream of random weights
    couples with the heads into local optima of its own), WM recovers the heads, the
    query/key and the value dimensions exactly through the head-repeated segment."""
    spec, a = fused_gqa_spec(), fuse(gqa_params(4))
    for seed in range(4):
        truth = Permutation.random(spec, 10 + seed)
        init = Permutation.identity(spec).replace(w=truth["w"])
        found = weight_matching(spec, a, truth.inverse().apply(a), init=init, hold=["w"])
        assert found.alignment == truth


def test_a_scaled_query_key_map_moves_the_key_segment_by_its_inverse_transpose():
    """An invertible map of the query/key group on the fused projection: the repeated
    query segment (``R`` times the key segment's columns) by ``M``, the key segment by
    ``M⁻ᵀ`` — the scores ``q·k`` unchanged. Reading the segments as equally wide (as the
    code did before) mixes query columns into the key's map."""
    from lmckit.transform import Transform

    spec = fused_gqa_spec(kinds={"qk": "invertible"}, duals=frozenset({("qkv", 0, 1)}))
    p = fuse(gqa_params(5))
    x = torch.randn(6, W, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    moved = Transform.random(spec, 2).replace(w=torch.arange(W)).apply(p)
    assert not torch.allclose(moved["qkv"], p["qkv"])
    scores = [
        (x @ unfuse(t)["q"][:D].T) @ (x @ unfuse(t)["k"][:D].T).T for t in (moved, p)
    ]  # query head 0 and its key/value head
    assert torch.allclose(*scores, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "counts, why",
    [
        ((R, 1), "one count per segment"),
        ((1, 1, R), "head-structured"),
        ((0, 1, 1), "positive"),
        ("RRR", "one count per segment"),
    ],
)
def test_segment_head_repeats_that_cannot_be_laid_out_are_refused(counts, why):
    with pytest.raises(SpecError, match=why):
        PermutationSpec(
            groups={"qk": KV * D, "vo": KV * D, "w": W},
            axes={"qkv": (("qk", "qk", "vo"), "w"), "o": ("w", "vo")},
            heads={"qk": ("kv", KV)} if counts == (1, 1, R) else
                  {"qk": ("kv", KV), "vo": ("kv", KV)},
            segment_head_repeats={"qkv": {0: counts}},
        )  # fmt: skip


def test_segment_head_repeats_survive_to_dict_and_restrict():
    spec = fused_gqa_spec()
    assert spec.to_dict()["segment_head_repeats"] == {"qkv": {"0": [R, 1, 1]}}
    assert spec.restrict(["qkv", "o"]).segment_head_repeats == {"qkv": {0: (R, 1, 1)}}


@pytest.mark.parametrize("given", [{"qkv": {"zero": (R, 1, 1)}}, {"qkv": (R, 1, 1)}])
def test_segment_head_repeats_of_the_wrong_shape_are_refused_by_name(given):
    with pytest.raises(SpecError, match="segment_head_repeats"):
        fused_gqa_spec().__class__(**{**_fused_fields(), "segment_head_repeats": given})


def _fused_fields():
    spec = fused_gqa_spec()
    return dict(groups=dict(spec.groups), axes=dict(spec.axes), heads=dict(spec.heads),
                head_repeats=dict(spec.head_repeats))  # fmt: skip
