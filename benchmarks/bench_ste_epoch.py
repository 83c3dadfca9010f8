"""One STE epoch against one plain training epoch of the same model and batch size.

STE (Git Re-Basin §3.3) trains a proxy of model A whose every step projects onto the
permutations of B by weight matching; its epoch costs a training epoch plus the
projections. For the demo's MLP (3×512, Fashion-MNIST) and ResNet-20 ×1 it times, in one
run and on the same data: a training epoch (``lmckit.train``, Adam, the given batch size),
an STE epoch with lmckit's weight-matching engine, and an STE epoch with the previous
engine (cost-matrix terms re-formed every time: ``WeightMatcher(delta=None)``), an STE
epoch with the engine as the previous stop left it (re-formed every 8 sweeps, LAPs by the
``lapjv`` package), and reports the ratios and the share of the STE epoch spent in weight
matching. Prints JSON.

    python benchmarks/bench_ste_epoch.py --data-dir .data [--examples 60000] [--device cuda]

(ResNet-20 runs on a quarter of ``--examples``, Fashion-MNIST padded to 32×32.)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time

import lmckit.match.ste as ste_module
from _timing import add_device_argument, machine
from lmckit.data import load_dataset
from lmckit.match import ste_matching
from lmckit.match.weight_matcher import DeltaPolicy, WeightMatcher
from lmckit.models import permutation_spec
from lmckit.train import TrainConfig, init_model, train


def one_case(name, config, data, batch_size, device="cpu") -> dict:
    a_model, b_model = (init_model(name, config, seed).to(device) for seed in (0, 1))
    spec = permutation_spec(a_model)
    cfg = TrainConfig(epochs=1, batch_size=batch_size, optimizer="adam", lr=1e-3, seed=0)
    # one-time costs (kernel selection, allocator growth) paid before anything is timed
    warm = init_model(name, config, 2).to(device)
    train(warm, head(data, 4 * batch_size), cfg, evaluate_each_epoch=False)
    ste_matching(
        spec, warm.state_dict(), b_model.state_dict(), model=warm,
        data=head(data, 4 * batch_size), epochs=1, batch_size=batch_size,
    )  # fmt: skip
    # the epoch's own time: train() then evaluates the whole training split, not counted
    train_seconds = train(a_model, data, cfg, evaluate_each_epoch=False).history[0].seconds
    a, b = a_model.state_dict(), b_model.state_dict()
    out = {
        "examples": len(data.train_y),
        "batch_size": batch_size,
        "train_epoch_seconds": train_seconds,
    }
    engines = {"ste_previous_engine": functools.partial(WeightMatcher, delta=None)}
    # as the previous stop left it: re-formed every 8 sweeps, every LAP by lapjv
    engines["ste_previous_stop"] = functools.partial(
        WeightMatcher, delta=DeltaPolicy(refresh=8), lap_backend="lapjv"
    )
    engines["ste"] = WeightMatcher
    for label, engine in engines.items():
        ste_module.WeightMatcher = engine
        try:
            t = time.perf_counter()
            result = ste_matching(
                spec, a, b, model=a_model, data=data, epochs=1, batch_size=batch_size
            )
            seconds = time.perf_counter() - t
        finally:
            ste_module.WeightMatcher = WeightMatcher
        out[label] = {
            "epoch_seconds": seconds,
            "over_training_epoch": seconds / train_seconds,
            "wm_seconds": result.info["wm_seconds"],
            "wm_share": result.info["wm_seconds"] / seconds,
            "steps": result.iterations,
        }
    return out


def head(data, examples: int):
    """The first ``examples`` training examples; a token test split, so that the training
    run's final evaluation does not count as training time."""
    return dataclasses.replace(
        data,
        train_x=data.train_x[:examples],
        train_y=data.train_y[:examples],
        test_x=data.test_x[:8],
        test_y=data.test_y[:8],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--examples", type=int, default=60000)
    parser.add_argument("--batch-size", type=int, default=256)
    add_device_argument(parser)
    args = parser.parse_args()
    flat = head(load_dataset("fashion-mnist", args.data_dir), args.examples)
    padded = head(load_dataset("fashion-mnist", args.data_dir, pad_to=32), args.examples // 4)
    rows = {
        "mlp3x512": one_case("mlp", {"in_dim": 784}, flat, args.batch_size, args.device),
        "resnet20x1": one_case(
            "resnet20",
            {"width_multiplier": 1, "in_channels": 1},
            padded,
            args.batch_size,
            args.device,
        ),
    }
    print(
        json.dumps(
            {"benchmark": "ste_epoch", "machine": machine(args.device), "models": rows}, indent=2
        )
    )


if __name__ == "__main__":
    main()
