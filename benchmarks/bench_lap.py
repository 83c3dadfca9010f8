"""The LAP trap behind ``lmckit.lap.solve_lap``'s cold start, measured.

Weight matching's first cost matrices have strong row/column structure (a rank-one part
dominates). On such a matrix plain Jonker–Volgenant (``lapjv`` on the cost as it is) is
pathologically slow; started from the row-then-column reduction duals — what
``solve_lap`` does for a cold solve — it is fast; SciPy's ``linear_sum_assignment`` lies
between. Also times a warm start from the duals of a slightly different matrix, as inside
weight matching. All four give the same optimum (checked). Prints one JSON document.

    python benchmarks/bench_lap.py [--n 1024 2048 4096] [--plain-max 2048]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import lapjv
import numpy as np
from scipy.optimize import linear_sum_assignment

from lmckit.lap import compile_kernels, solve_lap


def rank_one_dominated(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = np.abs(rng.standard_normal(n)) + 1
    return np.outer(a, a[::-1]) + 0.01 * rng.standard_normal((n, n))


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(n: int, plain: bool) -> dict:
    gains = rank_one_dominated(n)
    rows = np.arange(n)
    results = {}
    seconds, (_, cols) = timed(lambda: linear_sum_assignment(gains, maximize=True))
    best = gains[rows, cols].sum()
    results["scipy"] = {"seconds": seconds, "objective": float(best)}
    drifted = gains + 1e-3 * np.random.default_rng(1).standard_normal(gains.shape)
    for backend, suffix in (("jv", ""), ("lapjv", "_lapjv")):
        seconds, (p, _) = timed(lambda: solve_lap(gains, backend=backend))  # noqa: B023
        results["solve_lap_cold" + suffix] = {
            "seconds": seconds,
            "objective": float(gains[rows, p].sum()),
        }
        _, drift_duals = solve_lap(drifted, backend=backend)
        seconds, (p, _) = timed(
            lambda: solve_lap(gains, duals=drift_duals, backend=backend)  # noqa: B023
        )
        results["solve_lap_warm" + suffix] = {
            "seconds": seconds,
            "objective": float(gains[rows, p].sum()),
        }
    if plain:
        seconds, (cols, _, _) = timed(lambda: lapjv.lapjv(-gains, force_doubles=True))
        results["lapjv_plain"] = {"seconds": seconds, "objective": float(gains[rows, cols].sum())}
    for entry in results.values():
        entry["optimal"] = bool(np.isclose(entry["objective"], best, rtol=1e-12, atol=0))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument(
        "--plain-max", type=int, default=2048, help="largest n to run plain lapjv on (slow)"
    )
    args = parser.parse_args()
    compile_kernels()  # numba's kernels compiled or loaded before anything is timed
    print(
        json.dumps(
            {
                "benchmark": "lap_rank_one_dominated",
                "machine": platform.machine(),
                "variants": {
                    "scipy": "scipy.optimize.linear_sum_assignment",
                    "solve_lap_cold": "solve_lap's default backend (lmckit's compiled JV) "
                    "from the row-then-column reduction",
                    "solve_lap_warm": "the same, started from the duals and assignment of a "
                    "slightly perturbed matrix (as inside weight matching)",
                    "solve_lap_cold_lapjv": "backend='lapjv': the lapjv package started from "
                    "the row-then-column reduction duals (the earlier default)",
                    "solve_lap_warm_lapjv": "backend='lapjv' from the perturbed matrix's duals",
                    "lapjv_plain": "lapjv on the cost as it is",
                },
                "results": {str(n): measure(n, n <= args.plain_max) for n in args.n},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
