"""lmckit.tracing.trace on Hugging Face models (small configs, random weights, no downloads):
each traced spec is verified by the tracer itself, and WM must recover a planted
permutation of it exactly."""

import math

import pytest
import torch
import torch.nn.functional as F

from lmckit.tracing import trace_report
from tests.zoo import moving_permutation, planted_recovery

T = pytest.importorskip("transformers", reason="a dev dependency: pip install -e '.[dev]'")

SMALL = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def bert():
    config = T.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=24, max_position_embeddings=12, num_labels=3, **SMALL,
    )  # fmt: skip
    return T.BertForSequenceClassification(config), torch.randint(0, 40, (3, 7))


def gpt2():
    config = T.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=12, use_cache=False,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
    )  # fmt: skip
    return T.GPT2LMHeadModel(config), torch.randint(0, 40, (3, 7))


def vit():
    config = T.ViTConfig(
        image_size=28, patch_size=7, num_channels=1, hidden_size=16, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=24, num_labels=10, **SMALL,
    )  # fmt: skip
    return T.ViTForImageClassification(config), torch.randn(3, 1, 28, 28)


@pytest.fixture(scope="module", params=[bert, gpt2, vit], ids=["bert", "gpt2", "vit"])
def traced(request):
    torch.manual_seed(0)
    model, inputs = request.param()
    return request.param.__name__, model, trace_report(model, inputs)


def test_the_residual_stream_and_every_mlp_are_groups(traced):
    _, model, report = traced
    spec = report.spec
    layers = model.config.num_hidden_layers
    hidden = model.config.hidden_size
    streams = [g for g, n in spec.groups.items() if n == hidden]
    mlps = [g for g, n in spec.groups.items() if n == model.config.to_dict().get(
        "intermediate_size", 4 * hidden) or n == 4 * hidden]  # fmt: skip
    assert len(mlps) == layers, str(report)
    # one residual stream through every block (BERT adds its pooler's own group)
    stream = max(streams, key=lambda g: len(spec.group_axes(g)))
    assert len(spec.group_axes(stream)) > 10 * layers
    assert report.checked_modes == ("eval", "train")
    assert 0.9 < report.permuted_fraction <= 1.0


def test_gpt2_ties_its_head_to_its_embedding():
    report = trace_report(*gpt2())
    axes = report.spec.axes
    assert report.aliases == {"lm_head.weight": "transformer.wte.weight"}
    assert axes["lm_head.weight"] == axes["transformer.wte.weight"]
    assert axes["lm_head.weight"][0] is None and axes["lm_head.weight"][1] is not None
    # the fused query/key/value projection: a direct sum of query ⊕ key (one group, 4
    # heads of 4) and value (another, moving with the output projection's input)
    spec = report.spec
    qk, qk_again, vo = axes["transformer.h.0.attn.c_attn.weight"][1]
    assert qk == qk_again != vo and spec.groups[qk] == spec.groups[vo] == 16
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 4
    assert "transformer.h.0.attn.c_attn.weight" not in spec.blocks
    assert axes["transformer.h.0.attn.c_proj.weight"][0] == vo


def test_a_planted_permutation_is_recovered(traced):
    _, model, report = traced
    planted_recovery(model, report.spec)


def test_gpt2_traces_with_its_default_cache_setting():
    """A GPT-2 config as users have it (``use_cache=True``) returns a ``DynamicCache`` that
    torch.export cannot return; the trace runs without the cache and finds the same spec."""
    config = T.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=12, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    assert config.use_cache
    torch.manual_seed(0)
    model, ids = T.GPT2LMHeadModel(config), torch.randint(0, 40, (3, 7))
    report = trace_report(model, ids)
    assert report.spec.axes == trace_report(*gpt2()).spec.axes
    assert model.config.use_cache  # the model is left as it was
    planted_recovery(model, report.spec)


def test_t5_is_traced_as_its_logits_with_cross_attention_heads_that_move():
    """T5's cross-attention adds a position bias of zeros made in forward (it used to freeze
    those heads), and T5 also returns the encoder's last hidden state: its function is its
    logits (the default for outputs holding ``logits``); asked to keep every output, the
    encoder's residual stream freezes."""
    torch.manual_seed(0)
    config = T.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4,
        decoder_start_token_id=0,
    )  # fmt: skip
    model = T.T5ForConditionalGeneration(config)
    ids = torch.randint(0, 40, (3, 7))
    inputs = {"input_ids": ids, "decoder_input_ids": ids}
    report = trace_report(model, (), example_kwargs=inputs)
    assert report.unknown_ops == () and report.checked_modes == ("eval", "train")
    assert report.permuted_fraction > 0.999, str(report)  # 0.72 before
    axes = report.spec.axes
    cross = axes["decoder.block.0.layer.1.EncDecAttention.q.weight"][0]
    assert cross is not None and report.spec.heads[cross][1] == 4
    assert axes["encoder.block.0.layer.1.DenseReluDense.wo.weight"][0] is not None
    planted_recovery(model, report.spec)
    every = trace_report(model, (), example_kwargs=inputs, outputs=lambda out: out)
    assert every.frozen["encoder.block.0.layer.1.DenseReluDense.wo.weight"][0] == "model output"
    assert 0.9 < every.permuted_fraction < 0.95


def test_mobilenet_v2_is_covered_through_its_padding_and_depthwise_convolutions():
    torch.manual_seed(0)
    config = T.MobileNetV2Config(image_size=32, depth_multiplier=0.35, num_labels=10)
    model = T.MobileNetV2ForImageClassification(config)
    report = trace_report(model, torch.randn(3, 3, 32, 32))
    assert report.unknown_ops == () and report.checked_modes == ("eval", "train")
    assert report.permuted_fraction >= 0.9, str(report)  # 0.38 before pad had a rule
    axes = report.spec.axes
    expand = axes["mobilenet_v2.layer.1.expand_1x1.convolution.weight"][0]
    assert expand is not None  # frozen before
    # the depthwise convolution after it moves its channels with the expansion
    assert axes["mobilenet_v2.layer.1.conv_3x3.convolution.weight"][0] == expand
    # (No planted-recovery check here: WM's coordinate descent from the identity stops in a
    # local optimum on this random-initialised MobileNetV2 — distance 14.9 where the planted
    # permutation gives 0, from 17.7 — a finding for the checkpoint-scale work, not a
    # property of the spec, which the trace verified above.)


IDS = (3, 7)


def _ids(vocab=40):
    return torch.randint(0, vocab, IDS)


# (factory, least share of parameters in permuted tensors, WM recovers a planted permutation)
MORE = {
    "distilbert": (lambda: (T.DistilBertForSequenceClassification(T.DistilBertConfig(
        vocab_size=40, dim=16, n_layers=2, n_heads=4, hidden_dim=24,
        max_position_embeddings=12)), _ids()), 1.0, True),
    "roberta": (lambda: (T.RobertaForSequenceClassification(T.RobertaConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=24, max_position_embeddings=20, pad_token_id=1, bos_token_id=0,
        eos_token_id=2)), _ids(37) + 3), 1.0, True),
    "mistral": (lambda: (T.MistralForCausalLM(T.MistralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        bos_token_id=0, eos_token_id=0)), _ids()), 1.0, True),
    "qwen2-tied": (lambda: (T.Qwen2ForCausalLM(T.Qwen2Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)), _ids()), 1.0, True),
    # the rotary decoders of issue 59 (query/key head dimensions still frozen by rotary;
    # value/output heads move, under grouped-query attention with a head repeat)
    "qwen3-qk-norm": (lambda: (T.Qwen3ForCausalLM(T.Qwen3Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        max_position_embeddings=16)), _ids()), 0.99, True),
    "gemma": (lambda: (T.GemmaForCausalLM(T.GemmaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=16)), _ids()), 1.0, True),
    "phi-partial-rotary": (lambda: (T.PhiForCausalLM(T.PhiConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, partial_rotary_factor=0.5)),
        _ids()), 0.99, True),
    "gpt-neox": (lambda: (T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, rotary_pct=0.5)), _ids()),
        1.0, True),
    "gptj-interleaved-rotary": (lambda: (T.GPTJForCausalLM(T.GPTJConfig(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=16, rotary_dim=4,
        bos_token_id=0, eos_token_id=0)), _ids()), 0.99, True),
    # mixtures of experts beside Mixtral (their experts through transformers' interface)
    "qwen2-moe-shared-expert": (lambda: (T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12,
        shared_expert_intermediate_size=20)), _ids()), 1.0, 1),
    "olmoe": (lambda: (T.OlmoeForCausalLM(T.OlmoeConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        num_experts=4, num_experts_per_tok=2)), _ids()), 1.0, 1),
    # coordinate descent alone stopped in a local optimum here (the experts and one hidden
    # permutation shared by them coupled: distance 1.31 of 2.43 left); WM now solves the
    # subgroup sharing one permutation inside the experts first, where swaps of the experts
    # with the hidden units solved anew find it, then each expert's own, from one start
    "qwen3-moe": (lambda: (T.Qwen3MoeForCausalLM(T.Qwen3MoeConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=12, head_dim=4)),
        _ids()), 0.99, 1),
    "mistral-one-key-value-head": (lambda: (T.MistralForCausalLM(T.MistralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=16)),
        _ids()), 1.0, 1),
    "phi3-fused-qkv": (lambda: (T.Phi3ForCausalLM(T.Phi3Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        pad_token_id=0)), _ids()), 1.0, 1),
    # (read as its logits: its encoder's last hidden state is an output too)
    "bart": (lambda: (T.BartForConditionalGeneration(T.BartConfig(
        vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=24,
        decoder_ffn_dim=24, max_position_embeddings=16)), _ids()), 0.995, True),
    "convnext": (lambda: (T.ConvNextForImageClassification(T.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1],
        num_labels=10)), torch.randn(3, 3, 32, 32)), 0.99, True),
    # WM stops in a local optimum on this random bottleneck ResNet (distance 6.0 where the
    # planted permutation gives 0, from 17.3), as on MobileNetV2: reported, not asserted
    "resnet-bottleneck": (lambda: (T.ResNetForImageClassification(T.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1],
        layer_type="bottleneck", num_labels=10)), torch.randn(3, 3, 32, 32)), 0.99, False),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MORE))
def test_more_architectures_trace_verified_with_planted_recovery(name):
    make, least, recovers = MORE[name]
    torch.manual_seed(0)
    model, inputs = make()
    report = trace_report(model, inputs)
    assert report.checked_modes == ("eval", "train")
    assert report.permuted_fraction >= least - 1e-3, str(report)
    # a group the check refused falls back to whole blocks, which the share above may not
    # notice (Qwen3 lost every head group to a copies group on its output columns alone)
    assert "failed the equivalence check" not in str(report), str(report)
    if recovers:
        planted_recovery(model, report.spec, restarts=int(recovers))


@pytest.mark.parametrize("make", [bert, vit], ids=["bert", "vit"])
def test_separate_query_key_value_projections_give_head_groups(make):
    torch.manual_seed(0)
    model, inputs = make()
    spec = trace_report(model, inputs).spec
    heads, hidden = model.config.num_attention_heads, model.config.hidden_size
    ties = spec.head_ties()
    assert len(ties) == model.config.num_hidden_layers
    for qk, vo in ties.values():  # spec order: the query projection comes first
        assert spec.groups[qk] == spec.groups[vo] == hidden
        assert spec.heads[qk][1] == spec.heads[vo][1] == heads
        qk_members = {k.split(".")[-2] for k, _ in spec.group_axes(qk) if k.endswith("weight")}
        vo_members = {(k.split(".")[-2], i) for k, i in spec.group_axes(vo) if k.endswith("weight")}
        assert qk_members in ({"query", "key"}, {"q_proj", "k_proj"})
        assert vo_members in ({("value", 0), ("dense", 1)}, {("v_proj", 0), ("o_proj", 1)})


def test_llama_grouped_query_attention_moves_key_value_groups_with_their_query_heads():
    """Llama: RMSNorm computed in float32 whatever the weights (the check's tolerance follows
    that cast), rotary embeddings (query/key head dimensions frozen), 4 query heads sharing
    2 key/value heads: the group is the 2 key/value groups, query heads move in blocks of 2;
    each key/value head's value dimensions move by their own permutation, on the output
    projection's columns of both query heads of the group alike (a head repeat of 2)."""
    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12,
        use_cache=False,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config)
    report = trace_report(model, torch.randint(0, 40, (3, 7)))
    spec = report.spec
    layer = "model.layers.0.self_attn"
    q, k, v, o = (f"{layer}.{p}_proj.weight" for p in "qkvo")
    # the query/key dimensions: the 2 key/value heads of 4, each once per query head on
    # the queries, pinned (rotate_half slices them: the heads move whole)
    qk = spec.axes[k][0]
    assert spec.groups[qk] == 2 * 4 and spec.axes[q][0] == qk and qk in spec.pinned
    assert spec.head_repeats[q] == (2, 1) and spec.head_repeat(k, 0) == 1
    assert report.whole_blocks[qk].startswith("sliced")
    value = spec.axes[v][0]
    assert spec.axes[o][1] == value and spec.groups[value] == 2 * 4  # 2 heads × 4 dims
    assert spec.heads[value] == spec.heads[qk] and spec.heads[value][1] == 2
    assert value not in spec.pinned
    assert spec.head_repeats[o] == (1, 2) and spec.head_repeat(v, 0) == 1
    # the 2 query heads of each key/value head may trade places: a copies group of 2 × 2
    (copies,) = (c for c, tie in spec.copies.items() if tie == spec.heads[qk][0])
    assert spec.groups[copies] == 4 and spec.copies_axes(copies) == ((q, 0), (o, 1))
    assert report.checked_modes == ("eval", "train")
    planted_recovery(model, spec)  # weight matching: the copies too
    # activation matching finds the value dimensions too (at the value projection's output)
    from lmckit.data import TensorLoader
    from lmckit.match import activation_matching
    from tests.zoo import moving_permutation

    model = model.double().eval()
    x = torch.randint(0, 40, (48, 7), generator=torch.Generator().manual_seed(2))
    a = {k: t.detach().clone() for k, t in model.state_dict().items()}
    truth = moving_permutation(spec, 7)
    # the query heads inside their key/value group too, at the query projection's output
    # and the output projection's input (the graph's copies sites)
    assert all(not truth[c].equal(torch.arange(spec.groups[c])) for c in spec.copies)
    assert set(report.copies_sites) == set(spec.copies)
    data = TensorLoader(x, torch.roll(x, -1, 1), batch_size=16)
    found = activation_matching(spec, a, truth.inverse().apply(a), model=model, data=data)
    assert found.alignment == truth and found.info["copies_in_place"] == []


def test_a_diffusers_unet_traces_through_its_upsampling_and_skip_connections():
    diffusers = pytest.importorskip("diffusers", reason="a dev dependency")
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
    )  # fmt: skip
    inputs = (torch.randn(2, 3, 16, 16), torch.tensor([1, 10]))
    report = trace_report(model, inputs, outputs=lambda out: out.sample)
    assert report.unknown_ops == () and report.checked_modes == ("eval", "train")
    # 90.2 % while upsampling had no rule; what stays frozen is where a skip connection is
    # concatenated under a GroupNorm whose groups straddle the two parts (no permutation of
    # either part alone keeps the norm's groups)
    assert report.permuted_fraction >= 0.96, str(report)
    frozen = {why for reasons in report.frozen.values() for why in reasons if why}
    assert not any("resampling" in why and "no rule" in why for why in frozen)
    assert any("direct sum" in why for why in frozen)
    planted_recovery(model, report.spec)


def _mixtral(seed: int = 0):
    torch.manual_seed(seed)
    return T.MixtralForCausalLM(T.MixtralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        num_local_experts=4, num_experts_per_tok=2,
    ))  # fmt: skip


def test_mixtral_experts_move_with_their_router_rows():
    """Mixtral's experts are a group: the router's rows and each expert's slice of the fused
    expert tensors, followed from ``topk``'s indices to ``weight[idx]`` (traced and checked,
    in float64, in the batched form of its experts — its default grouped form sorts tokens
    by expert, which no rule follows, and takes no float64). The stream is whole again
    (100 % of the parameters) and its kinds are found; the grouped form, as the model runs,
    keeps its function under a random element too; planted experts are recovered."""
    from lmckit.functional import forward
    from lmckit.perm import Permutation

    model = _mixtral()
    report = trace_report(model, _ids())
    assert model.config._experts_implementation == "grouped_mm"  # restored
    assert report.precision == "float64" and report.checked_modes == ("eval", "train")
    assert report.batched_experts == ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts")
    assert report.permuted_fraction == 1.0, str(report)
    spec = report.spec
    for layer in range(2):
        mlp = f"model.layers.{layer}.mlp"
        experts = spec.axes[f"{mlp}.gate.weight"][0]
        assert spec.groups[experts] == 4
        # the experts are the heads of their hidden units: the router's rows move with them,
        # the fused tensors' experts axis with the hidden units' tie (head_axes)
        assert spec.group_axes(experts) == ((f"{mlp}.gate.weight", 0),)
        hidden = spec.axes[f"{mlp}.experts.down_proj"][2]
        assert spec.groups[hidden] == 4 * 24 and spec.heads[hidden] == (experts, 4)
        assert spec.heads[experts] == (experts, 4)
        assert spec.axes[f"{mlp}.experts.gate_up_proj"][:2] == (None, (hidden, hidden))
        assert spec.head_axes[f"{mlp}.experts.gate_up_proj"] == (0, 1)
        assert spec.head_axes[f"{mlp}.experts.down_proj"] == (0, 2)
        assert report.activation_sites[hidden][0][0].endswith("@each4")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    x = _ids()
    moved = Permutation.random(spec, 5).apply(state)
    with torch.no_grad():
        before, after = forward(model, state, x), forward(model, moved, x)
    assert (before - after).abs().max() < 1e-5 * before.abs().max()
    # each expert's hidden units permuted alone, by hand (expert 2's units reversed, the
    # rest in place), keep the function; the same reversal on one expert's gate rows only
    # (not its up rows and down columns) does not
    apart = dict(state)
    experts = "model.layers.0.mlp.experts"
    gate_up, down = (state[f"{experts}.{n}"] for n in ("gate_up_proj", "down_proj"))
    reverse = torch.arange(23, -1, -1)
    apart["model.layers.0.mlp.experts.gate_up_proj"] = gate_up.clone()
    apart["model.layers.0.mlp.experts.gate_up_proj"][2] = torch.cat(
        [gate_up[2, :24][reverse], gate_up[2, 24:][reverse]]
    )
    apart["model.layers.0.mlp.experts.down_proj"] = down.clone()
    apart["model.layers.0.mlp.experts.down_proj"][2] = down[2][:, reverse]
    with torch.no_grad():
        assert (forward(model, apart, x) - before).abs().max() < 1e-5 * before.abs().max()
    half = dict(apart, **{"model.layers.0.mlp.experts.down_proj": down})
    with torch.no_grad():
        assert (forward(model, half, x) - before).abs().max() > 1e-3 * before.abs().max()
    hidden = spec.axes["model.layers.0.mlp.experts.down_proj"][2]
    sigma = Permutation.random(spec, 5)[hidden].view(4, 24) % 24
    assert len({tuple(row.tolist()) for row in sigma}) == 4  # a different σ per expert
    # the experts moved without their router rows change the outputs: the tie is needed
    alone = dict(state)
    for name in ("gate_up_proj", "down_proj"):
        key = f"model.layers.0.mlp.experts.{name}"
        alone[key] = state[key][[1, 0, 3, 2]]
    with torch.no_grad():
        assert (forward(model, alone, x) - before).abs().max() > 1e-2 * before.abs().max()
    planted_recovery(model, spec)
    from lmckit.tracing import symmetry_kinds
    from lmckit.transform import fold_norms

    kinds = symmetry_kinds(model, x, spec).spec
    assert kinds.kind(spec.axes["model.embed_tokens.weight"][1]) == "orthogonal"
    assert kinds.kind(spec.axes["model.layers.0.mlp.gate.weight"][0]) == "permutation"
    assert kinds.kind(spec.axes["model.layers.0.self_attn.o_proj.weight"][1]) == "invertible"
    double = _mixtral().double().eval()
    a = fold_norms(kinds, {k: v.detach() for k, v in double.state_dict().items()})
    _wm_orth_undoes_a_planted_element(double, kinds, a, x)


def test_weight_matching_recovers_each_expert_s_own_permutation_from_one_start():
    """A top-1-of-8 multi-query Mixtral with a planted permutation of each expert's hidden
    units of its own: from the identity alone the descent stopped with the stream wrong on
    these seeds (the whole group fits each expert's units to noise); started from the
    optimum of the subgroup that shares one permutation inside the experts, it recovers
    every one."""
    from lmckit.match import weight_matching
    from lmckit.perm import Permutation

    torch.manual_seed(0)
    model = T.MixtralForCausalLM(T.MixtralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=32,
        num_local_experts=8, num_experts_per_tok=1,
    )).double()  # fmt: skip
    spec = trace_report(model, torch.randint(0, 40, (2, 9))).spec
    assert len(spec.head_axes) == 4
    a = {k: v.detach() for k, v in model.state_dict().items()}
    for seed in (1, 3, 4):
        truth = Permutation.random(spec, seed)
        found = weight_matching(spec, a, truth.inverse().apply(a)).alignment
        assert found == truth, seed


def test_activation_matching_reads_each_expert_through_the_activation_of_its_tokens():
    """Activation matching on Mixtral (its experts in their default grouped form, as the
    model runs): the hidden activation holds whichever expert each token chose, so it is
    read once per expert (``@each`` sites) and AM chooses one permutation of the hidden
    units for all experts, the experts by the router's scores. A planted element of that
    subgroup is recovered exactly."""
    from lmckit.match import activation_matching
    from lmckit.perm import Permutation

    model = _mixtral().eval()
    spec = trace_report(model, _ids()).spec
    a = {k: v.detach() for k, v in model.state_dict().items()}
    truth = dict(Permutation.random(spec, 9).items())
    for layer in range(2):  # one σ for every expert, the experts still permuted
        hidden = spec.axes[f"model.layers.{layer}.mlp.experts.down_proj"][2]
        experts = spec.heads[hidden][0]
        sigma = torch.randperm(24, generator=torch.Generator().manual_seed(layer))
        truth[hidden] = (truth[experts][:, None] * 24 + sigma).reshape(-1)
    # the query heads inside their key/value group are planted too (layer 0's move)
    assert any(not truth[c].equal(torch.arange(spec.groups[c])) for c in spec.copies)
    truth = Permutation(spec, truth)
    b = truth.inverse().apply(a)
    data = [(torch.randint(0, 40, (8, 7), generator=torch.Generator().manual_seed(i)), None)
            for i in range(4)]  # fmt: skip
    found = activation_matching(spec, a, b, model=model, data=data).alignment
    wrong = [g for g in spec.groups if not torch.equal(found[g], truth[g])]
    assert not wrong, wrong


def test_experts_mixed_along_their_hidden_units_keep_one_hidden_permutation():
    """Each token's two experts' hidden activations summed before the down projections: a
    permutation of each expert's hidden units of its own would change the function, one
    shared by the experts does not. The structure alone proposes the per-expert reading;
    the equivalence check refuses it, and the report says why."""

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = torch.nn.Linear(6, 4, bias=False)
            self.up = torch.nn.Parameter(torch.randn(4, 5, 6))
            self.down = torch.nn.Parameter(torch.randn(4, 6, 5))

        def forward(self, x):
            idx = torch.topk(self.router(x), 2, dim=-1).indices
            hidden = F.silu(torch.matmul(self.up[idx], x[:, None, :, None]).squeeze(-1))
            hidden = hidden.sum(1, keepdim=True).expand(-1, 2, -1)  # the experts mixed
            return torch.matmul(self.down[idx], hidden[..., None]).squeeze(-1).sum(1)

    torch.manual_seed(0)
    report = trace_report(Mixed(), torch.randn(8, 6))
    spec = report.spec
    hidden = spec.axes["down"][2]
    assert hidden is not None and spec.groups[hidden] == 5 and not spec.head_axes
    assert spec.axes["up"][0] == spec.axes["router.weight"][0]  # the experts still move
    assert "failed the equivalence check" in report.whole_blocks[hidden]


def test_a_plain_mlp_s_hidden_units_are_not_read_per_stream_unit():
    """Only an axis gathered by index values (a mixture's experts) makes heads of the
    units beside it: a Llama's bias-free MLP carries its hidden units beside the stream on
    every tensor, and stays as it was."""
    report = trace_report(_mixtral_free_llama(), _ids())
    assert not report.spec.head_axes
    assert not any("apart" in why for why in report.whole_blocks.values())


def _mixtral_free_llama():
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    ))  # fmt: skip


def test_experts_computing_with_their_router_indices_stay_frozen():
    """Indices whose values are computed with (here an expert id shifted by one) are no
    longer followed: the experts freeze, and the check has nothing wrong to refuse."""

    class Shifted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = torch.nn.Linear(6, 4, bias=False)
            self.experts = torch.nn.Parameter(torch.randn(4, 5, 6))

        def forward(self, x):
            idx = torch.topk(self.router(x), 1, dim=-1).indices.reshape(-1)
            w = self.experts[(idx + 1) % 4]
            return torch.bmm(w, x.unsqueeze(-1)).squeeze(-1)

    torch.manual_seed(0)
    report = trace_report(Shifted(), torch.randn(8, 6))
    assert report.spec.axes["experts"][0] is None and report.spec.axes["router.weight"][0] is None
    assert any("computes with" in (why or "") for why in report.frozen["router.weight"])
    assert any("does not follow" in (why or "") for why in report.frozen["experts"])


def test_the_kinds_check_computes_in_float64_through_the_models_own_float32_casts():
    """Qwen3 with one key/value head (QK-norm keeps that head's dimensions whole): its query
    heads are a group of whole blocks. Mixing them by an orthogonal map is no symmetry (a
    softmax per head), but on random weights the scores are small and the outputs move
    little — a MQA Mistral's by 3e-6, inside the float32 tolerance the check had while the
    RMSNorm and softmax cast to float32. The twin now keeps float64 through those casts,
    and the check refuses the map. (A MQA Mistral's query heads are copies of its one
    key/value head now, which take permutations only.)"""
    from lmckit.tracing import symmetry_kinds
    from lmckit.tracing.trace import output_tolerance

    torch.manual_seed(0)
    model = T.Qwen3ForCausalLM(T.Qwen3Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=16, head_dim=4,
    ))  # fmt: skip
    x = _ids()
    spec = trace_report(model, x).spec
    heads = spec.axes["model.layers.0.self_attn.q_proj.weight"][0]
    assert spec.groups[heads] == 4 and spec.blocks["model.layers.0.self_attn.q_proj.weight"][0] == 4
    kinds = symmetry_kinds(model, x, spec)
    assert kinds.spec.kind(heads) == "permutation", str(kinds)
    assert kinds.spec.kind(spec.axes["model.embed_tokens.weight"][1]) == "orthogonal"
    from lmckit.tracing.trace import export_model

    assert output_tolerance(export_model(model, x)[0], "float64") == 1e-7


ONE_LAYER = dict(
    vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    num_attention_heads=4, max_position_embeddings=16, use_cache=False,
)  # fmt: skip


def _batched(model):
    """A mixture run in its experts' batched form: the default grouped form takes no
    float64."""
    model.config._experts_implementation = "batched_mm"
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda: T.LlamaForCausalLM(T.LlamaConfig(**ONE_LAYER, num_key_value_heads=2)),
        lambda: T.LlamaForCausalLM(T.LlamaConfig(**ONE_LAYER, num_key_value_heads=1)),
        lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**ONE_LAYER, rotary_pct=0.5)),
        lambda: T.Phi3ForCausalLM(T.Phi3Config(**ONE_LAYER, num_key_value_heads=2, pad_token_id=0)),
        lambda: _batched(
            T.MixtralForCausalLM(
                T.MixtralConfig(
                    **ONE_LAYER, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
                )
            )
        ),
    ],
    ids=[
        "llama-gqa",
        "llama-multi-query",
        "gpt-neox-head-sums",
        "phi3-grouped-query-sum",
        "mixtral-experts-apart",
    ],
)
def test_data_driven_methods_read_a_hugging_face_models_logits(make):
    """STE, Sinkhorn on the midpoint loss, the midpoint loss over transforms and
    activation matching over transforms run a Hugging Face model, whose output is a
    ModelOutput: lmckit reads its logits (they failed on the ModelOutput). Each result is a
    symmetry of B (its function kept, to the float32 of the model's own casts) — with one
    key/value head, with query, key and value fused per head, fused under grouped-query
    attention (a head-repeated segment with its copies), and with each expert's hidden
    units permuted apart."""
    from lmckit.data import TensorLoader
    from lmckit.functional import forward, logits_of
    from lmckit.match import METHODS
    from lmckit.transform import fold_norms

    torch.manual_seed(0)
    model_a = make().double().eval()
    model_b = make().double().eval()
    x = torch.randint(0, 40, (32, 8))
    data = TensorLoader(x, torch.roll(x, -1, 1), batch_size=16)
    spec = trace_report(model_a, x[:2]).spec
    a = {k: v.detach() for k, v in model_a.state_dict().items()}
    b = {k: v.detach() for k, v in model_b.state_dict().items()}
    assert torch.equal(forward(model_b, b, x[:2]), model_b(x[:2]).logits)
    assert logits_of({"logits": x, "other": 1}) is x and logits_of(x) is x
    for name in ("ste", "sinkhorn-mid", "ste-orth", "am-orth"):
        options = {} if name == "am-orth" else {"epochs": 1, "seed": 0}
        result = METHODS[name](spec, a, b, model=model_a, data=data, **options)
        alignment = result.alignment
        folded = fold_norms(spec, b) if name.endswith("-orth") else b
        moved = alignment.apply(folded)
        same = forward(model_b, moved, x[:4]), forward(model_b, b, x[:4])
        assert (same[0] - same[1]).abs().max() < 1e-5 * same[1].abs().max(), name
        if name != "am-orth":
            assert result.history and all(math.isfinite(v) for v in result.history), name


def test_gpt_neox_fused_per_head_projection_moves_inside_its_heads():
    """GPT-NeoX fuses query, key and value per head (each head's rows ``[q | k | v]``): the
    projection is a direct sum laid out head by head (``head_sums``), its query/key part
    one pinned group with the keys (scaled rotations of the rotary pairs), its value part
    the output projection's group (invertible maps) — no longer whole heads only."""
    from lmckit.tracing import symmetry_kinds

    torch.manual_seed(0)
    model = T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, rotary_pct=0.5,
    )).double().eval()  # fmt: skip
    x = _ids()
    report = trace_report(model, x)
    layer = "gpt_neox.layers.0.attention"
    spec = symmetry_kinds(model, x, report.spec).spec
    qk, also_qk, vo = spec.axes[f"{layer}.query_key_value.weight"][0]
    assert qk == also_qk != vo and spec.axes[f"{layer}.dense.weight"][1] == vo
    assert spec.head_sums[f"{layer}.query_key_value.weight"] == (4, 1)
    assert spec.head_sums[f"{layer}.query_key_value.bias"] == (4,)
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 4
    assert spec.groups[qk] == spec.groups[vo] == 16 and qk in spec.pinned
    assert (spec.kind(qk), spec.rotary[qk], spec.kind(vo)) == (
        "rotary-scaled",
        ("half", 2),
        "invertible",
    )
    assert "failed the equivalence check" not in str(report)
    # no activation carries the query/key group's units on one axis: its queries and keys
    # hold heads and dimensions on two ([b, h, t, d]), read flattened, head-major
    assert all("@flat" in node for node, _ in report.activation_sites[qk])
    from lmckit.data import TensorLoader
    from lmckit.match import METHODS
    from lmckit.tracing.taps import GraphTaps

    a = {k: v.detach() for k, v in model.state_dict().items()}
    truth = moving_permutation(report.spec, 5)
    b = truth.inverse().apply(a)
    # each site holds the group's units in its order: B's unit p[u] is A's unit u
    taps = GraphTaps(model, report.spec, x)
    acts_a, acts_b = taps(a, x), taps(b, x)
    for site in taps.taps()[qk]:
        assert torch.allclose(acts_b[site][:, truth[qk]], acts_a[site], atol=1e-12), site
    tokens = torch.randint(0, 40, (64, 8), generator=torch.Generator().manual_seed(0))
    data = TensorLoader(tokens, torch.roll(tokens, -1, 1), batch_size=32)
    found = METHODS["am"](report.spec, a, b, model=model, data=data)
    assert found.alignment == truth


def _wm_orth_undoes_a_planted_element(model, spec, a, x) -> None:
    """``wm-orth`` brings B — the folded model A under a planted element of the spec's
    distance-keeping group — back onto A, to 1e-8 of the planted distance."""
    from lmckit.match import METHODS
    from lmckit.transform import Transform, orthogonal_subgroup

    planted = Transform.random(orthogonal_subgroup(spec), 3)
    b = planted.inverse().apply(a)
    start = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    found = METHODS["wm-orth"](spec, a, b, model=model, example_inputs=(x,))
    aligned = found.alignment.apply(b)
    left = sum(float(((a[k] - aligned[k]) ** 2).sum()) for k in a) ** 0.5
    assert start > 1 and left < 1e-8 * start


def test_llama_rotary_query_key_maps_are_found_and_a_planted_one_undone():
    """Llama's query/key heads take a scaled rotation of each rotate-half pair (found by
    the check, layout from the graph's slices); ``wm-orth`` undoes a planted element of the
    whole distance-keeping group — rotations of the pairs, value maps, the stream."""
    from lmckit.tracing import symmetry_kinds
    from lmckit.transform import fold_norms

    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        use_cache=False,
    )  # fmt: skip
    model = T.LlamaForCausalLM(config).double().eval()
    x = _ids()
    spec = symmetry_kinds(model, x, trace_report(model, x).spec).spec
    qk = spec.axes["model.layers.0.self_attn.k_proj.weight"][0]
    assert spec.kind(qk) == "rotary-scaled" and spec.rotary[qk] == ("half", 4)
    a = fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})
    _wm_orth_undoes_a_planted_element(model, spec, a, x)
    # activation matching over the same group: the maps from the activations, then the
    # query heads inside their key/value group on a second pass with B moved by them
    from lmckit.match.activation_transform import transform_activation_matching
    from lmckit.perm import tie_outer
    from lmckit.transform import Transform, orthogonal_subgroup

    planted = Transform.random(orthogonal_subgroup(spec), 4)
    # one key/value head's query heads swapped, the other's not, the key/value heads
    # swapped: the copies' gains must be read on B's heads, not A's
    planted = planted.replace(**{c: torch.tensor([1, 0, 2, 3]) for c in spec.copies})
    assert all(tie_outer(spec, spec.copies[c], planted).tolist() == [1, 0] for c in spec.copies)
    b = planted.inverse().apply(a)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, 40, (32, 7), generator=g), None) for _ in range(3)]
    found = transform_activation_matching(spec, a, b, model=model, data=data)
    assert found.info["copies_in_place"] == []
    assert all(found.alignment[c].equal(planted[c]) for c in spec.copies)
    aligned = found.alignment.apply(b)
    left = sum(float(((a[k] - aligned[k]) ** 2).sum()) for k in a) ** 0.5
    assert left < 1e-8 * found.distance_before
    # data read once leaves them in place, and says so
    once = transform_activation_matching(spec, a, b, model=model, data=iter(data))
    assert once.info["copies_in_place"] == sorted(spec.copies)


ROTARY_CASES = {  # (factory, query/key projections of layer i, the layout the graph has)
    "phi-partial": (lambda: T.PhiForCausalLM(T.PhiConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, partial_rotary_factor=0.5)),
        "model.layers.{}.self_attn.{}_proj.weight", ("half", 2)),
    "gptj-partial": (lambda: T.GPTJForCausalLM(T.GPTJConfig(
        vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=16, rotary_dim=4,
        bos_token_id=0, eos_token_id=0)),
        "transformer.h.{}.attn.{}_proj.weight", ("interleaved", 4)),
    "gptj-whole-head": (lambda: T.GPTJForCausalLM(T.GPTJConfig(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=16, rotary_dim=4,
        bos_token_id=0, eos_token_id=0)),
        "transformer.h.{}.attn.{}_proj.weight", ("interleaved", 4)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ROTARY_CASES))
def test_partial_and_interleaved_rotary_pair_their_rotated_dimensions_and_free_the_rest(name):
    """Phi rotates the first half of each head (2 of 4 dimensions) rotate-half, GPT-J the
    first 4 interleaved (of 8, or of all 4), passing the rest: the queries' and keys' heads
    are one pinned group (the cat that re-joins the rotated and the passed part is the
    projection's own axis; GPT-J's rotary tables, repeated in place, pin the dimensions
    rather than freeze the heads), laid out as the graph has it, the unrotated dimensions
    free (Phi's single pair is not read as two interleaved pairs, which also pass but are
    a smaller group). A random element of the whole group keeps the function to 1e-10 in
    float64, and ``wm-orth`` undoes a planted element of its distance-keeping part."""
    from lmckit.tracing import symmetry_kinds
    from lmckit.transform import Transform, fold_norms

    make, projection, layout = ROTARY_CASES[name]
    torch.manual_seed(0)
    model = make().double().eval()
    x = _ids()
    spec = symmetry_kinds(model, x, trace_report(model, x).spec).spec
    for layer in range(2):
        qk = spec.axes[projection.format(layer, "k")][0]
        assert spec.axes[projection.format(layer, "q")][0] == qk
        assert qk in spec.pinned and spec.heads[qk][1] == 4
        assert spec.kind(qk) == "rotary-scaled" and spec.rotary[qk] == layout
    a = fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})
    with torch.no_grad():
        reference = torch.func.functional_call(model, a, (x,)).logits
        moved = Transform.random(spec, 5).apply(a)
        out = torch.func.functional_call(model, moved, (x,)).logits
    assert (out - reference).abs().max() <= 1e-10 * reference.abs().max()
    _wm_orth_undoes_a_planted_element(model, spec, a, x)


def test_qwen3_qk_norm_gain_restricts_the_rotary_maps_to_sign_flips_of_a_pair():
    """Qwen3 normalises each query/key head (RMSNorm, one gain over the head's dimensions)
    before the rotary embedding. A rotation of a frequency pair written into the projections
    passes the norm's mean of squares but not its gain — unless the gain is equal on the
    pair — so with trained (unequal) gains only a turn by π (both dimensions of the pair
    negated, queries and keys alike) keeps the function. The kinds' check finds no rotary
    kind for these heads; with HF's initial gains (ones) the rotation would pass."""
    from lmckit.tracing import symmetry_kinds

    torch.manual_seed(0)
    config = T.Qwen3Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=16,
    )  # fmt: skip
    model = T.Qwen3ForCausalLM(config).double().eval()
    x = _ids()

    def logits(state):
        with torch.no_grad():
            return torch.func.functional_call(model, state, (x,)).logits

    def turned(state, angle):
        """Pair (0, 2) of key/value head 0 and its two query heads of layer 0 turned."""
        c, s = math.cos(angle), math.sin(angle)
        out = dict(state)
        for name, heads in (("q_proj", (0, 1)), ("k_proj", (0,))):
            key = f"model.layers.0.self_attn.{name}.weight"
            w = out[key].clone()
            for h in heads:
                a, b = w[4 * h].clone(), w[4 * h + 2].clone()
                w[4 * h], w[4 * h + 2] = c * a - s * b, s * a + c * b
            out[key] = w
        return out

    ones = dict(model.state_dict())
    # (Qwen3's RMSNorm computes in float32 whatever the model's precision)
    assert torch.allclose(logits(turned(ones, 0.7)), logits(ones), atol=1e-6)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, dtype=torch.float64))
    state = dict(model.state_dict())
    assert not torch.allclose(logits(turned(state, 0.7)), logits(state), atol=1e-4)
    assert torch.allclose(logits(turned(state, math.pi)), logits(state), atol=1e-10)
    report = trace_report(model, x)
    spec = symmetry_kinds(model, x, report.spec).spec
    qk = spec.axes["model.layers.0.self_attn.k_proj.weight"][0]
    assert not spec.kind(qk).startswith("rotary")
    planted_recovery(model, report.spec)


def _decoder(config_class: str, model_class: str, **extra):
    base = dict(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    return lambda: getattr(T, model_class)(getattr(T, config_class)(**{**base, **extra}))


# rotary decoders beyond the nine of the symmetries guide: (factory, the residual stream's
# kind, the query/key groups' kind and rotary layout as the graph has them, or None where
# no rotary kind is found). Streams that stay permutations: Gemma2's and OLMo2's norms
# after each block add their gains to the stream (no linear reader to fold them into; a
# fresh model's constant gains hid that from the check), StarCoder2's and Falcon's final
# norm is read by an output tied to the embedding.
DECODERS = {
    # soft-capped logits, norms before and after each block, GeGLU
    "gemma2": (_decoder("Gemma2Config", "Gemma2ForCausalLM", head_dim=4, sliding_window=4),
               "permutation", ("rotary-scaled", ("half", 4))),
    # interleaved rotary, attention and MLP in parallel from one LayerNorm (no bias)
    "cohere-untied": (_decoder("CohereConfig", "CohereForCausalLM", tie_word_embeddings=False),
                      "orthogonal-mean-free", ("rotary-scaled", ("interleaved", 4))),
    # partial rotary (2 of 4 dimensions), LayerNorm with biases
    "stablelm": (_decoder("StableLmConfig", "StableLmForCausalLM", partial_rotary_factor=0.5),
                 "orthogonal-mean-free", ("rotary-scaled", ("half", 2))),
    # biases on every projection, GELU MLP, LayerNorm
    "starcoder2": (_decoder("Starcoder2Config", "Starcoder2ForCausalLM"),
                   "permutation", ("rotary-scaled", ("half", 4))),
    # QK-norm over the whole projection (not per head): no rotary maps
    "olmo2": (_decoder("Olmo2Config", "Olmo2ForCausalLM"), "permutation", None),
    # partial rotary on half of each head, fused gate/up projection
    "glm": (_decoder("GlmConfig", "GlmForCausalLM", head_dim=4, pad_token_id=0),
            "orthogonal", ("rotary-scaled", ("half", 2))),
    # experts through transformers' interface, use_cache read from **kwargs
    "granitemoe": (_decoder("GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4,
                            num_experts_per_tok=2), "orthogonal", ("rotary-scaled", ("half", 4))),
    # RMSNorms of the attention output and of the MLP's hidden units (sub-norms)
    "bitnet": (_decoder("BitNetConfig", "BitNetForCausalLM"), "orthogonal",
               ("rotary-scaled", ("half", 4))),
    # multi-query attention: one key/value head (a reshape (…, d) → (…, 1, d) and a
    # repeat (…, 1, r, …) → (…, r, …) that look like no reshape), read as one head
    "llama-multi-query": (_decoder("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=1),
                          "orthogonal", ("rotary-scaled", ("half", 4))),
    "gemma-multi-query": (_decoder("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1,
                                   head_dim=4), "permutation", ("rotary-scaled", ("half", 4))),
    # query, key and value fused per head ([q | k | v] rows per head), partial rotary,
    # attention and MLP in parallel: a direct sum laid out head by head
    "gpt-neox": (lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=40, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, rotary_pct=0.25)),
        "orthogonal-mean-free", ("rotary-scaled", ("half", 2))),
    # one fused query/key/value projection cut by slices ([q | k | v], Phi-3-mini's
    # multi-head layout): the slices tile the projection's units, a direct sum as split's
    "phi3-sliced-qkv": (_decoder("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=4,
                                 pad_token_id=0), "orthogonal", ("rotary-scaled", ("half", 4))),
    # the same under grouped-query attention (Phi-3-medium, Phi-4): the query slice holds
    # each key/value head's dimensions once per query head of its group, a head-repeated
    # segment of the direct sum
    "phi3-grouped-query": (_decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0),
                           "orthogonal", ("rotary-scaled", ("half", 4))),
    # query, key and value fused head by head and split by a view (heads, 3, d) read
    # [..., 0, :], [..., 1, :], [..., 2, :]; LayerNorms over each head's query and key
    # dimensions (one gain for every head) and partial rotary: the heads move whole, the
    # values inside them (invertible), the queries' and keys' dimensions stay
    "persimmon": (lambda: T.PersimmonForCausalLM(T.PersimmonConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, qk_layernorm=True,
        partial_rotary_factor=0.5)), "orthogonal-mean-free", None),
    # the same (heads, 3, d) view under ALiBi (a slope per head: the heads cannot move):
    # one orthogonal map of the head dimensions shared by every head's queries and keys
    "bloom": (lambda: T.BloomForCausalLM(T.BloomConfig(
        vocab_size=40, hidden_size=16, n_layer=2, n_head=4)), "permutation", None),
    # grouped-query attention fused into one projection, each key/value head's rows
    # q q k v (a head repeat of 4 beside the output projection's 2): whole heads, rotations
    "falcon-new-decoder": (lambda: T.FalconForCausalLM(T.FalconConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_kv_heads=2, new_decoder_architecture=True, alibi=False)), "permutation",
        ("rotary", ("half", 4))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(DECODERS))
def test_more_rotary_decoders_are_traced_checked_and_recovered(name):
    """Each decoder traces (verified, no group refused), its kinds are found, a random
    element of the whole group keeps the function to 1e-10 in float64 (through the
    model's own float32 casts), WM recovers a planted permutation and ``wm-orth`` undoes a
    planted element of the distance-keeping group."""
    from lmckit.tracing import symmetry_kinds
    from lmckit.tracing.trace import batched_experts, run_outputs
    from lmckit.transform import Transform, fold_norms

    make, stream, rotary = DECODERS[name]
    torch.manual_seed(0)
    model = make().double().eval()
    x = _ids()
    report = trace_report(model, x)
    assert "failed the equivalence check" not in str(report), str(report)
    assert report.permuted_fraction >= 0.99, str(report)
    spec = symmetry_kinds(model, x, report.spec).spec
    assert spec.kind(spec.axes[next(k for k in spec.axes if "embed" in k)][1]) == stream
    found = {(spec.kind(g), spec.rotary[g]) for g in spec.rotary}
    assert found == ({rotary} if rotary else set())
    a = fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})
    with batched_experts(model):
        reference = run_outputs(model, a, (x,), {}, False)[0]
        out = run_outputs(model, Transform.random(spec, 5).apply(a), (x,), {}, False)[0]
    assert (out - reference).abs().max() <= 1e-10 * reference.abs().max()
    planted_recovery(model, report.spec, restarts=4)
    _wm_orth_undoes_a_planted_element(model, spec, a, x)


def test_phi3_grouped_query_projection_is_a_sum_with_a_head_repeated_query_segment():
    """Phi-3 under grouped-query attention slices one fused projection into ``[q | k | v]``
    with twice as many query heads as key/value heads: the query slice is the query/key
    group laid out once per query head of each key/value head (``segment_head_repeats``),
    the value slice the output projection's group, and a copies group moves the query heads
    inside a key/value group on the query slice and the output columns alike — the
    attention moved no head before."""
    from lmckit.perm import Permutation

    torch.manual_seed(0)
    model = _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0)().double().eval()
    spec = trace_report(model, _ids()).spec
    for layer in range(2):
        attn = f"model.layers.{layer}.self_attn"
        qk, also_qk, vo = spec.axes[f"{attn}.qkv_proj.weight"][0]
        assert qk == also_qk != vo and spec.axes[f"{attn}.o_proj.weight"][1] == vo
        assert spec.segment_head_repeats[f"{attn}.qkv_proj.weight"] == {0: (2, 1, 1)}
        assert spec.head_repeats[f"{attn}.o_proj.weight"] == (1, 2)
        assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 2
        assert spec.groups[qk] == spec.groups[vo] == 8 and qk in spec.pinned
        copies = spec.copies_group(f"{attn}.qkv_proj.weight", 0)
        assert copies is not None and spec.copies[copies] == spec.heads[qk][0]
        assert spec.copies_group(f"{attn}.o_proj.weight", 1) == copies
    # the two query heads of key/value head 0 swapped — rows 0–3 with 4–7 of the query
    # slice and the output projection's columns alike — keep the function; in the query
    # rows alone they do not
    from lmckit.functional import forward

    state = {k: v.detach() for k, v in model.state_dict().items()}
    x = _ids()
    swap = torch.cat([torch.arange(4, 8), torch.arange(0, 4)])
    qkv, o = "model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.o_proj.weight"
    rows = torch.cat([swap, torch.arange(8, state[qkv].shape[0])])
    cols = torch.cat([swap, torch.arange(8, state[o].shape[1])])
    both = dict(state, **{qkv: state[qkv][rows], o: state[o][:, cols]})
    alone = dict(state, **{qkv: state[qkv][rows]})
    with torch.no_grad():
        before = forward(model, state, x)
        assert (forward(model, both, x) - before).abs().max() < 1e-10 * before.abs().max()
        assert (forward(model, alone, x) - before).abs().max() > 1e-3 * before.abs().max()
    # the copies group's move on the fused axis is that swap
    copies = spec.copies_group(qkv, 0)
    moved = Permutation.identity(spec).replace(**{copies: torch.tensor([1, 0, 2, 3])})
    assert torch.equal(moved.apply(state)[qkv], state[qkv][rows])


def test_a_spec_traced_at_initialisation_holds_for_unequal_norm_gains():
    """Cohere's per-head QK-norm gains, ``(heads, d)``, are ones at initialisation, so a
    spec that moves the query heads inside their key/value group in the gains alone kept
    the fresh model's outputs and passed the check; with trained (unequal) gains it breaks
    the function. The check varies constant tensors first, so the spec traced from the
    fresh model holds for any gains."""
    from lmckit.perm import Permutation
    from lmckit.tracing.trace import run_outputs

    torch.manual_seed(0)
    model = _decoder("CohereConfig", "CohereForCausalLM", use_qk_norm=True)().double().eval()
    x = _ids()
    spec = trace_report(model, x).spec
    state = {k: v.detach() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    trained = {
        k: (1 + 0.5 * torch.randn(v.shape, generator=generator, dtype=v.dtype))
        if "norm" in k else v
        for k, v in state.items()
    }  # fmt: skip
    reference = run_outputs(model, trained, (x,), {}, False)[0]
    for seed in range(3):
        moved = Permutation.random(spec, seed).apply(trained)
        out = run_outputs(model, moved, (x,), {}, False)[0]
        assert (out - reference).abs().max() <= 1e-10 * reference.abs().max()


def test_a_model_with_sizes_computed_from_the_data_is_refused_by_name():
    """JetMoE dispatches its tokens to experts by counts it computes: no rule can relate
    those axes, and the tracer says so (it crashed inside torch)."""
    from lmckit.errors import SpecError

    torch.manual_seed(0)
    model = _decoder("JetMoeConfig", "JetMoeForCausalLM", num_local_experts=4,
                     num_experts_per_tok=2, kv_channels=4)()  # fmt: skip
    with pytest.raises(SpecError, match="sizes computed from the data"):
        trace_report(model, _ids())


def test_multi_query_attention_moves_its_one_key_value_head_inside_and_its_query_heads():
    """With one key/value head the reshapes that make heads have a head axis of length 1
    and look like none: read as one head, the query heads are copies of it (permuted among
    themselves), its value dimensions take maps on every query head's output columns alike,
    and its rotary pairs take scaled rotations — not only whole query heads. Where the
    graph keeps that head's dimensions whole (Qwen3's QK-norm gain indexes them), the plain
    reading's query-head group is kept, not lost."""
    from lmckit.tracing import symmetry_kinds

    torch.manual_seed(0)
    model = _decoder("MistralConfig", "MistralForCausalLM", num_key_value_heads=1)()
    model = model.double().eval()
    x = _ids()
    spec = symmetry_kinds(model, x, trace_report(model, x).spec).spec
    layer = "model.layers.0.self_attn"
    qk, vo = spec.axes[f"{layer}.q_proj.weight"][0], spec.axes[f"{layer}.v_proj.weight"][0]
    assert spec.axes[f"{layer}.k_proj.weight"][0] == qk
    assert spec.axes[f"{layer}.o_proj.weight"][1] == vo
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 1
    assert spec.head_repeats[f"{layer}.q_proj.weight"] == (4, 1)
    assert spec.head_repeats[f"{layer}.o_proj.weight"] == (1, 4)
    assert [spec.groups[c] for c, t in spec.copies.items() if t == spec.heads[qk][0]] == [4]
    # a batch of one has a length-1 axis before the sequence too: it is no head
    single = trace_report(model, x[:1]).spec
    assert single.heads[single.axes[f"{layer}.q_proj.weight"][0]][1] == 1
    assert len(single.copies) == 2
    assert (spec.kind(qk), spec.rotary[qk], spec.kind(vo)) == (
        "rotary-scaled",
        ("half", 4),
        "invertible",
    )

    qwen3 = _decoder("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=1, head_dim=4)()
    spec = trace_report(qwen3, x).spec
    heads = spec.axes[f"{layer}.q_proj.weight"][0]
    assert heads is not None and spec.axes[f"{layer}.o_proj.weight"][1] == heads
    assert spec.groups[heads] == 4 and spec.blocks[f"{layer}.q_proj.weight"] == (4, 1)


def _heads_3_d(name: str):
    torch.manual_seed(0)
    model = DECODERS[name][0]().double().eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return model, state, trace_report(model, _ids()).spec


def _rows(order, n):
    return torch.cat([torch.as_tensor(order), torch.arange(len(order), n)])


def test_persimmon_s_heads_3_d_view_moves_the_values_inside_each_head():
    """Persimmon's fused projection, rows laid out ``[q | k | v]`` per head (4 heads of 4):
    a head-by-head sum of query/key (pinned by their LayerNorms and rotary) and value
    (with the output projection's columns). By hand: head 0's value dimensions reversed
    in the projection's rows 8–11 and the output's columns 0–3 keep the function, in the
    rows alone they do not; heads 0 and 1 swapped whole (rows 0–11 with 12–23, columns
    0–3 with 4–7) keep it too."""
    from lmckit.functional import forward

    model, state, spec = _heads_3_d("persimmon")
    qkv, out = (
        "model.layers.0.self_attn.query_key_value.weight",
        "model.layers.0.self_attn.dense.weight",
    )
    qk, also_qk, v = spec.axes[qkv][0]
    assert qk == also_qk != v and spec.axes[out][1] == v and qk in spec.pinned
    assert spec.head_sums[qkv] == (4, 1) and spec.heads[v] == (qk, 4)
    x = _ids()
    value_rows = _rows([0, 1, 2, 3, 4, 5, 6, 7, 11, 10, 9, 8], 48)
    head_rows, head_cols = (
        _rows([*range(12, 24), *range(12)], 48),
        _rows([4, 5, 6, 7, 0, 1, 2, 3], 16),
    )
    cases = {
        "value dims, both": (value_rows, _rows([3, 2, 1, 0], 16)),
        "value dims, rows alone": (value_rows, None),
        "heads 0, 1 swapped": (head_rows, head_cols),
    }
    with torch.no_grad():
        before = forward(model, state, x)
        change = {}
        for case, (rows, cols) in cases.items():
            moved = dict(
                state, **{qkv: state[qkv][rows], qkv[:-6] + "bias": state[qkv[:-6] + "bias"][rows]}
            )
            if cols is not None:
                moved[out] = state[out][:, cols]
            change[case] = float(
                (forward(model, moved, x) - before).abs().max() / before.abs().max()
            )
    assert change["value dims, both"] < 1e-12 and change["heads 0, 1 swapped"] < 1e-12, change
    assert change["value dims, rows alone"] > 1e-3, change


def test_bloom_s_heads_stay_for_alibi_and_share_one_map_of_their_query_key_dimensions():
    """BLOOM adds a slope per head (ALiBi) to the scores: heads 0 and 1 swapped whole
    change the function (by 5e-4 of its scale on 7 tokens of a random model: its attention
    is near uniform; rounding is 1e-16), and the spec moves no head; one permutation of the head
    dimensions on every head's queries and keys (rows ``[q | k | v]`` per head of 4) keeps
    it, and the spec's group is that map (4 units)."""
    from lmckit.tracing.trace import run_outputs

    model, state, spec = _heads_3_d("bloom")
    qkv = "transformer.h.0.self_attention.query_key_value.weight"
    out = "transformer.h.0.self_attention.dense.weight"
    groups = {g for g in spec.axes[qkv][0] if isinstance(g, str)}  # an int: fixed units
    assert len(groups) == 1 and spec.groups[groups.pop()] == 4 and spec.axes[out][1] is None
    flip = [3, 2, 1, 0]
    qk_rows = torch.cat([
        torch.tensor([12 * h + i for i in flip] + [12 * h + 4 + i for i in flip]
                     + list(range(12 * h + 8, 12 * h + 12)))
        for h in range(4)
    ])  # fmt: skip
    swap_rows = _rows([*range(12, 24), *range(12)], 48)
    swap_cols = _rows([4, 5, 6, 7, 0, 1, 2, 3], 16)
    bias = qkv[:-6] + "bias"
    x = _ids()
    with torch.no_grad():
        before = run_outputs(model, state, (x,), {}, False)[0]
        shared = dict(state, **{qkv: state[qkv][qk_rows], bias: state[bias][qk_rows]})
        swapped = dict(state, **{qkv: state[qkv][swap_rows], bias: state[bias][swap_rows],
                                 out: state[out][:, swap_cols]})  # fmt: skip
        assert (
            run_outputs(model, shared, (x,), {}, False)[0] - before
        ).abs().max() < 1e-12 * before.abs().max()
        assert (
            run_outputs(model, swapped, (x,), {}, False)[0] - before
        ).abs().max() > 1e-6 * before.abs().max()  # rounding: 1e-16
