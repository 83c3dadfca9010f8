"""What the width study's layerwise diagnostics cost, beside evaluation passes.

Two 3×512 MLPs (Fashion-MNIST shapes, random weights) on 10,000 examples in batches of
1,000: :func:`lmckit.analysis.layerwise` at λ = ½ — LEWC, weak additivity, second moments,
reciprocal orthogonality, commutativity, activation norms and cosines, for every layer, in
one pass that runs A, B and the merged model and forms ``W_A z_B``, ``W_B z_A`` and
``W_A z_C`` per layer — against the baseline: one evaluation pass (:func:`lmckit.metrics.
evaluate`, loss and accuracy of one model over the same batches). Target: ≤ 3 evaluation
passes. The work itself puts a floor under that: three forward passes (A, B, merged) and
three extra products per weight layer after the first — timed bare as ``gemm_floor`` (the
three forwards and the products on stored inputs, nothing else): about 4.3 evaluation passes
on this MLP, so the target as written cannot be met by any implementation that computes
these metrics; ``layerwise_over_floor`` is the figure of merit. A ResNet-20 ×1 pair on
2,000 32×32 examples is timed for reference (BatchNorm: the merged model's statistics are
given, so no BN reset is timed).

Each variant runs ``--repeats`` times, alternating; prints one JSON with the medians.

    python benchmarks/bench_layerwise.py [--repeats 5] [--threads N] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

from _timing import (
    add_device_argument,
    machine,
    timed,
)  # benchmarks/_timing.py (scripts run from this folder)
from lmckit.analysis.layerwise import layerwise
from lmckit.data import TensorLoader
from lmckit.metrics import evaluate
from lmckit.models import build_model
from lmckit.params import lerp_params


def case(
    name: str, config: dict, shape: tuple, n: int, batch: int, repeats: int, device: str
) -> dict:
    torch.manual_seed(0)
    model = build_model(name, **config).to(device)
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: v.to(device) for k, v in build_model(name, **config).state_dict().items()}
    merged = lerp_params(a, b, 0.5)
    x = torch.randn(n, *shape, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    loader = TensorLoader(x, y, batch_size=batch)
    variants = {
        "evaluation_pass": lambda: evaluate(model, a, loader),
        "layerwise": lambda: layerwise(model, a, b, loader, merged=merged),
    }
    if name == "mlp":
        variants["gemm_floor"] = mlp_floor(model, (a, b, merged), loader)
    times = timed(variants, repeats)
    out = {
        "model": f"{name} {config}",
        "examples": n,
        "seconds": times,
        "layerwise_over_evaluation_pass": times["layerwise"] / times["evaluation_pass"],
    }
    if "gemm_floor" in times:
        out["floor_over_evaluation_pass"] = times["gemm_floor"] / times["evaluation_pass"]
        out["layerwise_over_floor"] = times["layerwise"] / times["gemm_floor"]
    return out


def mlp_floor(model, param_sets, loader) -> Callable[[], None]:
    """Three forwards and three products ``W z`` per hidden/output layer after the first,
    on hidden activations computed beforehand."""
    weights = [param_sets[0][f"layers.{i}.weight"] for i in range(len(model.layers))]
    hidden = []
    with torch.no_grad():
        for x, _ in loader:
            h, zs = x.flatten(1), []
            for w in weights[:-1]:
                h = F.relu(F.linear(h, w))
                zs.append(h)
            hidden.append(zs)

    def floor() -> None:
        with torch.no_grad():
            for (x, _), zs in zip(loader, hidden, strict=True):
                for params in param_sets:
                    torch.func.functional_call(model, params, (x,))
                for z, w in zip(zs, weights[1:], strict=True):
                    for _ in range(3):
                        F.linear(z, w)

    return floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    add_device_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    mlp = case("mlp", {}, (1, 28, 28), 10_000, 1000, args.repeats, args.device)
    mlp["target"] = (
        "layerwise ≤ 3 evaluation passes (below the floor: see floor_over_evaluation_pass)"
    )
    mlp["meets_target"] = mlp["layerwise_over_evaluation_pass"] <= 3.0
    resnet = case(
        "resnet20",
        {"in_channels": 1},
        (1, 32, 32),
        2_000,
        500,
        max(1, args.repeats // 2),
        args.device,
    )
    print(
        json.dumps(
            {
                "benchmark": "layerwise",
                "machine": machine(args.device),
                "mlp_3x512": mlp,
                "resnet20_x1": resnet,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
