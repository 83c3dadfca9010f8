"""Weight matching's local optima on narrow networks, and what restarts buy.

A bias-free MLP ``21 → 5 → 17 → 3`` and a randomly permuted copy of it: the planted
permutation is the global optimum (distance 0), yet coordinate descent from the identity
stops elsewhere for many seeds. For each number of restarts (best of k starts: the identity,
then seeded random permutations with other group orders) this counts the seeds whose
planted permutation is missed and times the calls. Prints one JSON.

    python benchmarks/bench_restarts.py [--seeds 200] [--restarts 1 2 5 10 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from lmckit.match import weight_matching
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation

CONFIG = {"in_dim": 21, "hidden": [5, 17], "out_dim": 3, "bias": False}


def planted(seed: int):
    torch.manual_seed(seed)
    model = build_model("mlp", **CONFIG)
    spec = permutation_spec(model)
    a = model.state_dict()
    truth = Permutation.random(spec, 1000 + seed)
    return spec, a, truth.inverse().apply(a), truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--restarts", type=int, nargs="+", default=[1, 2, 5, 10, 20])
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [planted(seed) for seed in range(args.seeds)]
    rows = []
    for k in args.restarts:
        missed, seconds = 0, 0.0
        for seed, (spec, a, b, truth) in enumerate(cases):
            t0 = time.perf_counter()
            result = weight_matching(spec, a, b, seed=seed, restarts=k)
            seconds += time.perf_counter() - t0
            missed += result.perm != truth
        rows.append(
            {
                "restarts": k,
                "missed": missed,
                "missed_fraction": missed / args.seeds,
                "ms_per_call": 1000 * seconds / args.seeds,
            }
        )
    print(
        json.dumps(
            {
                "benchmark": "weight_matching restarts on planted narrow MLPs",
                "model": CONFIG,
                "seeds": args.seeds,
                "machine": {"python": platform.python_version(), "torch": torch.__version__},
                "threads": 1,
                "results": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
