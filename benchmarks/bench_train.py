"""Training throughput on Fashion-MNIST: seconds per epoch for the papers' models.

Times ``--steps`` optimisation steps (after ``--warmup`` untimed ones) of each model with
its paper recipe and extrapolates to a full epoch of 60,000 images; ``--full-epoch`` times
a whole epoch instead. Prints one JSON document.

    python benchmarks/bench_train.py [--models mlp vgg11] [--steps 30] [--full-epoch]
                                     [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import torch.nn.functional as F

from _timing import add_device_argument, machine, synchronize  # benchmarks/_timing.py
from lmckit.train import TrainConfig, _make_optimizer, init_model
from lmckit.workflows.training import load_for_model, model_config_for


def time_model(name: str, steps: int, warmup: int, full_epoch: bool, device: str) -> dict:
    data = load_for_model(name, "fashion-mnist", download=False)
    cfg = TrainConfig.paper_defaults(name, data.name, epochs=1)
    model = init_model(name, model_config_for(name, data), seed=0).to(device)
    opt = _make_optimizer(model, cfg)
    loader = data.loader(
        "train", batch_size=cfg.batch_size, shuffle=True, drop_last=True, device=device
    )
    steps_per_epoch = len(loader)
    model.train()
    timed, t0 = 0, None
    for i, (x, y) in enumerate(loader):
        if i == warmup:
            synchronize()
            t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= warmup:
            timed += 1
        if not full_epoch and timed == steps:
            break
    synchronize()
    seconds = time.perf_counter() - t0
    return {
        "model": name,
        "input_shape": list(data.input_shape),
        "params": sum(p.numel() for p in model.parameters()),
        "batch_size": cfg.batch_size,
        "steps_timed": timed,
        "seconds_per_step": seconds / timed,
        "seconds_per_epoch": seconds / timed * steps_per_epoch,
        "extrapolated": not full_epoch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["mlp", "vgg11"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--full-epoch", action="store_true")
    add_device_argument(parser)
    args = parser.parse_args()
    results = [
        time_model(m, args.steps, args.warmup, args.full_epoch, args.device) for m in args.models
    ]
    print(
        json.dumps(
            {
                "benchmark": "train_epoch_time_fashion_mnist",
                "machine": machine(args.device),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
