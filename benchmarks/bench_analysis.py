"""What the spectral analysis and the Taylor barrier cost, beside their floors.

* **R and spectra** of two ResNet-20 ×4 (random weights of the trained shapes): lmckit's
  ``layer_svds`` of both models, ``alignment`` at γ = 0 and 0.3 and the spectra (read off
  the same SVDs), against the floor: one ``torch.linalg.svd`` of every layer matrix of both
  models, nothing else. Target: ≤ 2× the floor.
* **Taylor barrier** of two 3×512 MLPs on 10,000 MNIST-sized examples and of two
  ResNet-20 ×1 on 2,000 32×32 examples: ``taylor_barrier`` at λ = ½ (slope and curvature at
  both ends, the actual loss at λ) against the floor: one pass over the same data computing
  the gradient and one Hessian-vector product by double backward at one point. Target:
  ≤ 4× the floor. The forward-over-forward alternative (``torch.func.jvp`` of ``jvp``, one
  end) is timed beside them.

Each variant runs ``--repeats`` times, alternating; prints one JSON with the medians.

    python benchmarks/bench_analysis.py [--repeats 5] [--threads N] [--device cuda]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from _timing import (
    add_device_argument,
    machine,
    timed,
)  # benchmarks/_timing.py (scripts run from this folder)
from lmckit.analysis.spectral import alignment, layer_svds
from lmckit.analysis.taylor import taylor_barrier
from lmckit.data import TensorLoader
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation


def spectral_case(repeats: int, device: str) -> dict:
    torch.manual_seed(0)
    models = [build_model("resnet20", width_multiplier=4).to(device) for _ in range(2)]
    spec = permutation_spec(models[0])
    a, b = (m.state_dict() for m in models)
    perm = Permutation.random(spec, 0)
    layers = [k for k, t in a.items() if t.dtype.is_floating_point and t.ndim >= 2]

    def floor():
        for params in (a, b):
            for k in layers:
                t = params[k]
                torch.linalg.svd(t.reshape(t.shape[0], -1).double(), full_matrices=False)

    def ours():
        sa, sb = layer_svds(a), layer_svds(b)
        for gamma in (0.0, 0.3):
            alignment(spec, a, b, perm, gamma=gamma, svds_a=sa, svds_b=sb)
        return {k: (sa[k].S, sb[k].S) for k in sa}

    t = timed({"floor_svd_both_models": floor, "lmckit_R_two_gammas_and_spectra": ours}, repeats)
    return {
        "model": "resnet20 x4",
        "layers": len(layers),
        "seconds": t,
        "ratio": t["lmckit_R_two_gammas_and_spectra"] / t["floor_svd_both_models"],
        "target_ratio": 2.0,
    }


def forward_over_forward(model, params, direction, batches):
    device = next(iter(params.values())).device
    zero, one = torch.zeros((), device=device), torch.ones((), device=device)
    for x, y in batches:

        def line(e, x=x, y=y):
            moved = {
                k: params[k] + e * direction[k] if k in direction else params[k] for k in params
            }
            return F.cross_entropy(torch.func.functional_call(model, moved, (x,)), y)

        def first(e, line=line):
            return torch.func.jvp(line, (e,), (one,))

        torch.func.jvp(first, (zero,), (one,))


def gradient_and_hvp(model, params, direction, batches):
    names = list(direction)
    for x, y in batches:
        leaves = {k: params[k].detach().clone().requires_grad_(True) for k in names}
        out = torch.func.functional_call(model, {**params, **leaves}, (x,))
        loss = F.cross_entropy(out, y)
        grads = torch.autograd.grad(loss, list(leaves.values()), create_graph=True)
        gv = sum((g * direction[k]).sum() for g, k in zip(grads, names, strict=True))
        torch.autograd.grad(gv, list(leaves.values()))


def taylor_case(name: str, config: dict, shape: tuple, n: int, repeats: int, device: str) -> dict:
    torch.manual_seed(0)
    models = [build_model(name, **config).to(device) for _ in range(2)]
    for m in models:
        m.eval()
    a, b = (m.state_dict() for m in models)
    model = models[0]
    x = torch.randn(n, *shape, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    loader = TensorLoader(x, y, batch_size=500)
    batches = list(loader)
    names = [k for k, _ in model.named_parameters()]
    direction = {k: (b[k] - a[k]) / 100 for k in names}
    t = timed(
        {
            "floor_gradient_and_hvp_one_point": lambda: gradient_and_hvp(
                model, a, direction, batches
            ),
            "lmckit_taylor_barrier": lambda: taylor_barrier(model, a, b, loader, lambdas=[0.5]),
            "forward_over_forward_one_point": lambda: forward_over_forward(
                model, a, direction, batches
            ),
        },
        repeats,
    )
    return {
        "model": f"{name} {config}",
        "examples": n,
        "seconds": t,
        "ratio": t["lmckit_taylor_barrier"] / t["floor_gradient_and_hvp_one_point"],
        "target_ratio": 4.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    add_device_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {
        "benchmark": "analysis",
        "machine": machine(args.device),
        "spectral": spectral_case(args.repeats, args.device),
        "taylor": [
            taylor_case("mlp", {"in_dim": 784}, (784,), 10_000, args.repeats, args.device),
            taylor_case(
                "resnet20",
                {"width_multiplier": 1},
                (3, 32, 32),
                2_000,
                max(2, args.repeats // 2),
                args.device,
            ),
        ],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
