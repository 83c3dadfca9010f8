"""Time to re-estimate BatchNorm statistics (:func:`lmckit.evaluate.bn_reset`), the bulk of
an interpolation curve of a BatchNorm network: the width study re-calibrates at every
interior λ on the whole training set, 9 × 60,000 Fashion-MNIST images per curve.

Three variants on the same model and batches (random 32×32 images, ``--batch-size``),
alternating within each round (median of ``--repeats``):

* ``floor``: the training-mode forward passes alone, without gradients — what a reset
  must cost at least;
* ``measure_inputs``: the baseline, what lmckit did until 2026-11-30: a forward pre-hook on
  every BatchNorm layer converts its input to float64 and accumulates per-channel Σz and
  Σz², so the statistics are exact over all the examples;
* ``lmckit``: :func:`bn_reset`, whose PyTorch BatchNorm layers hand over the batch
  statistics they compute anyway (momentum 1 during the pass), combined in float64.

``max_rel_diff``: the largest |difference| between the two methods' running means and
variances relative to the statistic (means below 1e-3 in size count as 1e-3). Prints one
JSON document.

    python benchmarks/bench_bn_reset.py [--widths 1 2] [--batches 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import json

import torch

from _timing import add_device_argument, machine, timed  # benchmarks/_timing.py
from lmckit.evaluate import bn_reset
from lmckit.functional import forward, module_mode
from lmckit.train import init_model


def measure_inputs(model, params, batches) -> dict[str, torch.Tensor]:
    """The baseline: every BatchNorm input summed in float64 by a hook."""
    new = {k: v.clone() for k, v in params.items()}
    bns = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    sums: dict[str, list] = {n: [0.0, 0.0, 0] for n, _ in bns}

    def add(name, x):
        z = x.detach().movedim(1, -1).reshape(-1, x.shape[1]).double()
        acc = sums[name]
        acc[0], acc[1], acc[2] = acc[0] + z.sum(0), acc[1] + (z * z).sum(0), acc[2] + len(z)

    hooks = [m.register_forward_pre_hook(lambda _m, i, n=n: add(n, i[0])) for n, m in bns]
    try:
        with torch.no_grad(), module_mode(model, True):
            for x in batches:
                forward(model, new, x)
    finally:
        for h in hooks:
            h.remove()
    for name, (total, squares, count) in sums.items():
        mean = total / count
        var = (squares - count * mean**2).clamp_min(0) / (count - 1)
        new[f"{name}.running_mean"] = mean.to(new[f"{name}.running_mean"])
        new[f"{name}.running_var"] = var.to(new[f"{name}.running_var"])
    return new


def floor(model, params, batches) -> None:
    with torch.no_grad(), module_mode(model, True):
        for x in batches:
            forward(model, params, x)


def run(width: float, n_batches: int, batch_size: int, repeats: int, device: str) -> dict:
    config = {"in_channels": 1, "num_classes": 10, "width_multiplier": width}
    model = init_model("resnet20", config, seed=0).to(device)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    for k, v in params.items():  # BN scales away from 1, so the layers' inputs differ
        if k.endswith(".weight") and v.ndim == 1:
            v.add_((0.5 * torch.randn(v.shape, generator=gen)).to(v))
    batches = [
        (2 * torch.randn(batch_size, 1, 32, 32, generator=gen) + 0.5).to(device)
        for _ in range(n_batches)
    ]
    pairs = [(x, None) for x in batches]
    times = timed(
        {
            "floor": lambda: floor(model, params, batches),
            "measure_inputs": lambda: measure_inputs(model, params, batches),
            "lmckit": lambda: bn_reset(model, params, pairs),
        },
        repeats,
    )
    ours, baseline = bn_reset(model, params, pairs), measure_inputs(model, params, batches)
    worst = max(
        (
            (ours[k].double() - baseline[k].double()).abs()
            / baseline[k].double().abs().clamp_min(1e-3)
        )
        .max()
        .item()
        for k in baseline
        if k.endswith(("running_mean", "running_var"))
    )
    return {
        "model": f"resnet20 x{width}",
        "images": n_batches * batch_size,
        "seconds": {k: round(v, 3) for k, v in times.items()},
        "measure_inputs_over_lmckit": round(times["measure_inputs"] / times["lmckit"], 2),
        "lmckit_over_floor": round(times["lmckit"] / times["floor"], 2),
        "max_rel_diff": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (jobs use 1)")
    add_device_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [
        run(w, args.batches, args.batch_size, args.repeats, args.device) for w in args.widths
    ]
    print(json.dumps({"machine": machine(args.device), "results": results}, indent=2))


if __name__ == "__main__":
    main()
