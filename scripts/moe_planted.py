"""Weight matching on mixtures of experts whose experts each permute their hidden units
by a permutation of their own (``PermutationSpec.head_axes``): planted permutations of
small random ``transformers`` mixtures (float64), recovered from one start.

For every configuration and planted seed: the share of the planted distance left by
:func:`lmckit.match.weight_matching` (which first solves the subgroup sharing one
permutation inside the experts, then the whole group) and, side by side, by coordinate
descent over the whole group from the identity alone (the engine's own ``match``: no
subgroup start, no swaps). Printed (JSON). Run from the repository root:
``python scripts/moe_planted.py [--seeds N]`` (about a minute on one core at 12 seeds).
"""

from __future__ import annotations

import json
import sys
import time

import torch


def configurations() -> dict:
    """The sweep's four mixtures (``rotary_sweep.py``, same settings) and three more."""
    from rotary_sweep import _decoder
    from rotary_sweep import configurations as sweep

    shared = ("Mixtral top-1 of 8, MQA", "Mixtral 4 experts, GQA", "Mixtral 4 experts, MHA",
              "GraniteMoe MQA")  # fmt: skip
    known = sweep()
    return {
        **{name: known[name] for name in shared},
        "Qwen2-MoE (shared expert)": _decoder("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                                              num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=12,
                                              shared_expert_intermediate_size=20),
        "OLMoE": _decoder("OlmoeConfig", "OlmoeForCausalLM", num_experts=4,
                          num_experts_per_tok=2),
        "Qwen3-MoE": _decoder("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=12, head_dim=4),
    }  # fmt: skip


def _left(a, b, found) -> float:
    moved = found.apply(b)
    num = sum(float((a[k].double() - moved[k].double()).pow(2).sum()) for k in a)
    den = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a)
    return (num / den) ** 0.5


def run_one(make, seeds: int) -> dict:
    from lmckit.match import WeightMatcher, weight_matching
    from lmckit.perm import Permutation
    from lmckit.tracing import trace_report

    torch.manual_seed(0)
    model = make().double().eval()
    x = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    spec = trace_report(model, x).spec
    a = {k: v.detach() for k, v in model.state_dict().items()}
    wm, alone, seconds = [], [], []
    for seed in range(seeds):
        b = Permutation.random(spec, seed).inverse().apply(a)
        start = time.perf_counter()
        wm.append(_left(a, b, weight_matching(spec, a, b).alignment))
        seconds.append(time.perf_counter() - start)
        alone.append(_left(a, b, WeightMatcher(spec, b).match(a).alignment))
    return {
        "tensors_with_experts_apart": len(spec.head_axes),
        "wm_seeds_not_recovered": sum(v > 1e-9 for v in wm),
        "wm_worst_left": max(wm),
        "descent_alone_seeds_not_recovered": sum(v > 1e-9 for v in alone),
        "descent_alone_worst_left": max(alone),
        "wm_seconds_per_match": round(sum(seconds) / len(seconds), 3),
    }


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="planted seeds 0..N-1")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    results = {}
    for name, make in configurations().items():
        results[name] = run_one(make, args.seeds)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    json.dump(
        {"script": "scripts/moe_planted.py", "seeds": args.seeds, "results": results},
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
