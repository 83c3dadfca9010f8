"""Rotary attention's query/key symmetries (issue 59): pinned head groups (the heads move
whole, a head's dimensions stay in place) and the rotary kinds (a 2 × 2 rotation, or scaled
rotation, of each frequency pair) — checked on grouped-query attention with rotary
embeddings written out head by head, against brute force and through weight matching."""

import itertools
import math

import numpy as np
import pytest
import torch

from lmckit import Permutation, PermutationSpec, SpecError
from lmckit.errors import PermutationError
from lmckit.kinds import KINDS, rotary_pairs
from lmckit.lap import assign_heads
from lmckit.match.orthogonal import orthogonal_weight_matching, rotary_procrustes
from lmckit.transform import Transform

KV, REP, D, W, T = 2, 2, 4, 6, 5  # key/value heads, query heads each, head size, width, tokens


PAIRS = {"half": [(0, 2), (1, 3)], "interleaved": [(0, 1), (2, 3)]}  # written out, D = 4


def rope(x: torch.Tensor, style: str) -> torch.Tensor:
    """Rotary embedding of ``x`` (``(T, D)``) at positions 0..T-1, the pairs of ``style``
    (Llama's rotate-half, GPT-J's interleaved)."""
    out = x.clone()
    for j, (a, b) in enumerate(PAIRS[style]):
        angle = torch.arange(T, dtype=x.dtype) * 10000 ** (-2 * j / D)
        c, s = torch.cos(angle), torch.sin(angle)
        out[:, a], out[:, b] = x[:, a] * c - x[:, b] * s, x[:, b] * c + x[:, a] * s
    return out


def attention(p: dict[str, torch.Tensor], x: torch.Tensor, style: str) -> torch.Tensor:
    """Grouped-query attention with rotary queries and keys, one query head at a time."""
    out = torch.zeros(T, W, dtype=x.dtype)
    for j in range(KV * REP):
        kv = j // REP
        q = rope(x @ p["q"][j * D : (j + 1) * D].T, style)
        k = rope(x @ p["k"][kv * D : (kv + 1) * D].T, style)
        v = x @ p["v"][kv * D : (kv + 1) * D].T
        out += (torch.softmax(q @ k.T / D**0.5, dim=-1) @ v) @ p["o"][:, j * D : (j + 1) * D].T
    return out


def rotary_spec(kind: str = "rotary-scaled", style: str = "half") -> PermutationSpec:
    dual = {("k", 0, 0), ("o", 1, 0)} if KINDS[kind].dual else set()
    return PermutationSpec(
        groups={"qk": KV * D, "vo": KV * D},
        axes={"q": ("qk", None), "k": ("qk", None), "v": ("vo", None), "o": (None, "vo")},
        heads={"qk": ("kv", KV), "vo": ("kv", KV)},
        head_repeats={"q": (REP, 1), "o": (1, REP)},
        pinned=frozenset({"qk"}),
        rotary={"qk": (style, D)},
        kinds={"qk": kind, "vo": "invertible" if KINDS[kind].dual else "orthogonal"},
        duals=frozenset(dual),
    )


def _fields(spec: PermutationSpec) -> dict:
    names = ("groups", "axes", "heads", "head_repeats", "pinned", "rotary", "kinds", "duals")
    return {name: getattr(spec, name) for name in names}


def params(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (KV * REP * D, W), "k": (KV * D, W), "v": (KV * D, W), "o": (W, KV * REP * D)}
    return {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}


X = torch.randn(T, W, dtype=torch.float64, generator=torch.Generator().manual_seed(9))


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("kind", ["rotary", "rotary-scaled"])
def test_a_random_element_keeps_rotary_attention(kind, style):
    spec, p = rotary_spec(kind, style), params()
    for seed in range(3):
        moved = Transform.random(spec, seed).apply(p)
        assert not torch.allclose(moved["q"], p["q"])
        assert torch.allclose(attention(moved, X, style), attention(p, X, style), rtol=1e-11)


def test_the_layouts_pair_the_dimensions_rotary_embeddings_rotate_together():
    assert rotary_pairs("half", D) == PAIRS["half"]
    assert rotary_pairs("interleaved", D) == PAIRS["interleaved"]
    assert rotary_pairs("half", 2) == [(0, 1)]  # partial: the first two of a head


def test_the_other_layout_or_a_plain_map_breaks_it():
    """A rotation of the wrong pairs, or an orthogonal map of a whole head, does not commute
    with the rotary embedding: what makes the kind's structure necessary."""
    p = params()
    wrong = Transform.random(rotary_spec("rotary", "interleaved"), 0).apply(p)
    assert not torch.allclose(attention(wrong, X, "half"), attention(p, X, "half"), rtol=1e-3)
    whole = PermutationSpec(
        groups={"qk": KV * D}, axes={"q": ("qk", None), "k": ("qk", None), "v": (None, None),
                                     "o": (None, None)},
        heads={"qk": ("kv", KV)}, head_repeats={"q": (REP, 1)}, kinds={"qk": "orthogonal"},
    )  # fmt: skip
    moved = Transform.random(whole, 0).apply(p)
    assert not torch.allclose(attention(moved, X, "half"), attention(p, X, "half"), rtol=1e-3)


def test_maps_outside_the_rotary_structure_are_refused():
    spec = rotary_spec("rotary")
    good = Transform.random(spec, 0)
    m = good["qk"].clone()
    j = int(m[0].abs().argmax()) // D  # the head that head 0's block reads
    m[0, j * D + 1] = 0.3  # a rotated dimension mixed with another pair's, inside the head
    with pytest.raises(PermutationError, match="keeps apart"):
        Transform(spec, {**dict(good.items()), "qk": m})
    flipped = good["qk"].clone()
    a, b = rotary_pairs("half", D)[0]
    flipped[[a, b]] = flipped[[b, a]]  # swapped rows: a reflection of the pair
    with pytest.raises(PermutationError, match="no rotation"):
        Transform(spec, {**dict(good.items()), "qk": flipped})


def test_pinned_groups_move_whole_heads_only():
    spec = rotary_spec("rotary")
    for seed in range(5):
        p = Permutation.random(spec, seed)["qk"].view(KV, D)
        assert torch.equal(p % D, torch.arange(D).expand(KV, D))  # each head in place
    inside = torch.arange(KV * D)
    inside[[0, 1]] = inside[[1, 0]]
    with pytest.raises(PermutationError, match="pinned"):
        Permutation(spec, {"qk": inside, "vo": torch.arange(KV * D)})
    with pytest.raises(SpecError, match="not head-structured"):
        PermutationSpec(groups={"a": 4}, axes={"w": ("a",)}, pinned=frozenset({"a"}))
    for bad in [("spiral", D), ("half", 3), ("half", D + 2), ("half", True)]:
        with pytest.raises(SpecError, match="rotary"):
            rotary_spec().__class__(**{**_fields(rotary_spec()), "rotary": {"qk": bad}})
    with pytest.raises(SpecError, match="not a pinned"):
        PermutationSpec(**{**_fields(rotary_spec()), "rotary": {"vo": ("half", D)}})
    with pytest.raises(SpecError, match="follow a rotary layout"):
        PermutationSpec(**{**_fields(rotary_spec()), "rotary": {}})
    with pytest.raises(SpecError, match="takes no orthogonal maps"):
        PermutationSpec(
            groups={"a": 4}, axes={"w": ("a",)}, heads={"a": ("t", 2)},
            pinned=frozenset({"a"}), kinds={"a": "orthogonal"},
        )  # fmt: skip


def test_assign_heads_keeps_pinned_heads_whole_as_brute_force_does():
    rng = np.random.default_rng(0)
    heads, d = 3, 2
    gains = {"pinned": rng.normal(size=(heads * d, heads * d)),
             "free": rng.normal(size=(heads * d, heads * d))}  # fmt: skip
    got = assign_heads(gains, heads, pinned={"pinned"})
    best, value = None, -math.inf
    for outer in itertools.permutations(range(heads)):
        total = sum(gains["pinned"][i * d + s, outer[i] * d + s]
                    for i in range(heads) for s in range(d))  # fmt: skip
        for inner in itertools.product(itertools.permutations(range(d)), repeat=heads):
            free = sum(gains["free"][i * d + s, outer[i] * d + inner[i][s]]
                       for i in range(heads) for s in range(d))  # fmt: skip
            if total + free > value:
                best, value = (outer, inner), total + free
    outer, inner = best
    assert got["pinned"].tolist() == [outer[i] * d + s for i in range(heads) for s in range(d)]
    assert got["free"].tolist() == [
        outer[i] * d + inner[i][s] for i in range(heads) for s in range(d)
    ]


def test_rotary_procrustes_is_the_best_map_of_the_kind():
    """Against a fine grid over each pair's angle (and ±1 on an unrotated dimension)."""
    g = torch.Generator().manual_seed(3)
    c = torch.randn(5, 5, dtype=torch.float64, generator=g)
    layout = ("half", 4)
    m = rotary_procrustes(c, layout)
    KINDS["rotary"].check("g", "rotary", m, torch.float64, layout, 1)
    grid = torch.linspace(0, 2 * math.pi, 4001, dtype=torch.float64)
    best = 0.0
    for a, b in rotary_pairs(*layout):
        value = torch.cos(grid) * (c[a, a] + c[b, b]) + torch.sin(grid) * (c[b, a] - c[a, b])
        best += float(value.max())
    best += abs(float(c[4, 4]))
    assert float((m * c).sum()) == pytest.approx(best, abs=1e-5)
    assert float((m * c).sum()) >= best - 1e-9  # the closed form is no worse than the grid


def test_orthogonal_weight_matching_undoes_a_planted_rotation_of_the_pairs():
    spec = rotary_spec("rotary")
    a = params()
    planted = Transform.random(spec, 4)
    b = planted.inverse().apply(a)
    result = orthogonal_weight_matching(spec, a, b)
    aligned = result.alignment.apply(b)
    left = sum(float(((aligned[k] - a[k]) ** 2).sum()) for k in a) ** 0.5
    start = sum(float(((b[k] - a[k]) ** 2).sum()) for k in a) ** 0.5
    assert start > 1 and left < 1e-9 * start
    assert torch.allclose(result.alignment["qk"], planted["qk"].to(torch.float64), atol=1e-9)


def test_the_learned_maps_are_the_rotations_and_scales_of_their_parameters():
    """Transform STE's parameterisation: ``exp`` of the nearest generator of the kind — a
    pair's skew part turns it by that angle, its diagonal (scaled kind) scales it."""
    layout, (a, b) = ("half", D), rotary_pairs("half", D)[0]
    k = torch.zeros(D, D, dtype=torch.float64)
    k[b, a], k[a, b] = 0.7, -0.7
    turned = KINDS["rotary"].learned(k, layout)
    expected = torch.eye(D, dtype=torch.float64)
    expected[a, a] = expected[b, b] = math.cos(0.7)
    expected[b, a], expected[a, b] = math.sin(0.7), -math.sin(0.7)
    assert torch.allclose(turned, expected, atol=1e-12)
    k[a, a] = k[b, b] = 0.3
    scaled = KINDS["rotary-scaled"].learned(k, layout)
    assert torch.allclose(scaled, expected * torch.where(expected.diagonal() != 1, math.exp(0.3),
                                                         1.0)[:, None], atol=1e-12)  # fmt: skip
    assert torch.allclose(KINDS["rotary"].learned(k, layout), turned, atol=1e-12)  # no scale


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_a_transform_file_carries_its_rotary_layout(tmp_path, style):
    """A checkpoint's traced spec has no layouts (the kinds' check finds them); the transform
    file records them, so the file read back over the bare spec is the same transform — the
    experiment store and ``--aligned`` read matches back this way."""
    from dataclasses import replace

    from lmckit.workflows.matching import load_transform, save_transform

    spec = rotary_spec("rotary", style)
    a = params()
    b = Transform.random(spec, 4).inverse().apply(a)
    result = orthogonal_weight_matching(spec, a, b)
    save_transform(tmp_path / "t.json", result)
    bare = replace(spec, rotary={}, kinds={}, duals=frozenset())
    loaded = load_transform(tmp_path / "t.json", bare)
    assert loaded.spec.rotary == {"qk": (style, D)}
    for key, value in result.alignment.apply(b).items():
        assert torch.allclose(loaded.apply(b)[key], value, atol=1e-12)
    import json

    data = json.loads((tmp_path / "t.json").read_text())
    assert data.pop("rotary") == {"qk": [style, D]}
    (tmp_path / "old.json").write_text(json.dumps(data))  # as written before the layouts
    with pytest.raises(PermutationError, match="rotary layout"):
        load_transform(tmp_path / "old.json", bare)
