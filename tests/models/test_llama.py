"""The zoo's Llama-style decoder: the same function as Hugging Face's ``LlamaForCausalLM``
given the same weights (an independent implementation); causal; traced to the stream, the
SwiGLU hidden units and grouped-query rotary heads; every element of its whole symmetry group
keeps the logits in float64; planted elements recovered by WM and ``wm-orth``."""

import pytest
import torch
import transformers as T

from lmckit.errors import ModelConfigError
from lmckit.match import METHODS
from lmckit.models import build_model, permutation_spec
from lmckit.tracing import symmetry_kinds
from lmckit.transform import Transform, fold_norms, orthogonal_subgroup
from lmckit.workflows.training import model_config_for
from tests.data.test_text import write_tree
from tests.zoo import moving_permutation, planted_recovery

SMALL = {"vocab_size": 50, "context": 12, "dim": 16, "depth": 2, "heads": 4, "kv_heads": 2,
         "mlp_dim": 24}  # fmt: skip


def nontrivial_gains(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (
                name.endswith("norm1.weight")
                or name.endswith("norm2.weight")
                or name == "norm.weight"
            ):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    model = nontrivial_gains(build_model("llama", **SMALL)).double().eval()
    return model, permutation_spec(model)


def tokens(n=3, length=12, seed=0):
    return torch.randint(0, 50, (n, length), generator=torch.Generator().manual_seed(seed))


def _hf_twin(model):
    """``LlamaForCausalLM`` of the same shape with the zoo model's weights copied in."""
    c = model.config
    config = T.LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["dim"], intermediate_size=c["mlp_dim"],
        num_hidden_layers=c["depth"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], max_position_embeddings=c["context"],
        rope_theta=c["rope_base"], rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    hf = T.LlamaForCausalLM(config).double().eval()
    names = {"tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}  # fmt: skip
    for i in range(c["depth"]):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        for a, b in (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm"),
                     ("attn.q", "self_attn.q_proj"), ("attn.k", "self_attn.k_proj"),
                     ("attn.v", "self_attn.v_proj"), ("attn.o", "self_attn.o_proj"),
                     ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"),
                     ("down", "mlp.down_proj")):  # fmt: skip
            names[ours + a + ".weight"] = theirs + b + ".weight"
    state = model.state_dict()
    assert sorted(names) == sorted(state)  # every weight of ours has its place in theirs
    hf.load_state_dict({names[k]: v for k, v in state.items()}, strict=True)
    return hf


def test_it_computes_what_hugging_face_llama_computes(llama):
    model, _ = llama
    hf = _hf_twin(model)
    x = tokens()
    with torch.no_grad():
        ours, theirs = model(x), hf(input_ids=x).logits
    assert ours.shape == (3, 12, 50)
    # Hugging Face builds its rotary tables in float32 whatever the model's precision
    assert ((ours - theirs).norm() / theirs.norm()).item() < 1e-6


def test_a_position_sees_only_itself_and_the_past(llama):
    model, _ = llama
    x = tokens()
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 50
    with torch.no_grad():
        out, out_changed = model(x), model(changed)
        assert torch.allclose(model(x[:, :5]), out[:, :5], atol=1e-12)
    assert torch.allclose(out[:, :7], out_changed[:, :7], atol=1e-12)
    assert not torch.allclose(out[:, 7:], out_changed[:, 7:], atol=1e-3)


def test_the_spec_holds_grouped_query_rotary_heads(llama):
    model, spec = llama
    kinds = symmetry_kinds(model, tokens(2), spec).spec
    # the stream; per layer the q/k, v/o and MLP groups and the query heads inside their
    # key/value group (2 key/value heads × 2 query heads)
    assert len(spec.groups) == 1 + 4 * 2
    for i in range(2):
        qk = spec.axes[f"blocks.{i}.attn.k.weight"][0]
        vo = spec.axes[f"blocks.{i}.attn.v.weight"][0]
        # two key/value heads of 8 units, each moving with its two query heads
        assert spec.heads[qk] == spec.heads[vo] == (qk, 2)
        assert spec.head_repeats[f"blocks.{i}.attn.q.weight"] == (2, 1)
        assert spec.head_repeats[f"blocks.{i}.attn.o.weight"] == (1, 2)
        assert qk in spec.pinned and vo not in spec.pinned
        (copies,) = (c for c, tie in spec.copies.items() if tie == qk)
        assert spec.groups[copies] == 4 and kinds.kind(copies) == "permutation"
        assert kinds.kind(qk) == "rotary-scaled" and kinds.rotary[qk] == ("half", 4)
        assert kinds.kind(vo) == "invertible"
        assert spec.groups[spec.axes[f"blocks.{i}.gate.weight"][0]] == 24
    assert kinds.kind(spec.axes["head.weight"][1]) == "orthogonal"


def test_every_element_of_the_whole_group_keeps_the_logits(llama):
    model, spec = llama
    kinds = symmetry_kinds(model, tokens(2), spec).spec
    params = fold_norms(kinds, {k: v.clone() for k, v in model.state_dict().items()})
    x = tokens()
    out = torch.func.functional_call(model, params, (x,))
    for seed in range(3):
        element = Transform.random(kinds, seed)
        moved = element.apply(params)
        assert not torch.allclose(moved["blocks.0.attn.q.weight"], params["blocks.0.attn.q.weight"])
        assert not torch.allclose(moved["blocks.0.attn.o.weight"], params["blocks.0.attn.o.weight"])
        again = torch.func.functional_call(model, moved, (x,))
        assert ((again - out).norm() / out.norm()).item() < 1e-10
    permuted = moving_permutation(spec, 3).apply(dict(model.state_dict()))
    again = torch.func.functional_call(model, permuted, (x,))
    assert ((again - out).norm() / out.norm()).item() < 1e-10


def test_weight_matching_recovers_a_planted_permutation(llama):
    model, spec = llama
    planted_recovery(model, spec, restarts=5)


def test_orthogonal_matching_undoes_a_planted_element_of_the_distance_keeping_group(llama):
    model, spec = llama
    x = tokens(2)
    kinds = symmetry_kinds(model, x, spec).spec
    a = fold_norms(kinds, {k: v.clone() for k, v in model.state_dict().items()})
    b = Transform.random(orthogonal_subgroup(kinds), 7).inverse().apply(a)
    start = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    found = METHODS["wm-orth"](kinds, a, b, model=model, example_inputs=(x,))
    aligned = found.alignment.apply(b)
    left = sum(float(((a[k] - aligned[k]) ** 2).sum()) for k in a) ** 0.5
    assert start > 1 and left < 1e-8 * start


def test_configurations_and_inputs_are_checked(tmp_path):
    from lmckit.data.text import load_code_corpus

    with pytest.raises(ModelConfigError, match="kv_heads 3 does not divide heads 4"):
        build_model("llama", **{**SMALL, "kv_heads": 3})
    with pytest.raises(ModelConfigError, match="must be even"):
        build_model("llama", **{**SMALL, "dim": 12})  # heads of 3
    with pytest.raises(ModelConfigError, match="rope_base"):
        build_model("llama", **{**SMALL, "rope_base": 1.0})
    model = build_model("llama", **SMALL)
    with pytest.raises(ValueError, match="exceed the context of 12"):
        model(tokens(length=13))
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.zeros(2, 5))
    write_tree(tmp_path)
    data = load_code_corpus(tmp_path, context=32)
    assert model_config_for("llama", data, width_multiplier=0.25) == {
        "vocab_size": 256, "context": 32, "dim": 32, "mlp_dim": 88,
    }  # fmt: skip
    assert model_config_for("gpt", data, width_multiplier=0.25)["mlp_dim"] == 128
