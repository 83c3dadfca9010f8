"""Weight matching with each unit's LAP overlapping the next unit's products, against one
step after the other, on model folders (``make_hf_pairs.py``; the planted pairs of
``bench_large.py``): median seconds of ``--repeats`` alternating runs after a warm-up of
each, the same permutations asserted. Prints one JSON document.

    python benchmarks/bench_overlap.py /work/runs/hf-large [--only gpt2-124m] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _timing import machine, timed  # benchmarks/_timing.py (scripts run from this folder)
from lmckit.lap import compile_kernels
from lmckit.match.weight_matcher import WeightMatcher
from lmckit.model_folder import load_model_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--only", nargs="+", default=["gpt2-124m", "llama-1.1b"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    compile_kernels()
    rows = {}
    for name in args.only:
        a = load_model_folder(args.root / f"{name}-seed0", precision="float32")
        b = load_model_folder(args.root / f"{name}-planted", spec=a.spec)
        results = {}

        def run(overlap: bool, a=a, b=b, results=results) -> None:
            matcher = WeightMatcher(a.spec, b.params, overlap=overlap)
            results[overlap] = matcher.match(a.params, distances=False)

        seconds = timed(
            {"sequential": lambda: run(False), "overlap": lambda: run(True)}, args.repeats
        )
        assert results[True].perm == results[False].perm
        rows[name] = {
            **{k: round(v, 2) for k, v in seconds.items()},
            "speedup": round(seconds["sequential"] / seconds["overlap"], 3),
            "sweeps": results[True].iterations,
            "formed_ahead": results[True].info["formed_ahead"],
        }
        print(name, rows[name], flush=True, file=sys.stderr)
    print(json.dumps({"benchmark": "overlap", "machine": machine("cpu"), "models": rows}, indent=1))


if __name__ == "__main__":
    main()
