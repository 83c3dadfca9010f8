"""lmckit.tracing.symmetry_kinds and lmckit.transform on real transformer code: a random
element of the symmetry group found (orthogonal stream, per-head orthogonal query/key and
value/output maps, permutations elsewhere) leaves the model's outputs unchanged to 1e-10
in float64 — with trained-looking norms (gains and biases far from 1 and 0), so a fold
that forgot either would fail."""

from __future__ import annotations

import pytest
import torch

from lmckit.models import build_model, permutation_spec
from lmckit.tracing import symmetry_kinds, trace
from lmckit.transform import Transform, fold_norms, unfold_norms

T = pytest.importorskip("transformers", reason="a dev dependency: pip install -e '.[dev]'")


def randomized_norms(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every 1-D parameter random: gains around 1 ± 0.5, biases ± 0.3."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
                p.copy_(1 + 0.5 * noise if name.endswith("weight") else 0.3 * noise)
    return model


def outputs(model, params, x):
    out = torch.func.functional_call(model, params, (x,), tie_weights=False)
    return getattr(out, "logits", out)


def relative_error(model, params, moved, x) -> float:
    with torch.no_grad():
        ref, out = outputs(model, params, x), outputs(model, moved, x)
    return ((ref - out).abs().max() / ref.abs().max()).item()


class _LlamaRMSNormInDtype(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm computes in float32 whatever the weights' dtype; this
    one in the input's dtype, so that a float64 check measures the transform, not the
    cast."""

    def __init__(self, norm) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _llama(cast_free: bool):
    config = T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12,
        use_cache=False, tie_word_embeddings=False,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config)
    if cast_free:
        for name, module in list(model.named_modules()):
            if type(module).__name__ == "LlamaRMSNorm":
                parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
                setattr(parent, name.rpartition(".")[2], _LlamaRMSNormInDtype(module))
    return model, torch.randint(0, 40, (3, 7))


def _gpt2(tied: bool):
    config = T.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=12, use_cache=False,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied,
    )  # fmt: skip
    return T.GPT2LMHeadModel(config), torch.randint(0, 40, (3, 7))


def _zoo(name: str, **config):
    model = build_model(name, **config)
    x = (
        torch.randint(0, 20, (3, 8))
        if name == "gpt"
        else torch.randn(3, 1, config.get("image_size", 28), config.get("image_size", 28))
    )
    return model, x


ARCHITECTURES = {
    "zoo-gpt": (
        lambda: _zoo("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32),
        "orthogonal-mean-free",
    ),
    "zoo-vit": (
        lambda: _zoo("vit", image_size=28, patch_size=7, dim=16, depth=2, heads=4),
        "orthogonal-mean-free",
    ),
    "gpt2-untied": (lambda: _gpt2(tied=False), "orthogonal-mean-free"),
    "llama": (lambda: _llama(cast_free=True), "orthogonal"),
    "hf-vit": (
        lambda: (
            T.ViTForImageClassification(
                T.ViTConfig(
                    image_size=28,
                    patch_size=7,
                    num_channels=1,
                    hidden_size=16,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=24,
                    num_labels=10,
                )
            ),
            torch.randn(3, 1, 28, 28),
        ),
        "orthogonal-mean-free",
    ),
}


@pytest.fixture(scope="module", params=list(ARCHITECTURES), ids=list(ARCHITECTURES))
def found(request):
    torch.manual_seed(0)
    make, stream_kind = ARCHITECTURES[request.param]
    model, x = make()
    model = randomized_norms(model.double().eval())
    x = x.double() if x.is_floating_point() else x
    spec = permutation_spec(model) if request.param.startswith("zoo") else trace(model, x)
    return request.param, model, x, symmetry_kinds(model, x, spec), stream_kind


def test_the_stream_rotates_with_its_norms_folded(found):
    _name, _model, _x, report, stream_kind = found
    spec = report.spec
    stream = max(spec.groups, key=lambda g: len(spec.group_axes(g)))
    assert spec.kind(stream) == stream_kind, str(report)
    norms = [k for k in spec.folds if spec.gain_group(k) == stream]
    assert len(norms) >= 2 * 2 + 1, norms  # two per block and the final one
    expected = "layer_norm" if stream_kind == "orthogonal-mean-free" else "rms_norm"
    assert {report.norms[k] for k in norms} == {expected}


def test_heads_take_invertible_maps_and_mlp_units_only_permute(found):
    name, _model, _x, report, _ = found
    spec = report.spec
    kinds = {g: spec.kind(g) for g in spec.groups}
    heads = [g for g in spec.groups if g in spec.heads]
    assert len(heads) == 2 * 2
    if name == "llama":  # rotary query/key heads: a scaled rotation of each frequency pair
        assert sorted(kinds[g] for g in heads) == ["invertible"] * 2 + ["rotary-scaled"] * 2
        assert {spec.rotary[g] for g in heads if g in spec.rotary} == {("half", 4)}
        assert sorted(spec.groups[g] for g in heads) == [8, 8, 8, 8]
    else:
        assert all(kinds[g] == "invertible" for g in heads)
    mlps = [g for g, k in kinds.items() if k == "permutation" and spec.groups[g] > 16]
    assert len(mlps) == 2, str(report)  # an activation (GELU, SiLU gate) acts on them
    assert all("changes the outputs" in report.reasons[g] for g in mlps)


def test_readers_and_keys_are_the_dual_places(found):
    """Output projections read the value/output group (dual); of the query/key group's
    two writers, the key side is dual — and nothing of the stream or the queries is."""
    name, _model, _x, report, _ = found
    spec = report.spec
    dual_tensors = {n for n, _, _ in spec.duals}
    if name == "llama":  # no biases: the key rows and the output projection's columns
        assert dual_tensors == {
            f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in "ko"
        }
        assert all(axis == (1 if ".o_proj" in n else 0) for n, axis, _ in spec.duals)
        return
    assert len(spec.duals) == 2 * 3  # per block: the key weight and bias, the output weight
    for n, axis, segment in spec.duals:
        group = spec.segments(n, axis)[segment][0]
        assert group in spec.heads and spec.kind(group) == "invertible"
    if name == "gpt2-untied":  # fused c_attn: segment 1 (keys) of the q/k group is dual
        assert ("transformer.h.0.attn.c_attn.weight", 1, 1) in spec.duals
        assert ("transformer.h.0.attn.c_attn.weight", 1, 0) not in spec.duals
        assert ("transformer.h.0.attn.c_proj.weight", 0, 0) in spec.duals
    else:
        assert any("k" in n.rsplit(".", 2)[-2] for n in dual_tensors)
        assert not any("q" in n.rsplit(".", 2)[-2] for n in dual_tensors)


def test_a_random_transform_keeps_the_function_to_1e_10(found):
    _, model, x, report, _ = found
    spec = report.spec
    params = {k: v.detach() for k, v in model.state_dict().items()}
    folded = fold_norms(spec, params)
    assert relative_error(model, params, folded, x) < 1e-12
    for seed in range(3):
        transform = Transform.random(spec, seed)
        assert any(transform.is_matrix(g) for g in spec.groups)
        moved = transform.apply(folded)
        assert relative_error(model, params, moved, x) < 1e-10
        back = transform.inverse().apply(moved)
        assert max((back[k] - folded[k]).abs().max().item() for k in folded) < 1e-12


def test_a_transform_of_unfolded_gains_is_refused(found):
    _, model, _x, report, _ = found
    params = {k: v.detach() for k, v in model.state_dict().items()}
    with pytest.raises(Exception, match="fold it first"):
        Transform.random(report.spec, 0).apply(params)


def test_unfolding_with_the_original_gains_restores_the_layout(found):
    _, model, x, report, _ = found
    spec = report.spec
    params = {k: v.detach() for k, v in model.state_dict().items()}
    folded = fold_norms(spec, params)
    restored = unfold_norms(spec, folded, {k: params[k] for k in spec.folds})
    assert max((restored[k] - params[k]).abs().max().item() for k in params) < 1e-12
    # the original layout of a rotated model: the same function, gains not ones
    moved = Transform.random(spec, 1).apply(folded)
    laid_out = unfold_norms(spec, moved, {k: params[k] for k in spec.folds})
    assert relative_error(model, params, laid_out, x) < 1e-10
    assert all(torch.equal(laid_out[k], params[k]) for k in spec.folds)


def test_a_post_ln_or_tied_stream_stays_a_permutation_group_and_says_why():
    torch.manual_seed(0)
    model, ids = _gpt2(tied=True)
    model = randomized_norms(model.double().eval())
    report = symmetry_kinds(model, ids, trace(model, ids))
    stream = report.spec.axes["transformer.wte.weight"][1]
    assert report.spec.kind(stream) == "permutation"
    assert "tied to" in report.reasons[stream] and "lm_head.weight" in report.reasons[stream]
    bert = T.BertForSequenceClassification(
        T.BertConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=24,
            max_position_embeddings=12,
            num_labels=3,
        )
    ).double()
    report = symmetry_kinds(bert, ids, trace(bert, ids))
    stream = report.spec.axes["bert.embeddings.word_embeddings.weight"][1]
    assert report.spec.kind(stream) == "permutation"
    assert "post-LN" in report.reasons[stream]


def test_huggingface_llama_as_written_keeps_its_float32_rms_norm_rounding():
    """Without the patch the check runs at the float32 of Llama's own cast: the stream is
    still found orthogonal, and the function kept to float32 rounding."""
    torch.manual_seed(0)
    model, ids = _llama(cast_free=False)
    model = randomized_norms(model.double().eval())
    report = symmetry_kinds(model, ids, trace(model, ids))
    stream = report.spec.axes["model.embed_tokens.weight"][1]
    assert report.spec.kind(stream) == "orthogonal"
    params = {k: v.detach() for k, v in model.state_dict().items()}
    moved = Transform.random(report.spec, 0).apply(fold_norms(report.spec, params))
    assert relative_error(model, params, moved, ids) < 1e-5


def relu_gpt2_config():
    """A tiny untied GPT-2 whose MLPs use ReLU (so their units admit positive scalings)."""
    return T.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=12, use_cache=False,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, activation_function="relu",
    )  # fmt: skip


def _relu_models():
    torch.manual_seed(0)
    gpt2 = T.GPT2LMHeadModel(relu_gpt2_config())
    mlp = build_model("mlp", hidden=(24, 24))
    return {
        "gpt2-relu": (gpt2, torch.randint(0, 40, (3, 7)), 2),
        "zoo-mlp": (mlp, torch.randn(5, 1, 28, 28), 2),
    }


@pytest.mark.parametrize("name", ["gpt2-relu", "zoo-mlp"])
def test_relu_hidden_units_take_positive_scalings(name):
    model, x, hidden_groups = _relu_models()[name]
    model = randomized_norms(model.double().eval())
    x = x.double() if x.is_floating_point() else x
    spec = trace(model, x)
    report = symmetry_kinds(model, x, spec)
    scaling = [g for g in report.spec.groups if report.spec.kind(g) == "scaling"]
    assert len(scaling) == hidden_groups, str(report)
    params = {k: v.detach() for k, v in model.state_dict().items()}
    folded = fold_norms(report.spec, params)
    for seed in range(2):
        transform = Transform.random(report.spec, seed)
        moved = transform.apply(folded)
        assert relative_error(model, params, moved, x) < 1e-10
        scales = transform[scaling[0]]
        assert scales.ndim == 2 and (scales.max(1).values - 1).abs().max() > 0.1  # not ±1
    # the scales are undone by the readers: without them (duals dropped) it breaks
    from dataclasses import replace

    one_sided = replace(report.spec, duals=frozenset())
    moved = Transform.random(one_sided, 0).apply(fold_norms(one_sided, params))
    assert relative_error(model, params, moved, x) > 1e-3


def test_invertible_head_maps_need_their_dual_side(found):
    """An invertible map applied alike to writers and readers (duals forgotten) changes
    the function: the dual side is what makes it a symmetry."""
    from dataclasses import replace

    _name, model, x, report, _ = found
    params = {k: v.detach() for k, v in model.state_dict().items()}
    one_sided = replace(report.spec, duals=frozenset())
    moved = Transform.random(one_sided, 0).apply(fold_norms(one_sided, params))
    assert relative_error(model, params, moved, x) > 1e-3


def test_matrices_of_the_new_kinds_are_checked():
    from dataclasses import replace

    from lmckit.perm import PermutationSpec

    spec = PermutationSpec(
        {"h": 3, "v": 4},
        {"w1": ("h", None), "w2": (None, "h"), "v1": ("v", None), "v2": (None, "v")},
        kinds={"h": "scaling", "v": "invertible"},
        duals={("w2", 1, 0), ("v2", 1, 0)},
    )
    ok = Transform.random(spec, 0)
    with pytest.raises(Exception, match="positive entries"):
        ok.replace(h=-ok["h"])
    with pytest.raises(Exception, match="positive entries"):
        ok.replace(h=torch.ones(3, 3, dtype=torch.float64))
    singular = torch.ones(4, 4, dtype=torch.float64)
    with pytest.raises(Exception, match="singular"):
        ok.replace(v=singular)
    params = {k: torch.randn(*(3, 5) if k[0] == "w" else (4, 5)) for k in ("w1", "v1")}
    params |= {"w2": torch.randn(5, 3), "v2": torch.randn(5, 4)}
    params = {k: v.double() for k, v in params.items()}
    moved = ok.apply(params)
    # closed form: writers M W, readers W M⁻¹, so the products are unchanged
    for w, r in (("w1", "w2"), ("v1", "v2")):
        assert torch.allclose(moved[r] @ moved[w], params[r] @ params[w], atol=1e-12)
    back = ok.inverse().apply(moved)
    assert all(torch.allclose(back[k], params[k], atol=1e-12) for k in params)
    composed = ok.compose(ok.inverse())
    assert all(torch.allclose(composed.matrix(g), torch.eye(spec.groups[g]).double()) for g in "hv")
    with pytest.raises(Exception, match="segment"):
        replace(spec, duals={("w2", 1, 3)})
    with pytest.raises(Exception, match="no group acts"):
        replace(spec, duals={("w2", 0, 0)})
    with pytest.raises(Exception, match="head-structured"):
        PermutationSpec(
            {"q": 4}, {"wq": ("q", None)}, heads={"q": ("q", 2)}, kinds={"q": "scaling"}
        )


def _one_block_gpt2(width: int):
    """A float64 GPT-2 of one block, its norms randomized, and a batch of token ids."""
    torch.manual_seed(0)
    config = T.GPT2Config(
        vocab_size=40, n_embd=width, n_layer=1, n_head=4, n_positions=12, use_cache=False,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    model = randomized_norms(T.GPT2LMHeadModel(config).double().eval())
    return model, torch.randint(0, 40, (2, 7))


def test_a_probe_that_keeps_the_outputs_still_leaves_the_kind_to_the_full_map():
    """Wide groups are first probed with a map of a few units (cheap rejections); a probe
    that passes decides nothing. Every probe made one that keeps anything (the identity):
    the full random maps still find the GPT-2 MLP's GELU units a permutation group."""
    from lmckit.tracing import kinds as kinds_module

    model, x = _one_block_gpt2(width=64)
    spec = trace(model, x)
    (hidden,) = [g for g, n in spec.groups.items() if n == 256]
    probe_map, probed = kinds_module._probe_map, []

    def probe_keeping_everything(spec, group, kind, generator):
        drawn = probe_map(spec, group, kind, generator)
        if drawn is None:
            return None
        probed.append((group, kind))
        return tuple(torch.eye(len(m), dtype=m.dtype) for m in drawn)

    kinds_module._probe_map = probe_keeping_everything
    try:
        report = symmetry_kinds(model, x, spec)
    finally:
        kinds_module._probe_map = probe_map
    assert any(g == hidden for g, _ in probed)
    assert report.spec.kind(hidden) == "permutation" and hidden in report.reasons, str(report)


def test_probing_wide_groups_finds_the_kinds_the_full_maps_find():
    """The probe only rejects, with an element of the kind: on a GPT-2 whose stream (256)
    and MLP (1,024) are probed, the kinds, layouts and reasons equal those of full maps
    alone — the stream still orthogonal-mean-free, the MLP still permuted."""
    from lmckit.tracing import kinds as kinds_module

    model, x = _one_block_gpt2(width=256)
    spec = trace(model, x)
    probed = symmetry_kinds(model, x, spec)
    probe_map, kinds_module._probe_map = kinds_module._probe_map, lambda *a: None
    try:
        full = symmetry_kinds(model, x, spec)
    finally:
        kinds_module._probe_map = probe_map
    assert probed.spec.kinds == full.spec.kinds and probed.reasons == full.reasons
    wide = [
        g for g, n in spec.groups.items() if n >= kinds_module.PROBE_FROM and g not in spec.heads
    ]
    assert {probed.spec.kind(g) for g in wide} == {"orthogonal-mean-free", "permutation"}
