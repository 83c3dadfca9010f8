"""Direct sums laid out head by head (PermutationSpec.head_sums): GPT-NeoX's fused
projection, whose rows are ``[q | k | v]`` per head. Checked against the layout built by
hand, against the same direct sum laid out segment by segment, and through weight
matching's planted recovery and transforms."""

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.match import weight_matching, weight_matching_reference
from lmckit.perm import group_rows, head_sum_order, put_group_rows
from lmckit.transform import Transform

H, D, WIDTH = 3, 2, 5


def fused_spec(head_sums=True, kinds=None):
    """``qkv``: rows ``[q | k | v]`` per head (head by head) or ``[all q | all k | all v]``
    (segment by segment); ``dense``: the output projection reading the values."""
    return PermutationSpec(
        groups={"qk": H * D, "vo": H * D, "stream": WIDTH},
        axes={"qkv": (("qk", "qk", "vo"), "stream"), "qkv_bias": (("qk", "qk", "vo"),),
              "dense": ("stream", "vo")},
        heads={"qk": ("attn", H), "vo": ("attn", H)},
        head_sums={"qkv": (H, 1), "qkv_bias": (H,)} if head_sums else {},
        kinds=kinds or {},
    )  # fmt: skip


def fused_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "qkv": torch.randn(3 * H * D, WIDTH, generator=g, dtype=torch.float64),
        "qkv_bias": torch.randn(3 * H * D, generator=g, dtype=torch.float64),
        "dense": torch.randn(WIDTH, H * D, generator=g, dtype=torch.float64),
    }


def by_hand(t: torch.Tensor, perm: Permutation) -> torch.Tensor:
    """The rows of a head-by-head ``[q | k | v]`` tensor moved as the head-structured
    permutations say: head ``i``'s part ``k`` position ``s`` takes B's head ``p // D``'s
    part ``k`` position ``p % D``, ``p = perm[group of part k][i·D + s]``."""
    rows = t.reshape(H, 3, D, *t.shape[1:])
    out = torch.empty_like(rows)
    for part, group in enumerate(("qk", "qk", "vo")):
        p = perm[group]
        for i in range(H):
            for s in range(D):
                src = int(p[i * D + s])
                out[i, part, s] = rows[src // D, part, src % D]
    return out.reshape(t.shape)


def test_a_head_by_head_sum_moves_each_heads_parts_as_built_by_hand():
    spec, params = fused_spec(), fused_params()
    perm = Permutation.random(spec, 3)
    assert not perm.is_identity()
    moved = perm.apply(params)
    stream = perm["stream"]
    assert torch.equal(moved["qkv"], by_hand(params["qkv"], perm)[:, stream])
    assert torch.equal(moved["qkv_bias"], by_hand(params["qkv_bias"], perm))
    # a head-by-head layout is the segment-by-segment one read through its order
    order = head_sum_order(spec, "qkv", 0)
    assert sorted(order.tolist()) == list(range(3 * H * D))
    flat = fused_spec(head_sums=False)
    again = perm.__class__(flat, dict(perm.items())).apply(
        {k: v.index_select(0, order) if k.startswith("qkv") else v for k, v in params.items()}
    )
    assert torch.equal(again["qkv"], moved["qkv"].index_select(0, order))


def test_group_rows_of_a_head_by_head_sum_round_trip_and_read_each_heads_parts():
    spec, params = fused_spec(), fused_params(1)
    t = params["qkv"]
    qk = group_rows(spec, "qkv", 0, "qk", t)
    rows = t.reshape(H, 3, D, WIDTH)
    assert torch.equal(
        qk, torch.cat([rows[:, 0].reshape(H * D, -1), rows[:, 1].reshape(H * D, -1)], 1)
    )
    vo = group_rows(spec, "qkv", 0, "vo", t)
    assert torch.equal(vo, rows[:, 2].reshape(H * D, -1))
    assert torch.equal(put_group_rows(spec, "qkv", 0, "vo", t, vo), t)
    changed = put_group_rows(spec, "qkv", 0, "vo", t, torch.zeros_like(vo))
    assert torch.equal(
        changed.reshape(H, 3, D, WIDTH)[:, 2], torch.zeros(H, D, WIDTH, dtype=t.dtype)
    )
    assert torch.equal(changed.reshape(H, 3, D, WIDTH)[:, :2], rows[:, :2])


def test_weight_matching_recovers_a_planted_permutation_of_a_head_by_head_sum():
    spec, a = fused_spec(), fused_params(2)
    truth = Permutation.random(spec, 11)
    b = truth.inverse().apply(a)
    for match in (weight_matching, weight_matching_reference):
        found = match(spec, a, b)
        found = getattr(found, "perm", found)
        assert found == truth, match.__name__


def test_a_transform_of_a_head_by_head_sum_is_its_inverse_s_inverse():
    spec = fused_spec(kinds={"vo": "orthogonal", "stream": "orthogonal"})
    params = fused_params(3)
    t = Transform.random(spec, 4)
    back = t.inverse().apply(t.apply(params))
    for k in params:
        assert torch.allclose(back[k], params[k], atol=1e-12), k
    # the value rows of every head move by that head's block of the map, the rest by none
    moved = t.apply(params)
    assert not torch.allclose(moved["qkv"], params["qkv"])


@pytest.mark.parametrize(
    "head_sums, axes, heads, why",
    [
        ({"qkv": (H, 1)}, {"qkv": (("qk", 6, "vo"), "stream")}, None, "groups alone"),
        ({"qkv": (H, 1)}, {"qkv": (("qk", "qk", "vo"), "stream")},
         {"qk": ("attn", H), "vo": ("other", H)}, "one tie"),
        ({"qkv": (H, 1)}, {"qkv": ("qk", "stream")}, None, "groups alone"),
    ],
)  # fmt: skip
def test_a_head_by_head_sum_that_cannot_be_laid_out_is_refused_by_name(head_sums, axes, heads, why):
    groups = {"qk": H * D, "vo": H * D, "stream": WIDTH}
    used = {g for v in axes.values() for e in v for g in ((e,) if isinstance(e, str) else e or ())}
    with pytest.raises(SpecError, match=why):
        PermutationSpec(
            groups={g: n for g, n in groups.items() if g in used},
            axes=axes,
            heads={g: v for g, v in (heads or {"qk": ("attn", H), "vo": ("attn", H)}).items()
                   if g in used},
            head_sums=head_sums,
        )  # fmt: skip


def test_head_sums_survive_to_dict_and_restrict():
    spec = fused_spec()
    assert spec.to_dict()["head_sums"] == {"qkv": [H, 1], "qkv_bias": [H]}
    assert spec.restrict(["qkv", "dense"]).head_sums == {"qkv": (H, 1)}
