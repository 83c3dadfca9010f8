"""STE-MM's projections side by side (one per thread) against one after the other, on
all the machine's torch threads: seconds per step of Alg. 1 (``recipe="paper"``, where
the projections are most of a step) and whether the two merges are the same.

One after the other, each projection's products use every thread and its LAPs overlap
them in one extra thread; side by side, ``min(n - 1, T)`` projections run at once, each
with one torch thread and its own LAPs. For each width: ``--models`` 3-layer MLPs trained
``--train-epochs`` on the first 6,400 Fashion-MNIST images, then ``--steps`` steps of 256
(after a warm-up merge), the two schedules alternated ``--repeats`` times; the median
seconds per step, their ratio, and a digest of each merge's weights. Prints JSON.

    python benchmarks/bench_stemm_threads.py [--widths 1 2] [--models 3] [--threads T]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import statistics
import sys
import time

import torch

from _timing import add_device_argument, machine, synchronize
from lmckit.data import load_dataset
from lmckit.merge import ste_mm
from lmckit.models import permutation_spec
from lmckit.train import TrainConfig, init_model, train

BATCH = 256
ste_mm_module = importlib.import_module("lmckit.merge.ste_mm")


def digest(params) -> str:
    return hashlib.sha256(b"".join(v.cpu().numpy().tobytes() for v in params.values())).hexdigest()


def one_width(width: float, flat, args) -> dict:
    subset = dataclasses.replace(flat, train_x=flat.train_x[:6400], train_y=flat.train_y[:6400])
    steps = dataclasses.replace(
        flat, train_x=flat.train_x[: args.steps * BATCH], train_y=flat.train_y[: args.steps * BATCH]
    )
    models = []
    for seed in range(args.models):
        model = init_model("mlp", {"in_dim": 784, "hidden": [round(512 * width)] * 3}, seed)
        model = model.to(args.device)
        cfg = TrainConfig(epochs=args.train_epochs, batch_size=512, lr=1e-3, seed=seed)
        train(model, subset, cfg, evaluate_each_epoch=False)
        models.append(model)
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    schedules = {"side_by_side": True, "one_after_another": False}
    times: dict[str, list[float]] = {k: [] for k in schedules}
    merged: dict[str, str] = {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name, side_by_side in schedules.items():
            ste_mm_module._SIDE_BY_SIDE = side_by_side
            synchronize()
            start = time.perf_counter()
            result = ste_mm(spec, params, model=models[0], data=steps, epochs=1,
                            batch_size=BATCH, recipe="paper", seed=1)  # fmt: skip
            synchronize()
            if repeat:
                times[name].append((time.perf_counter() - start) / args.steps)
            merged[name] = digest(result.merged)
    ste_mm_module._SIDE_BY_SIDE = True
    out = {"width": width, "units": round(512 * width), "models": args.models}
    for name, seconds in times.items():
        out[name] = {"seconds_per_step": statistics.median(seconds), "runs": seconds}
    out["speedup"] = (
        out["one_after_another"]["seconds_per_step"] / out["side_by_side"]["seconds_per_step"]
    )
    out["same_merge"] = merged["side_by_side"] == merged["one_after_another"]
    print(f"width {width}: {out['speedup']:.2f}× faster side by side", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--widths", type=float, nargs="+", default=[1, 2])
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--train-epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    add_device_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flat = load_dataset("fashion-mnist", args.data_dir)
    rows = [one_width(w, flat, args) for w in args.widths]
    print(json.dumps({"benchmark": "stemm_threads", "machine": machine(args.device),
                      "widths": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
