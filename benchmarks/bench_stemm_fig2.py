"""STE-MM Fig. 2's protocol: the time to find permutations with and without warm LAP duals.

STE-MM §4.2 accelerates weight matching by handing every LAP the dual variables of the
previous solve of the same group (Alg. 3). Its Fig. 2 times WM and one epoch of STE for two
models, with and without the acceleration, three times each (mean ± std), and reports at
least ~10× (ResNet-20: 40×). This script runs the same protocol on this machine's models —
3×512 MLPs trained on Fashion-MNIST and ResNet-20 ×1 on a quarter of it (32×32) — for WM,
STE (one epoch) and STE-MM (one epoch, three models), warm (``wm-fast``, ``warm_duals=True``)
against cold (every LAP from scratch, within a projection too), on the same seeds, and
checks that both find the same permutations (the duals only save work). Prints JSON.

    python benchmarks/bench_stemm_fig2.py [--data-dir DIR] [--train-epochs 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from _timing import add_device_argument, machine, synchronize
from lmckit.data import load_dataset
from lmckit.match import ste_matching, weight_matching
from lmckit.merge import ste_mm
from lmckit.models import permutation_spec
from lmckit.train import TrainConfig, init_model, train


def _timed(fn):
    synchronize()
    start = time.perf_counter()
    result = fn()
    synchronize()
    return time.perf_counter() - start, result


def _summary(seconds: list[float]) -> dict:
    return {
        "mean": statistics.fmean(seconds),
        "std": statistics.stdev(seconds) if len(seconds) > 1 else None,
        "runs": seconds,
    }


def _compare(label, warm_fn, cold_fn, repeats, same) -> dict:
    """Warm and cold alternated ``repeats`` times (seed = repeat index), after one
    untimed call of each (one-time costs: thread pools, allocator growth)."""
    warm_fn(0)
    cold_fn(0)
    times = {"warm": [], "cold": []}
    agree = []
    for seed in range(repeats):
        t_warm, warm = _timed(lambda s=seed: warm_fn(s))
        t_cold, cold = _timed(lambda s=seed: cold_fn(s))
        times["warm"].append(t_warm)
        times["cold"].append(t_cold)
        agree.append(same(warm, cold))
    out = {k: _summary(v) for k, v in times.items()}
    out["speedup"] = out["cold"]["mean"] / out["warm"]["mean"]
    out["same_permutations"] = all(agree)
    line = (
        f"{label}: warm {out['warm']['mean']:.2f} s, cold {out['cold']['mean']:.2f} s, "
        f"{out['speedup']:.1f}×, same: {out['same_permutations']}"
    )
    print(line, file=sys.stderr, flush=True)
    return out


def one_model(name, config, data, args) -> dict:
    cfg = TrainConfig(epochs=args.train_epochs, batch_size=512, optimizer="adam", lr=1e-3)
    models = []
    for seed in range(3):
        model = init_model(name, config, seed).to(args.device)
        train(model, data, dataclasses.replace(cfg, seed=seed), evaluate_each_epoch=False)
        models.append(model)
    spec = permutation_spec(models[0])
    params = [m.state_dict() for m in models]
    a, b = params[0], params[1]
    batch = {"model": models[0], "data": data, "epochs": 1, "batch_size": 256}
    out = {"examples": len(data.train_y), "train_epochs": args.train_epochs}
    out["wm"] = _compare(
        f"{name} WM",
        lambda s: weight_matching(spec, a, b, seed=s, warm_start=True),
        lambda s: weight_matching(spec, a, b, seed=s, warm_start=False),
        args.repeats,
        lambda w, c: w.perm == c.perm,
    )
    out["ste"] = _compare(
        f"{name} STE",
        lambda s: ste_matching(spec, a, b, seed=s, **batch),
        lambda s: ste_matching(spec, a, b, seed=s, warm_duals=False, **batch),
        args.ste_repeats or args.repeats,
        lambda w, c: w.perm == c.perm,
    )
    if name == "mlp":
        out["ste_mm_n3"] = _compare(
            f"{name} STE-MM n=3",
            lambda s: ste_mm(spec, params, seed=s, **batch),
            lambda s: ste_mm(spec, params, seed=s, warm_duals=False, **batch),
            args.ste_repeats or args.repeats,
            lambda w, c: w.perms == c.perms,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--train-epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="the paper's three runs")
    parser.add_argument("--ste-repeats", type=int, default=None, help="default: --repeats")
    parser.add_argument("--skip-resnet", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args()
    flat = load_dataset("fashion-mnist", args.data_dir)
    rows = {"mlp3x512": one_model("mlp", {"in_dim": 784}, flat, args)}
    if not args.skip_resnet:
        padded = load_dataset("fashion-mnist", args.data_dir, pad_to=32)
        quarter = dataclasses.replace(
            padded, train_x=padded.train_x[:15000], train_y=padded.train_y[:15000]
        )
        config = {"width_multiplier": 1, "in_channels": 1}
        rows["resnet20x1"] = one_model("resnet20", config, quarter, args)
    paper = {
        "claim": "WM and STE with warm duals at least about 10x faster; ResNet-20 about 40x",
        "models": "MLP 3x512 (MNIST/FMNIST), VGG-11 x4 and ResNet-20 x16 (CIFAR-10)",
        "source": "STE-MM Fig. 2 and §4.3",
    }
    print(
        json.dumps(
            {"benchmark": "stemm_fig2", "machine": machine(args.device), "paper": paper,
             "models": rows},
            indent=2,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
