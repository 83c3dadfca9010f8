"""The kinds check (:func:`lmckit.tracing.symmetry_kinds`) on GPT-2 small's width, with and
without probing the wide groups first, in the same run.

The check tries each group's kinds with a random element and runs the float64 model under
it. For a group of ``n`` units a full random map costs ``O(n³)`` to draw, check and invert
— GPT-2 small's 3,072 MLP units, which admit no map, cost most of the check. Groups of
at least ``PROBE_FROM`` units are first probed with a map of a few units, which rejects
such kinds for the price of one forward pass (a passing probe leaves the decision to the
full map). Each variant runs on the same random GPT-2 config (width 768, 12 heads, MLP
3,072, ``--layers`` blocks, vocabulary ``--vocab``), from a fresh trace; reported: the
check's seconds, the kinds found (which must be equal), and the speed-up. Prints one JSON
document.

    python benchmarks/bench_kinds.py [--layers 2] [--full-layers 12]

``--full-layers`` adds GPT-2 small's depth with probes only (the check without them takes
about 18 minutes there on one core).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from _timing import machine  # benchmarks/_timing.py (scripts run from this folder)
from bench_large import positive
from lmckit.tracing import kinds as kinds_module
from lmckit.tracing import symmetry_kinds, trace_report


def check(layers: int, vocab: int, probes: bool) -> dict:
    import transformers as T

    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, vocab_size=vocab)).eval()
    x = torch.randint(0, vocab, (1, 16))
    spec = trace_report(model, x).spec
    probe_map = kinds_module._probe_map
    if not probes:
        kinds_module._probe_map = lambda *args: None
    try:
        start = time.perf_counter()
        report = symmetry_kinds(model, x, spec)
        seconds = time.perf_counter() - start
    finally:
        kinds_module._probe_map = probe_map
    return {
        "layers": layers,
        "probes": probes,
        "seconds": round(seconds, 2),
        "kinds": report.spec.kind_counts(),
        "rejected": len(report.reasons),
        "_found": (dict(report.spec.kinds), dict(report.reasons)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=positive, default=2, help="blocks, both variants")
    parser.add_argument("--full-layers", type=positive, help="blocks, probes only")
    parser.add_argument("--vocab", type=positive, default=50257)
    args = parser.parse_args()
    rows = [check(args.layers, args.vocab, probes) for probes in (True, False)]
    same = rows[0].pop("_found") == rows[1].pop("_found")
    if args.full_layers:
        rows.append(check(args.full_layers, args.vocab, True))
        rows[-1].pop("_found")
    print(
        json.dumps(
            {
                "machine": machine("cpu"),
                "model": "GPT-2 config (width 768, 12 heads, MLP 3072), random init",
                "results": rows,
                "same_kinds_and_reasons": same,
                "speedup": round(rows[1]["seconds"] / rows[0]["seconds"], 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
