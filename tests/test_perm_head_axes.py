"""Groups whose heads lie on another axis of their tensors (PermutationSpec.head_axes): a
mixture's fused expert tensors, ``gate_up [E, 2I, H]`` and ``down [E, H, N_HIDDEN]``, whose
experts are the heads and whose hidden units each expert permutes alone. Checked against
a mixture computed by hand (a random element keeps it, moving one expert's units alone
breaks it), against the layout built by hand, and through weight matching's planted
recovery (brute force over a tiny mixture), transforms, Sinkhorn and STE."""

import itertools

import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.match import weight_matching, weight_matching_reference
from lmckit.perm import (
    coarsen_shared,
    group_rows,
    lift_shared,
    put_group_rows,
    shared_inside_heads,
)
from lmckit.transform import Transform

E, N_HIDDEN, H, K = 4, 5, 6, 2  # experts, hidden units per expert, width, top-K


def moe_spec(kinds=None, bias=False):
    """Router ``[E, H]``, fused ``gate_up [E, 2I, H]`` (each expert's gate rows, then its up
    rows) and ``down [E, H, N_HIDDEN]``; the stream is a group too, so that the expert tensors
    carry a third moved axis."""
    axes = {
        "router": ("experts", "stream"),
        "gate_up": (None, ("hidden", "hidden"), "stream"),
        "down": (None, "stream", "hidden"),
        "embed": (None, "stream"),
    }
    head_axes = {"gate_up": (0, 1), "down": (0, 2)}
    if bias:
        axes["gate_up_bias"] = (None, ("hidden", "hidden"))
        head_axes["gate_up_bias"] = (0, 1)
    return PermutationSpec(
        groups={"experts": E, "hidden": E * N_HIDDEN, "stream": H},
        axes=axes,
        heads={"experts": ("experts", E), "hidden": ("experts", E)},
        head_axes=head_axes,
        kinds=kinds or {},
    )


def moe_params(seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    out = {
        "router": torch.randn(E, H, generator=g, dtype=torch.float64),
        "gate_up": torch.randn(E, 2 * N_HIDDEN, H, generator=g, dtype=torch.float64),
        "down": torch.randn(E, H, N_HIDDEN, generator=g, dtype=torch.float64),
        "embed": torch.randn(3, H, generator=g, dtype=torch.float64),
    }
    if bias:
        out["gate_up_bias"] = torch.randn(E, 2 * N_HIDDEN, generator=g, dtype=torch.float64)
    return out


def mixture(p, x):
    """A top-``K`` mixture of SwiGLU experts on ``x [T, H]``, each token's experts
    gathered by the router's picks (as Mixtral's batched form computes it)."""
    weights, idx = torch.topk((x @ p["router"].T).softmax(-1), K, dim=-1)
    out = torch.zeros_like(x)
    for k in range(K):
        gate_up = torch.einsum("tih,th->ti", p["gate_up"][idx[:, k]], x)
        if "gate_up_bias" in p:
            gate_up = gate_up + p["gate_up_bias"][idx[:, k]]
        hidden = torch.nn.functional.silu(gate_up[:, :N_HIDDEN]) * gate_up[:, N_HIDDEN:]
        out += weights[:, k : k + 1] * torch.einsum("thi,ti->th", p["down"][idx[:, k]], hidden)
    return out


def tokens(seed=1, n=16):
    return torch.randn(n, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_random_element_moves_each_expert_apart_and_keeps_the_mixture():
    spec, params = moe_spec(bias=True), moe_params(bias=True)
    spec.validate(params)
    perm = Permutation.random(spec, 3)
    sigma = perm["hidden"].view(E, N_HIDDEN) % N_HIDDEN
    assert len({tuple(r.tolist()) for r in sigma}) == E  # one σ per expert
    moved = perm.apply(params)
    x = tokens()
    stream = perm["stream"]
    out, out_moved = mixture(params, x), mixture(moved, x[:, stream])
    assert torch.allclose(out_moved, out[:, stream], rtol=0, atol=1e-12)
    # one expert's hidden units moved on its gate and up rows but not its down columns
    half = dict(params)
    half["gate_up"] = params["gate_up"].clone()
    shift = torch.arange(N_HIDDEN).roll(1)
    half["gate_up"][1] = torch.cat(
        [params["gate_up"][1, :N_HIDDEN][shift], params["gate_up"][1, N_HIDDEN:][shift]]
    )
    assert not torch.allclose(mixture(half, x), out, atol=1e-3)
    # ... and on its gate and up biases and its down columns too: the function is back
    half["down"] = params["down"].clone()
    half["down"][1] = params["down"][1][:, shift]
    half["gate_up_bias"] = params["gate_up_bias"].clone()
    bias = params["gate_up_bias"][1]
    half["gate_up_bias"][1] = torch.cat([bias[:N_HIDDEN][shift], bias[N_HIDDEN:][shift]])
    assert torch.allclose(mixture(half, x), out, rtol=0, atol=1e-12)


def test_the_layout_is_expert_by_expert_as_built_by_hand():
    spec, params = moe_spec(bias=True), moe_params(2, bias=True)
    pi = torch.tensor([2, 0, 3, 1])
    sigma = [torch.randperm(N_HIDDEN, generator=torch.Generator().manual_seed(e)) for e in range(E)]
    hidden = torch.cat([pi[e] * N_HIDDEN + sigma[e] for e in range(E)])
    perm = Permutation(spec, {"experts": pi, "hidden": hidden, "stream": torch.arange(H)})
    moved = perm.apply(params)
    for e in range(E):
        b = int(pi[e])
        gate, up = params["gate_up"][b, :N_HIDDEN], params["gate_up"][b, N_HIDDEN:]
        assert torch.equal(moved["gate_up"][e], torch.cat([gate[sigma[e]], up[sigma[e]]]))
        assert torch.equal(moved["down"][e], params["down"][b][:, sigma[e]])
        bias = params["gate_up_bias"][b]
        assert torch.equal(
            moved["gate_up_bias"][e],
            torch.cat([bias[:N_HIDDEN][sigma[e]], bias[N_HIDDEN:][sigma[e]]]),
        )
        assert torch.equal(moved["router"][e], params["router"][b])
    # rows: unit e·N_HIDDEN + s holds expert e's unit s, its gate and up rows side by side
    rows = group_rows(spec, "gate_up", 1, "hidden", params["gate_up"])
    assert rows.shape == (E * N_HIDDEN, 2 * H)
    assert torch.equal(
        rows[2 * N_HIDDEN + 3],
        torch.cat([params["gate_up"][2, 3], params["gate_up"][2, N_HIDDEN + 3]]),
    )
    down_rows = group_rows(spec, "down", 2, "hidden", params["down"])
    assert torch.equal(down_rows[3 * N_HIDDEN + 1], params["down"][3, :, 1])
    for name, axis in (("gate_up", 1), ("down", 2), ("gate_up_bias", 1)):
        t = params[name]
        r = group_rows(spec, name, axis, "hidden", t)
        assert torch.equal(put_group_rows(spec, name, axis, "hidden", torch.zeros_like(t), r), t)
    # the rows of a tensor laid out with the axis moved first (as weight matching reads B)
    moved_first = params["down"].movedim(2, 0)
    assert torch.equal(group_rows(spec, "down", 2, "hidden", moved_first, 0), down_rows)


def test_weight_matching_recovers_per_expert_permutations_both_engines():
    spec, a = moe_spec(bias=True), moe_params(4, bias=True)
    for seed in range(4):
        truth = Permutation.random(spec, 20 + seed)
        b = truth.inverse().apply(a)
        for match in (weight_matching, weight_matching_reference):
            found = match(spec, a, b)
            found = getattr(found, "perm", found)
            assert found == truth, (match.__name__, seed)


def test_weight_matching_reaches_the_brute_force_optimum_of_a_tiny_mixture():
    """Two experts of two hidden units, one stream unit held: every element of the group
    (2! · (2!)² = 8) scored by hand; WM's objective equals the best."""
    spec = PermutationSpec(
        groups={"experts": 2, "hidden": 4},
        axes={"router": ("experts", None), "gate_up": (None, ("hidden", "hidden"), None),
              "down": (None, None, "hidden")},
        heads={"experts": ("experts", 2), "hidden": ("experts", 2)},
        head_axes={"gate_up": (0, 1), "down": (0, 2)},
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)
    shapes = {"router": (2, 3), "gate_up": (2, 4, 3), "down": (2, 3, 2)}
    a = {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    b = {k: torch.randn(*s, generator=g, dtype=torch.float64) for k, s in shapes.items()}

    def score(p):
        moved = p.apply(b)
        return sum(float((a[k] * moved[k]).sum()) for k in a)

    best = max(
        score(Permutation(spec, {"experts": torch.tensor(pi), "hidden": torch.tensor(
            [pi[0] * 2 + s0[0], pi[0] * 2 + s0[1], pi[1] * 2 + s1[0], pi[1] * 2 + s1[1]])}))
        for pi in itertools.permutations(range(2))
        for s0 in itertools.permutations(range(2))
        for s1 in itertools.permutations(range(2))
    )  # fmt: skip
    for match in (weight_matching, weight_matching_reference):
        found = match(spec, a, b)
        found = getattr(found, "perm", found)
        assert score(found) == pytest.approx(best, abs=1e-12), match.__name__


def test_a_transform_round_trips_and_keeps_the_mixture():
    spec = moe_spec(kinds={"stream": "orthogonal"}, bias=True)
    params = moe_params(5, bias=True)
    t = Transform.random(spec, 6)
    back = t.inverse().apply(t.apply(params))
    for k in params:
        assert torch.allclose(back[k], params[k], atol=1e-12), k
    assert not torch.allclose(t.apply(params)["down"], params["down"])


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(head_axes={"down": (0, 0)}), "two distinct axes"),
        (dict(head_axes={"down": (1, 2)}), "entry must be None"),
        (dict(head_axes={"down": (0, 3)}), "two distinct axes"),
        (dict(head_axes={"router": (1, 0)}), "entry must be None"),
        (dict(head_axes={"nope": (0, 1)}), "not in axes"),
        (dict(blocks={"down": (1, 1, 2)}), "block"),
    ],
)
def test_a_joint_pair_that_cannot_be_read_is_refused_by_name(change, why):
    fields = dict(
        groups={"experts": E, "hidden": E * N_HIDDEN, "stream": H},
        axes={"router": ("experts", "stream"), "gate_up": (None, ("hidden", "hidden"), "stream"),
              "down": (None, "stream", "hidden")},
        heads={"experts": ("experts", E), "hidden": ("experts", E)},
        head_axes={"gate_up": (0, 1), "down": (0, 2)},
    )  # fmt: skip
    if "head_axes" in change:
        fields["head_axes"] = {**fields["head_axes"], **change["head_axes"]}
    else:
        fields.update(change)
    with pytest.raises(SpecError, match=why):
        PermutationSpec(**fields)


def test_a_hidden_group_that_is_not_head_structured_is_refused():
    with pytest.raises(SpecError, match="head-structured group"):
        PermutationSpec(
            groups={"experts": E, "hidden": E * N_HIDDEN},
            axes={"router": ("experts", None), "down": (None, None, "hidden")},
            head_axes={"down": (0, 2)},
        )


def test_params_whose_experts_axis_disagrees_are_refused_by_name():
    spec, params = moe_spec(), moe_params()
    params["down"] = torch.randn(E + 1, H, N_HIDDEN, dtype=torch.float64)
    with pytest.raises(SpecError, match="read as one they hold 4 heads"):
        spec.validate(params)


def test_head_axes_survive_to_dict_and_restrict():
    spec = moe_spec()
    assert spec.to_dict()["head_axes"] == {"gate_up": [0, 1], "down": [0, 2]}
    assert spec.restrict(["router", "down", "embed"]).head_axes == {"down": (0, 2)}


def test_the_shared_subgroup_lifts_into_the_group_and_back():
    """:func:`shared_inside_heads`: one permutation inside all experts, the experts a plain
    group on the fused tensors' first axis; its elements lift to elements of the whole
    group that move the tensors alike, and come back; an element with the experts' units
    moved apart is not in it."""
    spec, params = moe_spec(bias=True), moe_params(6, bias=True)
    shared = shared_inside_heads(spec)
    assert shared is not None and not shared.head_axes
    assert shared.groups["hidden"] == N_HIDDEN and "hidden" not in shared.heads
    assert shared.axes["down"] == ("experts", "stream", "hidden")
    assert shared.axes["gate_up"] == ("experts", ("hidden", "hidden"), "stream")
    small = Permutation.random(shared, 4)
    lifted = lift_shared(spec, shared, small)
    for k in params:  # the same move read in either spec
        assert torch.equal(lifted.apply(params)[k], small.apply(params)[k]), k
    assert coarsen_shared(spec, shared, lifted) == small
    assert coarsen_shared(spec, shared, Permutation.random(spec, 4)) is None
    assert shared_inside_heads(shared) is None


def test_weight_matching_stays_in_the_shared_subgroup_where_the_whole_one_is_too_large(
    monkeypatch,
):
    """Above JOINT_COST_BYTES (a full-size Mixtral's experts) WM matches in the subgroup
    sharing one permutation inside the experts and says so: a planted element of that
    subgroup is recovered, and the result is in it."""
    import lmckit.match.weight as weight

    spec, a = moe_spec(bias=True), moe_params(8, bias=True)
    shared = shared_inside_heads(spec)
    truth = lift_shared(spec, shared, Permutation.random(shared, 3))
    b = truth.inverse().apply(a)
    monkeypatch.setattr(weight, "JOINT_COST_BYTES", (E * N_HIDDEN) ** 2 * 8 - 1)
    result = weight_matching(spec, a, b)
    assert result.info["shared_inside_heads"] == ["hidden"]
    assert result.alignment == truth
    assert coarsen_shared(spec, shared, result.alignment) is not None
    with pytest.raises(Exception, match="pass an init in that subgroup"):
        weight_matching(spec, a, b, init=Permutation.random(spec, 1))
    monkeypatch.setattr(weight, "JOINT_COST_BYTES", (E * N_HIDDEN) ** 2 * 8)
    assert "shared_inside_heads" not in weight_matching(spec, a, b).info
