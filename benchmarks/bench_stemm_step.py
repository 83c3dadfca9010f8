"""STE-MM's cost per model and step against width: Alg. 1 as written (``recipe="paper"``)
beside lmckit's default, to size the runs that reproduce STE-MM's figures.

Alg. 1 re-runs weight matching from the identity for every model at every step (with the
previous step's LAP duals, Alg. 3); lmckit's default starts at the previous permutation and
usually confirms it in one sweep. A merge of ``n`` models for ``E`` epochs of ``N`` examples
in batches of ``B`` does ``(n − 1) · E · ⌈N/B⌉`` projections, so the time of one projection
step, measured here, sizes the whole run (``stemm-fig3-4``: n ≤ 5 at 1 ×; ``stemm-fig5``:
n = 10 at ¼ … 2 ×). For each width: two 3-layer MLPs trained ``--train-epochs`` on the
first 12,800 Fashion-MNIST images (less converged than the figures' 30-epoch models, whose
matchings may take other sweep counts), then STE-MM for ``--steps`` steps of 256, both
variants alternated ``--repeats`` times; the median seconds per step and the LAPs solved.
Prints JSON with the extrapolated time of one merge of ten models (Fig. 5's n).

    python benchmarks/bench_stemm_step.py [--widths 0.25 0.5 1 2] [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time

from _timing import add_device_argument, machine, synchronize
from lmckit.data import load_dataset
from lmckit.merge import ste_mm
from lmckit.models import permutation_spec
from lmckit.train import TrainConfig, init_model, train

BATCH = 256
STEPS_PER_MERGE = 10 * math.ceil(60_000 / BATCH)  # the figures' 10 epochs of Fashion-MNIST


def one_width(width: float, flat, args) -> dict:
    subset = dataclasses.replace(flat, train_x=flat.train_x[:12800], train_y=flat.train_y[:12800])
    steps = dataclasses.replace(
        flat, train_x=flat.train_x[: args.steps * BATCH], train_y=flat.train_y[: args.steps * BATCH]
    )
    cfg = TrainConfig(epochs=args.train_epochs, batch_size=512, optimizer="adam", lr=1e-3)
    models = []
    for seed in range(2):
        model = init_model("mlp", {"in_dim": 784, "hidden": [round(512 * width)] * 3}, seed)
        model = model.to(args.device)
        train(model, subset, dataclasses.replace(cfg, seed=seed), evaluate_each_epoch=False)
        models.append(model)
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    times: dict[str, list[float]] = {"paper": [], "lmckit": []}
    laps: dict[str, int] = {}
    for repeat in range(args.repeats + 1):  # the first round warms up (compiled solver, caches)
        for recipe in times:
            synchronize()
            start = time.perf_counter()
            result = ste_mm(spec, params, model=models[0], data=steps, epochs=1,
                            batch_size=BATCH, recipe=recipe, seed=repeat)  # fmt: skip
            synchronize()
            if repeat:
                times[recipe].append((time.perf_counter() - start) / args.steps)
                laps[recipe] = result.info["lap_solves"]
    out = {"width": width, "units": round(512 * width)}
    for recipe, seconds in times.items():
        per_step = statistics.median(seconds)
        out[recipe] = {
            "seconds_per_model_step": per_step,
            "runs": seconds,
            "lap_solves": laps[recipe],
            "hours_per_merge_of_ten": per_step * 9 * STEPS_PER_MERGE / 3600,
        }
    out["paper_over_lmckit"] = (
        out["paper"]["seconds_per_model_step"] / out["lmckit"]["seconds_per_model_step"]
    )
    print(
        f"width {width}: paper {out['paper']['seconds_per_model_step']:.3f} s, lmckit "
        f"{out['lmckit']['seconds_per_model_step']:.3f} s per model and step",
        file=sys.stderr,
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--widths", type=float, nargs="+", default=[0.25, 0.5, 1, 2])
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    add_device_argument(parser)
    args = parser.parse_args()
    flat = load_dataset("fashion-mnist", args.data_dir)
    rows = [one_width(w, flat, args) for w in args.widths]
    print(
        json.dumps(
            {
                "benchmark": "stemm_step",
                "machine": machine(args.device),
                "steps_per_merge": STEPS_PER_MERGE,
                "note": "n = 2 merges (one projection per step); a merge of n models does "
                "n - 1 projections per step",
                "widths": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
