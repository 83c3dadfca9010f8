"""What lmckit's tracer finds in today's decoders: groups by kind and the share of the
parameters each kind moves, on small random configs of ``transformers`` models.

For every architecture the model is traced (:func:`lmckit.tracing.trace_report`) and its
kinds found (:func:`lmckit.tracing.symmetry_kinds`, in float64 where the model computes in
float64); a kind *moves* a parameter tensor when one of its groups acts on one of the
tensor's axes. Printed (JSON): per architecture, the number of groups of each kind, the
share of all parameters in tensors each kind moves, the head-structured groups and those
with a head repeat (grouped-query attention), the precision of the check and why query/key
head dimensions stay whole. Run from the repository root:
``python scripts/symmetry_coverage.py``.
"""

from __future__ import annotations

import json
import sys

import torch


def architectures() -> dict:
    import transformers as T

    common = dict(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16,
    )  # fmt: skip
    return {
        "Llama (GQA 4/2)": lambda: T.LlamaForCausalLM(
            T.LlamaConfig(**common, num_key_value_heads=2)
        ),
        "Mistral (GQA 4/2)": lambda: T.MistralForCausalLM(
            T.MistralConfig(**common, num_key_value_heads=2)
        ),
        "Qwen2 (GQA, q/k/v biases)": lambda: T.Qwen2ForCausalLM(
            T.Qwen2Config(**common, num_key_value_heads=2)
        ),
        "Qwen3 (GQA, QK-norm)": lambda: T.Qwen3ForCausalLM(
            T.Qwen3Config(**common, num_key_value_heads=2, head_dim=4)
        ),
        "Gemma (GQA, head size 8 ≠ 16/4)": lambda: T.GemmaForCausalLM(
            T.GemmaConfig(**common, num_key_value_heads=2, head_dim=8)
        ),
        "Phi (partial rotary)": lambda: T.PhiForCausalLM(
            T.PhiConfig(**common, partial_rotary_factor=0.5)
        ),
        "GPT-NeoX (fused per-head QKV)": lambda: T.GPTNeoXForCausalLM(
            T.GPTNeoXConfig(**common, rotary_pct=0.5)
        ),
        "GPT-J (interleaved rotary)": lambda: T.GPTJForCausalLM(
            T.GPTJConfig(
                vocab_size=40,
                n_embd=16,
                n_layer=2,
                n_head=4,
                n_positions=16,
                rotary_dim=4,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "Mixtral (GQA, 4 experts)": lambda: T.MixtralForCausalLM(
            T.MixtralConfig(
                **common, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
            )
        ),
        # beyond the first nine (issue 59's fifth session)
        "Gemma2 (norms after each block)": lambda: T.Gemma2ForCausalLM(
            T.Gemma2Config(**common, num_key_value_heads=2, head_dim=4, sliding_window=4)
        ),
        "Cohere (interleaved, untied)": lambda: T.CohereForCausalLM(
            T.CohereConfig(**common, num_key_value_heads=2, tie_word_embeddings=False)
        ),
        "Cohere (per-head QK-norm)": lambda: T.CohereForCausalLM(
            T.CohereConfig(**common, num_key_value_heads=2, use_qk_norm=True)
        ),
        "StableLM (partial rotary)": lambda: T.StableLmForCausalLM(
            T.StableLmConfig(**common, num_key_value_heads=2, partial_rotary_factor=0.5)
        ),
        "StableLM (per-head QK LayerNorms)": lambda: T.StableLmForCausalLM(
            T.StableLmConfig(**common, num_key_value_heads=2, qk_layernorm=True)
        ),
        "StarCoder2 (biases, tied)": lambda: T.Starcoder2ForCausalLM(
            T.Starcoder2Config(**common, num_key_value_heads=2)
        ),
        "OLMo2 (QK-norm over the projection)": lambda: T.Olmo2ForCausalLM(
            T.Olmo2Config(**common, num_key_value_heads=2)
        ),
        "GLM (partial rotary)": lambda: T.GlmForCausalLM(
            T.GlmConfig(**common, num_key_value_heads=2, head_dim=4, pad_token_id=0)
        ),
        "GraniteMoe (experts)": lambda: T.GraniteMoeForCausalLM(
            T.GraniteMoeConfig(
                **common, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
            )
        ),
        "BitNet (sub-norms)": lambda: T.BitNetForCausalLM(
            T.BitNetConfig(**common, num_key_value_heads=2)
        ),
        "Falcon (fused GQA projection)": lambda: T.FalconForCausalLM(
            T.FalconConfig(
                vocab_size=40,
                hidden_size=16,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_kv_heads=2,
                new_decoder_architecture=True,
                alibi=False,
            )
        ),
        # issue 59's eighth session: multi-query attention, Phi-3's sliced projection
        "Llama (MQA, one key/value head)": lambda: T.LlamaForCausalLM(
            T.LlamaConfig(**common, num_key_value_heads=1)
        ),
        "Mixtral (MQA, 4 experts)": lambda: T.MixtralForCausalLM(
            T.MixtralConfig(
                **common, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2
            )
        ),
        "Qwen3 (MQA, QK-norm)": lambda: T.Qwen3ForCausalLM(
            T.Qwen3Config(**common, num_key_value_heads=1, head_dim=4)
        ),
        "Phi-3 (sliced QKV, MHA)": lambda: T.Phi3ForCausalLM(
            T.Phi3Config(**common, num_key_value_heads=4, pad_token_id=0)
        ),
        "Phi-3 (sliced QKV, GQA)": lambda: T.Phi3ForCausalLM(
            T.Phi3Config(**common, num_key_value_heads=2, pad_token_id=0)
        ),
        "Persimmon (heads × 3 × d, per-head QK LayerNorms)": lambda: T.PersimmonForCausalLM(
            T.PersimmonConfig(**common, qk_layernorm=True, partial_rotary_factor=0.5)
        ),
        "BLOOM (heads × 3 × d, ALiBi)": lambda: T.BloomForCausalLM(
            T.BloomConfig(vocab_size=40, hidden_size=16, n_layer=2, n_head=4)
        ),
        "JetMoE (experts by computed counts)": lambda: T.JetMoeForCausalLM(
            T.JetMoeConfig(
                **common,
                num_key_value_heads=2,
                num_local_experts=4,
                num_experts_per_tok=2,
                kv_channels=4,
            )
        ),
    }


def coverage(make) -> dict:
    from lmckit.tracing import symmetry_kinds, trace_report

    torch.manual_seed(0)
    model = make().eval()
    tokens = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    traced = trace_report(model, tokens)
    spec = symmetry_kinds(model, tokens, traced.spec).spec
    sizes = {k: v.numel() for k, v in model.state_dict().items()}
    total = sum(sizes.values())
    kinds: dict[str, dict] = {}
    for g in spec.groups:
        row = kinds.setdefault(spec.kind(g), {"groups": 0, "tensors": set()})
        row["groups"] += 1
        row["tensors"] |= {name for name, _ in spec.group_axes(g)}
    return {
        "kinds": {
            kind: {
                "groups": row["groups"],
                "share_of_parameters_moved": sum(sizes[t] for t in row["tensors"]) / total,
            }
            for kind, row in kinds.items()
        },
        "head_structured_groups": len(spec.heads),
        "groups_with_a_head_repeat": len(
            {
                spec.axes[n][i]
                for n, r in getattr(spec, "head_repeats", {}).items()
                for i, c in enumerate(r)
                if c > 1
            }
        ),
        "permuted_fraction": traced.permuted_fraction,
        "precision": traced.precision,
        "whole_blocks": sorted(set(traced.whole_blocks.values())),
    }


def main() -> None:
    out = {}
    for name, make in architectures().items():
        try:
            out[name] = coverage(make)
        except Exception as exc:  # an architecture the tracer cannot take: said, not hidden
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
