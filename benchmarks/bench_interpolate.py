"""Time to evaluate an interpolation path: 25 λ × the Fashion-MNIST test set (10,000 images).

Compares, on the same pair of 3×512 MLPs (trained checkpoints from ``--runs`` if given,
otherwise two random initialisations):

* ``naive``: a deep copy of the model per λ with ``load_state_dict`` (what one writes first);
* ``interpolate``: :func:`lmckit.evaluate.interpolate` (one module, ``functional_call`` per λ,
  metrics from the collected logits);
* ``vmap``: all λ at once with ``torch.func.vmap`` over stacked parameters;

next to a floor: the best time of the very matrix products the path needs — every
Linear layer's ``F.linear`` on a batch of the same shape, timed alone, times the number of
batches and of λ — measured in the same run. It leaves out activations, copies and the
metrics, so it is a lower bound. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from _timing import add_device_argument, machine, synchronize  # benchmarks/_timing.py
from lmckit.checkpoint import load_checkpoint
from lmckit.data import load_dataset
from lmckit.evaluate import interpolate
from lmckit.train import init_model


def best_of(fn, repeats: int) -> float:
    fn()
    synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=Path)
    parser.add_argument("--lambdas", type=int, default=25)
    parser.add_argument("--repeats", type=int, default=3)
    add_device_argument(parser)
    args = parser.parse_args()
    device = args.device
    data = load_dataset("fashion-mnist", download=False)
    if args.runs:
        a = load_checkpoint(args.runs / "mlp-fashion-mnist-seed0", device=device)
        b = load_checkpoint(args.runs / "mlp-fashion-mnist-seed1", device=device)
        model, pa, pb = a.model, a.params, b.params
    else:
        model = init_model("mlp", {"in_dim": 784}, 0).to(device)
        pb = {
            k: v.to(device) for k, v in init_model("mlp", {"in_dim": 784}, 1).state_dict().items()
        }
        pa = model.state_dict()
    model.eval()
    lams = torch.linspace(0, 1, args.lambdas, device=device)
    batches = data.test_x.to(device).split(2000)

    def naive():
        for lam in lams:
            m = copy.deepcopy(model)
            m.load_state_dict({k: pa[k] + lam * (pb[k] - pa[k]) for k in pa})
            with torch.no_grad():
                for x in batches:
                    m(x)

    def functional():
        interpolate(
            model,
            pa,
            pb,
            {"test": data.loader("test", batch_size=2000, device=device)},
            lambdas=args.lambdas,
        )

    def vmapped():
        stacked = {
            k: pa[k][None] + lams.view(-1, *[1] * pa[k].ndim) * (pb[k] - pa[k])[None] for k in pa
        }
        f = vmap(lambda p, x: functional_call(model, p, (x,)), in_dims=(0, None))
        with torch.no_grad():
            for x in batches:
                f(stacked, x)

    macs = sum(layer.in_features * layer.out_features for layer in model.layers)
    gemm = 0.0
    with torch.no_grad():
        for layer in model.layers:
            x = torch.randn(2000, layer.in_features, device=device)
            gemm += best_of(lambda x=x, layer=layer: F.linear(x, layer.weight, layer.bias), 10)
    floor = gemm * len(batches) * args.lambdas
    throughput = 2 * macs * len(data.test_x) * args.lambdas / floor
    results = {
        name: best_of(fn, args.repeats)
        for name, fn in (("naive", naive), ("interpolate", functional), ("vmap", vmapped))
    }
    print(
        json.dumps(
            {
                "benchmark": "interpolation_25_lambdas_fmnist_test",
                "machine": machine(device),
                "pair": "trained" if args.runs else "random-init",
                "seconds": results,
                "flop_floor_seconds": floor,
                "matmul_gflops": throughput / 1e9,
                "interpolate_over_floor": results["interpolate"] / floor,
                "speedup_interpolate_over_naive": results["naive"] / results["interpolate"],
                "note": "the deep-copy loop computes no metrics; interpolate also collects "
                "logits and computes loss, accuracy and ECE per λ",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
