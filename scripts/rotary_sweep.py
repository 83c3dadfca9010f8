"""The tracer on rotary decoders' *configurations*, not only their architectures: head
counts (multi-query, grouped, multi-head, one head), head sizes apart from width / heads,
biases, tied embeddings, rotary scalings (linear, llama3, yarn), partial and interleaved
rotary, sliding windows, experts routed to one or two, fused projections — each a small
random ``transformers`` model in float64.

For every configuration: the trace (verified, and whether any group was refused by the
check), the kinds (:func:`lmckit.tracing.symmetry_kinds`), the rotary layouts found, a
random element of the whole group applied to the folded weights (largest output change
relative to the outputs' largest entry), weight matching's recovery of planted
permutations (the worst of ``--planted`` seeds, each the best of ``--restarts`` starts)
and ``wm-orth``'s recovery of a planted element of the distance-keeping group (the share
of the planted distance left; default settings, one start). Printed (JSON), one record
per configuration; an error is recorded, not raised. Run from the repository root:
``python scripts/rotary_sweep.py`` (about two minutes on one core, one planted seed), or
name configurations to run only those.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import torch


def _decoder(config: str, model: str, **extra) -> Callable:
    import transformers as T

    base = dict(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    return lambda: getattr(T, model)(getattr(T, config)(**{**base, **extra}))


def configurations() -> dict[str, Callable]:
    import transformers as T

    d = _decoder
    rope = {"rope_theta": 10000.0}
    return {
        "Llama 8 heads / 2 kv, width 32": d("LlamaConfig", "LlamaForCausalLM", hidden_size=32,
                                            num_attention_heads=8),
        "Llama MQA (1 kv)": d("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=1),
        "Llama MHA": d("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=4),
        "Llama one head": d("LlamaConfig", "LlamaForCausalLM", num_attention_heads=1,
                            num_key_value_heads=1),
        "Llama biases": d("LlamaConfig", "LlamaForCausalLM", attention_bias=True,
                          mlp_bias=True),
        "Llama head size 8 (≠ 16 / 4)": d("LlamaConfig", "LlamaForCausalLM", head_dim=8),
        "Llama tied": d("LlamaConfig", "LlamaForCausalLM", tie_word_embeddings=True),
        "Llama rope linear": d("LlamaConfig", "LlamaForCausalLM", rope_parameters={
            "rope_type": "linear", "factor": 2.0, **rope}),
        "Llama rope llama3": d("LlamaConfig", "LlamaForCausalLM", rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8, **rope}),
        "Llama rope yarn": d("LlamaConfig", "LlamaForCausalLM", rope_parameters={
            "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, **rope}),
        "Llama 3 layers, 6 heads / 3 kv": d("LlamaConfig", "LlamaForCausalLM",
                                            num_hidden_layers=3, hidden_size=24,
                                            num_attention_heads=6, num_key_value_heads=3),
        "Mistral sliding window": d("MistralConfig", "MistralForCausalLM", sliding_window=4),
        "Qwen2 6 heads / 2 kv": d("Qwen2Config", "Qwen2ForCausalLM", hidden_size=24,
                                  num_attention_heads=6),
        "Qwen2 MQA": d("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=1),
        "Qwen2 tied": d("Qwen2Config", "Qwen2ForCausalLM", tie_word_embeddings=True),
        "Qwen3 MHA": d("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=4, head_dim=4),
        "Qwen3 MQA": d("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=1, head_dim=4),
        "Gemma MQA, head size 4": d("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1,
                                    head_dim=4),
        "Gemma3 text": d("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=4, sliding_window=4),
        "Phi partial 0.25, head size 8": d("PhiConfig", "PhiForCausalLM", hidden_size=32,
                                           num_key_value_heads=4, partial_rotary_factor=0.25),
        "Phi partial 0.75, head size 8": d("PhiConfig", "PhiForCausalLM", hidden_size=32,
                                           num_key_value_heads=4, partial_rotary_factor=0.75),
        "Phi whole rotary": d("PhiConfig", "PhiForCausalLM", num_key_value_heads=4,
                              partial_rotary_factor=1.0),
        "Phi GQA": d("PhiConfig", "PhiForCausalLM", partial_rotary_factor=0.5),
        "Phi MQA": d("PhiConfig", "PhiForCausalLM", num_key_value_heads=1,
                     partial_rotary_factor=0.5),
        "Phi-3 MHA (sliced QKV)": d("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=4,
                                    pad_token_id=0),
        "Phi-3 GQA (sliced QKV)": d("Phi3Config", "Phi3ForCausalLM", pad_token_id=0),
        "GPT-NeoX whole rotary": d("GPTNeoXConfig", "GPTNeoXForCausalLM", rotary_pct=1.0),
        "GPT-NeoX 0.25, sequential residual": d("GPTNeoXConfig", "GPTNeoXForCausalLM",
                                                hidden_size=32, rotary_pct=0.25,
                                                use_parallel_residual=False),
        "GPT-J rotary 2 of 8": lambda: T.GPTJForCausalLM(T.GPTJConfig(
            vocab_size=40, n_embd=32, n_layer=2, n_head=4, n_positions=32, rotary_dim=2,
            bos_token_id=0, eos_token_id=0)),
        "GPT-J one head": lambda: T.GPTJForCausalLM(T.GPTJConfig(
            vocab_size=40, n_embd=16, n_layer=2, n_head=1, n_positions=32, rotary_dim=4,
            bos_token_id=0, eos_token_id=0)),
        "Mixtral top-1 of 8, MQA": d("MixtralConfig", "MixtralForCausalLM",
                                     num_key_value_heads=1, num_local_experts=8,
                                     num_experts_per_tok=1),
        "Mixtral 4 experts, GQA": d("MixtralConfig", "MixtralForCausalLM",
                                    num_local_experts=4, num_experts_per_tok=2),
        "Mixtral 4 experts, MHA": d("MixtralConfig", "MixtralForCausalLM",
                                    num_key_value_heads=4, num_local_experts=4,
                                    num_experts_per_tok=2),
        "GraniteMoe MQA": d("GraniteMoeConfig", "GraniteMoeForCausalLM", num_key_value_heads=1,
                            num_local_experts=4, num_experts_per_tok=2),
        "Cohere MQA, untied": d("CohereConfig", "CohereForCausalLM", num_key_value_heads=1,
                                tie_word_embeddings=False),
        "OLMo": d("OlmoConfig", "OlmoForCausalLM"),
        "Helium": d("HeliumConfig", "HeliumForCausalLM", head_dim=4),
        "Ernie 4.5": d("Ernie4_5Config", "Ernie4_5ForCausalLM", head_dim=4),
        "Seed-OSS": d("SeedOssConfig", "SeedOssForCausalLM", head_dim=4),
        "HunYuan dense": d("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", head_dim=4),
        "EXAONE 4": d("Exaone4Config", "Exaone4ForCausalLM", head_dim=4, sliding_window=4),
        "Granite": d("GraniteConfig", "GraniteForCausalLM"),
        "Arcee": d("ArceeConfig", "ArceeForCausalLM"),
        "Nemotron (partial rotary)": d("NemotronConfig", "NemotronForCausalLM", head_dim=4,
                                       partial_rotary_factor=0.5),
    }  # fmt: skip


def _distance(a: dict, b: dict) -> float:
    return sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5


def sweep_one(make: Callable, restarts: int, planted: int = 1) -> dict:
    from lmckit.match import METHODS, weight_matching
    from lmckit.perm import Permutation
    from lmckit.tracing import symmetry_kinds, trace_report
    from lmckit.tracing.trace import batched_experts, run_outputs
    from lmckit.transform import Transform, fold_norms, orthogonal_subgroup

    start = time.perf_counter()
    torch.manual_seed(0)
    model = make().double().eval()
    x = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    report = trace_report(model, x)
    spec = symmetry_kinds(model, x, report.spec).spec
    out: dict = {
        "refused_by_the_check": "failed the equivalence check" in str(report),
        "permuted_fraction": round(report.permuted_fraction, 4),
        "kinds": spec.kind_counts(),
        "head_structured_groups": len(spec.heads),
        "copies_groups": len(spec.copies),
        # tensors whose groups permute apart per head of another axis (a mixture's experts)
        "joint_head_axes": len(spec.head_axes),
        "rotary_layouts": sorted({f"{s} {r}" for s, r in spec.rotary.values()}),
        "whole_blocks": sorted({why.split(":")[0] for why in report.whole_blocks.values()}),
    }
    a = fold_norms(spec, {k: v.detach() for k, v in model.state_dict().items()})
    with batched_experts(model):
        reference = run_outputs(model, a, (x,), {}, False)[0]
        moved = run_outputs(model, Transform.random(spec, 5).apply(a), (x,), {}, False)[0]
    out["random_element_change"] = float((moved - reference).abs().max() / reference.abs().max())
    plain = {k: v.detach() for k, v in model.state_dict().items()}
    left = []
    for seed in range(7, 7 + planted):
        b = Permutation.random(report.spec, seed).inverse().apply(plain)
        found = weight_matching(report.spec, plain, b, restarts=restarts).perm
        left.append(_distance(plain, found.apply(b)) / _distance(plain, b))
    out["wm_planted_left"] = max(left)  # the worst of the planted seeds
    if any(spec.kind(g) != "permutation" for g in spec.groups):
        element = Transform.random(orthogonal_subgroup(spec), 3)
        b = element.inverse().apply(a)
        result = METHODS["wm-orth"](spec, a, b, model=model, example_inputs=(x,))
        out["wm_orth_planted_left"] = _distance(a, result.alignment.apply(b)) / _distance(a, b)
    else:
        out["wm_orth_planted_left"] = None  # nothing beyond permutations to match
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="configurations to run (default: all)")
    parser.add_argument("--restarts", type=int, default=1, help="WM starts (default 1)")
    parser.add_argument(
        "--planted",
        type=int,
        default=1,
        help="planted permutations per configuration for WM "
        "(seeds 7, 8, …; the worst is recorded; default 1)",
    )
    args = parser.parse_args(argv)
    if args.restarts < 1 or args.planted < 1:
        parser.error("--restarts and --planted must be at least 1")
    known = configurations()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown configurations {unknown}; known: {list(known)}")
    results = {}
    for name in args.names or list(known):
        try:
            results[name] = sweep_one(known[name], args.restarts, args.planted)
        except Exception as exc:  # a configuration the tracer cannot take: said, not hidden
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        print(f"{name}: done", file=sys.stderr, flush=True)
    settings = {"restarts": args.restarts, "planted": args.planted}
    json.dump(
        {"script": "scripts/rotary_sweep.py", "settings": settings, "results": results},
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
