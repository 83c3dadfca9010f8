"""Weight-matching speed: plain vs dual-warm-started, against the GEMM floor and `rebasin`.

For each model pair (two random initialisations; plus trained Fashion-MNIST MLPs when
``--runs`` holds ``mlp-fashion-mnist-seed{0,1}``) it times weight matching with cold LAP
solves (``warm_start=False``, each LAP started from reduction duals), with STE-MM's dual
warm start, and with SciPy's solver, and reports per variant the total time, the time in
matrix products and in LAPs, sweeps, objective, and two GEMM floors (FLOPs divided by the
highest float32 matmul throughput measured over WM's typical shapes in the same run, so
they are lower bounds): ``full_sweeps`` counts every cost
matrix of Alg. 1's sweeps; ``performed`` counts only the products actually formed (a group
whose neighbours did not change since its last solve is skipped, which is exact).

``--ste-steps`` also replays an STE-like sequence (the proxy drifts by Adam-sized steps,
each step re-projected with WM from the previous permutation) on ResNet-20 ×4 and on the
trained MLPs — SciPy, cold ``lapjv`` and warm ``lapjv`` — and reports time per step. When
the PyPI package ``rebasin`` is installed, its PermutationCoordinateDescent runs on the same
MLP pairs, both sides timed from two modules in to model B aligned out. Prints one JSON.

    python benchmarks/bench_match.py [--models mlp3x512 resnet20x8 ...] [--runs DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

from _timing import synchronize
from lmckit.checkpoint import load_checkpoint
from lmckit.match import ProfiledWeightMatcher, weight_matching
from lmckit.models import permutation_spec
from lmckit.params import params_distance
from lmckit.train import init_model

MODELS = {
    "mlp3x512": ("mlp", {"in_dim": 784, "hidden": [512] * 3}),
    "mlp3x2048": ("mlp", {"in_dim": 784, "hidden": [2048] * 3}),
    "vgg11x1": ("vgg", {"depth": 11, "width_multiplier": 1, "in_channels": 1}),
    "resnet20x4": ("resnet20", {"width_multiplier": 4}),
    "resnet20x8": ("resnet20", {"width_multiplier": 8}),
}


PROBE_SHAPES = ((512, 784), (512, 4608), (1024, 4608), (2048, 2048), (2048, 18432))


def matmul_throughput(dtype=torch.float32, device: str = "cpu") -> float:
    """The best FLOP/s of ``A @ Bᵀ`` (A, B: n × k) over WM's typical shapes (on a GPU also
    8192 × 8192), best of 5 runs each — the highest rate seen, so FLOPs divided by it is a
    lower bound on product time."""
    best_rate = 0.0
    shapes = PROBE_SHAPES + (((8192, 8192),) if torch.device(device).type == "cuda" else ())
    for n, k in shapes:
        x = torch.randn(n, k, dtype=dtype, device=device)
        y = torch.randn(n, k, dtype=dtype, device=device)
        x @ y.T
        best = float("inf")
        for _ in range(5):
            synchronize()
            t = time.perf_counter()
            x @ y.T
            synchronize()
            best = min(best, time.perf_counter() - t)
        best_rate = max(best_rate, 2 * n * k * n / best)
    return best_rate


def flops_per_sweep(spec, params) -> int:
    return sum(
        2 * spec.groups[g] * params[name].numel()
        for g in spec.groups
        for name, _ in spec.group_axes(g)
        if params[name].dtype.is_floating_point
    )


def profiled_wm(spec, a, b, *, lap_backend: str = "jv", **options):
    """Weight matching with time and FLOP counters (``result.info``)."""
    return ProfiledWeightMatcher(spec, b, lap_backend=lap_backend).match(a, **options)


def run_variants(spec, a, b, throughput: float) -> dict:
    out = {}
    per_sweep = flops_per_sweep(spec, a)
    for label, kwargs in [
        ("cold", {"warm_start": False}),
        ("warm", {"warm_start": True}),
        ("scipy", {"warm_start": False, "lap_backend": "scipy"}),
    ]:
        r = profiled_wm(spec, a, b, **kwargs)
        floor = r.info["gemm_flops"] / throughput
        full = per_sweep * r.iterations / throughput
        out[label] = {
            "seconds": r.seconds,
            "gemm_seconds": r.info["gemm_seconds"],
            "lap_seconds": r.info["lap_seconds"],
            "sweeps": r.iterations,
            "lap_solves": r.info["lap_solves"],
            "skipped_solves": r.info["skipped_solves"],
            "gemm_flops": r.info["gemm_flops"],
            "objective": r.history[-1],
            "distance_before": r.distance_before,
            "distance_after": r.distance_after,
            "gemm_floor_performed_seconds": floor,
            "total_over_performed_floor": r.seconds / floor,
            "gemm_floor_full_sweeps_seconds": full,
            "total_over_full_sweeps_floor": r.seconds / full,
        }
    out["warm_speedup_over_cold"] = out["cold"]["seconds"] / out["warm"]["seconds"]
    out["same_objective"] = abs(out["cold"]["objective"] - out["warm"]["objective"]) <= 1e-6 * abs(
        out["cold"]["objective"]
    )
    return out


def ste_like(spec, a, b, steps: int, lr: float = 1e-3, seed: int = 0) -> dict:
    """Replay STE's projections: proxy ← proxy + Adam-sized step; π ← WM(proxy, B)."""
    first = weight_matching(spec, a, b)
    out = {}
    for label, warm, backend in (
        ("scipy", False, "scipy"),
        ("cold", False, "lapjv"),
        ("warm", True, "lapjv"),
    ):
        g = torch.Generator().manual_seed(seed)  # the same drift for every variant
        proxy = {k: v.clone() for k, v in a.items()}
        perm, duals = first.perm, first.duals if warm else None
        wm_s, lap_s, sweeps = 0.0, 0.0, 0
        for _ in range(steps):
            for k, v in proxy.items():
                if v.dtype.is_floating_point and not k.endswith(("running_mean", "running_var")):
                    v.add_(lr * torch.sign(torch.randn(v.shape, generator=g)))
            r = profiled_wm(
                spec, proxy, b, init=perm, duals=duals, warm_start=warm, lap_backend=backend
            )
            perm, duals = r.perm, r.duals
            wm_s += r.seconds
            lap_s += r.info["lap_seconds"]
            sweeps += r.iterations
        out[label] = {
            "wm_seconds_per_step": wm_s / steps,
            "lap_seconds_per_step": lap_s / steps,
            "sweeps_per_step": sweeps / steps,
        }
    out["steps"] = steps
    out["lap_speedup_warm_over_cold"] = (
        out["cold"]["lap_seconds_per_step"] / out["warm"]["lap_seconds_per_step"]
    )
    out["wm_speedup_warm_over_cold"] = (
        out["cold"]["wm_seconds_per_step"] / out["warm"]["wm_seconds_per_step"]
    )
    out["lap_speedup_warm_over_scipy"] = (
        out["scipy"]["lap_seconds_per_step"] / out["warm"]["lap_seconds_per_step"]
    )
    out["wm_speedup_warm_over_scipy"] = (
        out["scipy"]["wm_seconds_per_step"] / out["warm"]["wm_seconds_per_step"]
    )
    return out


def digits_trained_pair(name: str, config: dict, epochs: int):
    """Two models trained briefly on the bundled digits (8×8), for trained-looking weights."""
    from lmckit.data import load_dataset
    from lmckit.train import TrainConfig, train

    data = load_dataset("digits")
    config = {**config, "in_channels": 1}
    params = []
    for seed in (0, 1):
        model = init_model(name, config, seed)
        cfg = TrainConfig(
            epochs=epochs,
            batch_size=128,
            optimizer="sgd",
            lr=0.05,
            nesterov=True,
            weight_decay=5e-4,
            schedule="warmup_linear",
            seed=seed,
        )
        result = train(model, data, cfg, evaluate_each_epoch=False)
        params.append((model.state_dict(), result.test.accuracy))
    return permutation_spec(model), params


def as_sequential(params: dict, hidden: int) -> nn.Module:
    layers = [
        nn.Flatten(),
        nn.Linear(784, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    ]
    seq = nn.Sequential(*layers)
    with torch.no_grad():
        for i, idx in enumerate((1, 3, 5, 7)):
            seq[idx].weight.copy_(params[f"layers.{i}.weight"])
            seq[idx].bias.copy_(params[f"layers.{i}.bias"])
    return seq


def compare_rebasin(a, b, repeats: int = 3) -> dict:
    """PyPI ``rebasin``'s weight matching against lmckit's on the same MLP 3×512 pair, both
    timed from the same point — two modules in, model B aligned out — so each side's setup
    (rebasin: tracing the model; lmckit: building the spec, checking the inputs) and the
    permuting of B count. Best of ``repeats`` runs each."""
    try:
        from rebasin import PermutationCoordinateDescent
    except ImportError:
        return {"installed": False}
    seq_a, seq_b = as_sequential(a, 512), as_sequential(b, 512)
    model_a = init_model("mlp", {"in_dim": 784}, seed=0)
    model_a.load_state_dict(a)

    def theirs():
        moved = copy.deepcopy(seq_b)  # rebasin permutes its model in place
        t = time.perf_counter()
        PermutationCoordinateDescent(seq_a, moved, torch.randn(2, 1, 28, 28)).rebasin()
        return time.perf_counter() - t, moved.state_dict()

    def ours():
        t = time.perf_counter()
        spec = permutation_spec(model_a)
        aligned = weight_matching(spec, model_a.state_dict(), b).perm.apply(b)
        return time.perf_counter() - t, aligned

    runs_theirs = [theirs() for _ in range(repeats)]
    runs_ours = [ours() for _ in range(repeats)]
    rebasin_s, lmckit_s = min(r[0] for r in runs_theirs), min(r[0] for r in runs_ours)
    rb_dist = params_distance(seq_a.state_dict(), runs_theirs[0][1])
    our_dist = params_distance(a, runs_ours[0][1])
    return {
        "installed": True,
        "timed_from": "two modules in, model B aligned out (setup and checks included)",
        "rebasin_seconds": rebasin_s,
        "rebasin_distance_after": rb_dist,
        "lmckit_seconds": lmckit_s,
        "lmckit_distance_after": our_dist,
        "distance_before": params_distance(a, b),
        "speedup_lmckit_over_rebasin": rebasin_s / lmckit_s,
        "lmckit_objective_at_least_as_good": our_dist <= rb_dist + 1e-6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--runs", type=Path, help="folder with mlp-fashion-mnist-seed{0,1}")
    parser.add_argument("--ste-steps", type=int, default=10)
    parser.add_argument(
        "--digits-epochs",
        type=int,
        default=0,
        help="also train two ResNet-20 ×4 on digits this long and match them",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    throughput = matmul_throughput()
    report = {
        "benchmark": "weight_matching",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "matmul_gflops": throughput / 1e9,
        "models": {},
    }
    for key in args.models:
        name, config = MODELS[key]
        model_a = init_model(name, config, seed=0)
        spec = permutation_spec(model_a)
        a, b = model_a.state_dict(), init_model(name, config, seed=1).state_dict()
        entry = {"pair": "random-init", "flops_per_sweep": flops_per_sweep(spec, a)}
        entry.update(run_variants(spec, a, b, throughput))
        if key == "resnet20x4" and args.ste_steps:
            entry["ste_like"] = ste_like(spec, a, b, args.ste_steps)
        if key == "mlp3x512":
            entry["rebasin"] = compare_rebasin(a, b)
        report["models"][key] = entry
    if args.digits_epochs:
        spec, ((a, acc_a), (b, acc_b)) = digits_trained_pair(
            *MODELS["resnet20x4"], args.digits_epochs
        )
        entry = {
            "pair": f"digits-trained ({args.digits_epochs} epochs; "
            f"test acc {acc_a:.3f}, {acc_b:.3f})",
            "flops_per_sweep": flops_per_sweep(spec, a),
        }
        entry.update(run_variants(spec, a, b, throughput))
        if args.ste_steps:
            entry["ste_like"] = ste_like(spec, a, b, args.ste_steps)
        report["models"]["resnet20x4-digits-trained"] = entry
    if args.runs is not None:
        ca = load_checkpoint(args.runs / "mlp-fashion-mnist-seed0")
        cb = load_checkpoint(args.runs / "mlp-fashion-mnist-seed1")
        entry = {
            "pair": "trained fashion-mnist",
            "flops_per_sweep": flops_per_sweep(ca.spec, ca.params),
        }
        entry.update(run_variants(ca.spec, ca.params, cb.params, throughput))
        if args.ste_steps:
            entry["ste_like"] = ste_like(ca.spec, ca.params, cb.params, args.ste_steps)
        entry["rebasin"] = compare_rebasin(ca.params, cb.params)
        report["models"]["mlp3x512-trained"] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
