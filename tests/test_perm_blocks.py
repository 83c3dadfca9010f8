"""Block-structured axes (PermutationSpec.blocks): a group moving whole blocks of an axis —
a convolution's channel with its positions after a flatten, an attention head with its
dimensions — checked against the unflattened tensors they stand for."""

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.analysis.spectral import alignment
from lmckit.match import sinkhorn_matching, weight_matching
from lmckit.match.sinkhorn import soft_apply
from lmckit.params import params_distance
from lmckit.perm import block_index, group_cost_matrix

C, HW, OUT = 5, 6, 7


def flat_spec():
    """conv (C, 2, 3, 3) → flatten C×HW → fc (OUT, C·HW): fc's input axis is C blocks."""
    return PermutationSpec(
        groups={"c": C},
        axes={"conv.weight": ("c", None, None, None), "conv.bias": ("c",),
              "fc.weight": (None, "c"), "fc.bias": (None,)},
        blocks={"fc.weight": (1, HW)},
    )  # fmt: skip


def flat_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(C, 2, 3, 3, generator=g),
        "conv.bias": torch.randn(C, generator=g),
        "fc.weight": torch.randn(OUT, C * HW, generator=g),
        "fc.bias": torch.randn(OUT, generator=g),
    }


def test_block_index_moves_whole_blocks():
    assert block_index(torch.tensor([2, 0, 1]), 2).tolist() == [4, 5, 0, 1, 2, 3]
    assert block_index(torch.tensor([1, 0]), 1).tolist() == [1, 0]


def test_apply_equals_permuting_the_unflattened_channel_axis():
    spec, params = flat_spec(), flat_params()
    perm = Permutation.random(spec, 0)
    out = perm.apply(params)
    p = perm["c"]
    expected = params["fc.weight"].reshape(OUT, C, HW)[:, p].reshape(OUT, C * HW)
    assert torch.equal(out["fc.weight"], expected)
    assert torch.equal(out["conv.weight"], params["conv.weight"][p])
    assert params_distance(perm.inverse().apply(out), params) == 0


def test_the_function_is_unchanged():
    """conv → flatten → fc computes the same after the block permutation."""
    spec, params = flat_spec(), flat_params()
    x = torch.randn(4, 2, 2, 3)

    def f(q):
        h = torch.nn.functional.conv2d(x, q["conv.weight"], q["conv.bias"], padding=1)
        return torch.nn.functional.linear(h.flatten(1), q["fc.weight"], q["fc.bias"])

    assert torch.allclose(f(params), f(Permutation.random(spec, 3).apply(params)), atol=1e-5)


def test_cost_matrix_equals_the_unblocked_spec_of_the_reshaped_tensor():
    """The gain of a blocked axis is the gain of the same tensor reshaped so that the units
    are an axis of their own."""
    spec, a, b = flat_spec(), flat_params(0), flat_params(1)
    plain = PermutationSpec(
        groups={"c": C},
        axes={"conv.weight": ("c", None, None, None), "conv.bias": ("c",),
              "fc.weight": (None, "c", None), "fc.bias": (None,)},
    )  # fmt: skip

    def unflat(q):
        return {**q, "fc.weight": q["fc.weight"].reshape(OUT, C, HW)}

    perm = Permutation.identity(spec)
    got = group_cost_matrix(spec, a, b, perm, "c")
    want = group_cost_matrix(plain, unflat(a), unflat(b), Permutation.identity(plain), "c")
    assert torch.allclose(got, want)


def test_matchers_recover_a_planted_block_permutation():
    spec, a = flat_spec(), flat_params()
    truth = Permutation.random(spec, 5)
    b = truth.inverse().apply(a)
    assert weight_matching(spec, a, b).perm == truth
    assert sinkhorn_matching(spec, a, b, steps=300, lr=0.3).perm == truth


def test_soft_apply_of_permutation_matrices_equals_apply():
    spec, params = flat_spec(), flat_params()
    perm = Permutation.random(spec, 2)
    hard = {"c": torch.eye(C)[perm["c"]]}
    soft = soft_apply(spec, params, hard)
    assert all(torch.allclose(soft[k], v) for k, v in perm.apply(params).items())


def test_alignment_of_a_model_with_its_permuted_self_is_one():
    spec, a = flat_spec(), flat_params()
    truth = Permutation.random(spec, 4)
    b = truth.inverse().apply(a)
    r = alignment(spec, a, b, truth, gamma=0.0)
    assert r.total == pytest.approx(1.0, abs=1e-6)


def test_bad_blocks_are_named():
    groups, axes = {"c": C}, {"fc.weight": (None, "c")}
    with pytest.raises(SpecError, match="not in axes"):
        PermutationSpec(groups=groups, axes=axes, blocks={"x": (1, 2)})
    with pytest.raises(SpecError, match="one positive integer per axis"):
        PermutationSpec(groups=groups, axes=axes, blocks={"fc.weight": (2,)})
    with pytest.raises(SpecError, match="no group acts on"):
        PermutationSpec(groups=groups, axes=axes, blocks={"fc.weight": (3, 1)})
    spec = PermutationSpec(groups=groups, axes=axes, blocks={"fc.weight": (1, 4)})
    with pytest.raises(SpecError, match=r"length 5 but group 'c' has size 5 × block 4"):
        spec.validate({"fc.weight": torch.zeros(3, 5)})


# -- repeats: a fused projection whose three segments carry the same group ------------------
N, B, D = 4, 3, 5  # 4 heads of 3 dimensions, model width 5


def fused_spec():
    """``qkv`` of shape ``(3·N·B, D)``: query, key, value segments, each N heads of B."""
    return PermutationSpec(
        groups={"heads": N},
        axes={"qkv.weight": ("heads", None), "out.weight": (None, "heads")},
        blocks={"qkv.weight": (B, 1), "out.weight": (1, B)},
        repeats={"qkv.weight": (3, 1)},
    )


def fused_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "qkv.weight": torch.randn(3 * N * B, D, generator=g),
        "out.weight": torch.randn(D, N * B, generator=g),
    }


def test_repeats_permute_every_segment_alike():
    spec, params = fused_spec(), fused_params()
    perm = Permutation.random(spec, 1)
    p = perm["heads"]
    got = perm.apply(params)["qkv.weight"].reshape(3, N, B, D)
    assert torch.equal(got, params["qkv.weight"].reshape(3, N, B, D)[:, p])
    assert block_index(torch.tensor([1, 0]), 2, 2).tolist() == [2, 3, 0, 1, 6, 7, 4, 5]


def test_repeats_cost_matrix_equals_the_unblocked_spec_of_the_reshaped_tensor():
    spec, a, b = fused_spec(), fused_params(0), fused_params(1)
    plain = PermutationSpec(
        groups={"heads": N},
        axes={"qkv.weight": (None, "heads", None, None), "out.weight": (None, "heads", None)},
    )

    def unflat(q):
        return {
            "qkv.weight": q["qkv.weight"].reshape(3, N, B, D),
            "out.weight": q["out.weight"].reshape(D, N, B),
        }

    got = group_cost_matrix(spec, a, b, Permutation.identity(spec), "heads")
    want = group_cost_matrix(plain, unflat(a), unflat(b), Permutation.identity(plain), "heads")
    assert torch.allclose(got, want)


def test_repeats_work_in_every_weight_based_method():
    spec, a = fused_spec(), fused_params()
    truth = Permutation.random(spec, 3)
    b = truth.inverse().apply(a)
    assert weight_matching(spec, a, b).perm == truth
    assert sinkhorn_matching(spec, a, b, steps=300, lr=0.3).perm == truth
    hard = {"heads": torch.eye(N)[truth["heads"]]}
    soft = soft_apply(spec, a, hard)
    assert all(torch.allclose(soft[k], v) for k, v in truth.apply(a).items())
    with pytest.raises(SpecError, match=r"size 4 × block 3 × repeat 3"):
        spec.validate({**a, "qkv.weight": torch.zeros(3 * N * B + 1, D)})
