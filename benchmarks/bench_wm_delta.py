"""Weight matching with delta-updated cost matrices, against re-forming them and PyPI
``rebasin``, from the Fashion-MNIST MLPs of the issue up to seed scale.

For each trained pair it runs, in one invocation and on one thread (each lmckit variant in
a fresh process of its own, so that its peak memory is its own):

* ``delta``: lmckit's engine (:class:`~lmckit.match.weight_matcher.WeightMatcher`: kept
  cost-matrix terms updated over the columns a neighbour's new permutation moved);
* ``full``: the same engine forming every requested cost matrix anew (``delta=None``:
  the previous implementation's algorithm; skipped for pairs named in ``--delta-only``,
  whose rows then give its cost only as ``gflop_full_recompute``);
* ``previous_stop``: the engine as the previous stop left it — the same updates, matrices
  re-formed every 8 sweeps instead of 16, and every LAP by the ``lapjv`` package, which
  takes no initial assignment, instead of lmckit's compiled warm-start Jonker–Volgenant
  (skipped with ``full`` for ``--delta-only`` pairs);
* ``rebasin``: PyPI ``rebasin`` 0.0.47's ``PermutationCoordinateDescent`` on the same MLP
  as an ``nn.Sequential`` (when importable and ``--rebasin`` names the pair);

(numba's compiled LAP kernels are loaded in each process before its clock starts; the
load, ~0.3 s from numba's on-disk cache, is reported as ``lap_kernels_load_seconds``) and
reports CPU seconds (``time.process_time``), sweeps, GFLOP of products formed beside
what forming every requested term would cost, the LAP share of the time, the peak resident
memory added by the run (``VmHWM`` after resetting it through ``/proc/self/clear_refs``,
minus the resident size before) against the two models' parameters — once as the process
runs by default and once more with glibc's mmap threshold fixed at 1 MiB
(``MALLOC_MMAP_THRESHOLD_``: large blocks then go back to the system when freed, so the
peak is what the run holds, not what the allocator kept from earlier blocks) —, the
objective and the distance after, and two floors: the time of one full sweep's products at
the machine's measured float32 GEMM rate, plus the run's own LAP time.

With ``--device cuda`` the models live on the GPU (products there, LAPs on the CPU), the
rows are ``delta`` (the default engine: there, matrices below ``gpu_min_flops`` formed
anew), ``delta_no_overlap`` (the same with ``overlap=False``: nothing queued on the GPU
while a LAP runs) and ``updates_on_gpu`` (every matrix updated as on a CPU,
``gpu_min_flops=0``); times are then wall seconds (the CPU waits for the GPU), the floor
uses the GPU's measured float32 GEMM rate, peak memory is the GPU's
(``torch.cuda.max_memory_allocated`` above what the two models take), the fixed-threshold
rerun is skipped and ``rebasin`` (a CPU library) is not run. ``--repeats N`` runs each
variant N times in its process and reports the median by wall time (rebasin: N runs, the
median by CPU time); repeat ``i`` of an lmckit variant uses seed ``i`` (its group order),
so that the optima of both are compared over as many random orders each — median against
median and best against best — and the speed over rebasin is median time against median
time. lmckit's variants are compared with one another by their total times over the same
seeds, and by seed 0's permutation and objective (reported per variant with its distance).

Pairs come from ``lmckit train`` checkpoints (``--pairs``: ``NAME=FOLDER`` with
``*-seed0`` and ``*-seed1`` in it) and ResNet-20 ×8/×16 trained briefly on the bundled
8×8 digits here (``--resnet``). Prints one JSON document.

    python benchmarks/bench_wm_delta.py --pairs mlp3x512=/tmp/w512 ... --rebasin mlp3x512
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from _timing import add_device_argument, machine
from bench_match import flops_per_sweep, matmul_throughput
from lmckit.checkpoint import load_checkpoint
from lmckit.lap import compile_kernels
from lmckit.match.weight_matcher import DeltaPolicy, ProfiledWeightMatcher
from lmckit.models import permutation_spec
from lmckit.params import params_distance
from lmckit.train import init_model


def rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def run_lmckit(
    spec, a, b, delta, seed: int, overlap: bool | None = None, lap_backend: str = "jv"
) -> dict:
    cuda = next(iter(a.values())).is_cuda
    reset_peak()
    resident = rss_bytes("VmRSS")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    cpu = time.process_time()
    matcher = ProfiledWeightMatcher(spec, b, delta=delta, overlap=overlap, lap_backend=lap_backend)
    result = matcher.match(a, seed=seed)
    cpu = time.process_time() - cpu
    peak = rss_bytes("VmHWM") - resident
    info = result.info
    out = {
        "cpu_seconds": cpu,
        "wall_seconds": result.seconds,
        "sweeps": result.iterations,
        "lap_solves": info["lap_solves"],
        "formed_ahead": info["formed_ahead"],
        "gflop_formed": info["gemm_flops"] / 1e9,
        "gflop_full_recompute": info["full_recompute_flops"] / 1e9,
        "gemm_seconds": info["gemm_seconds"],
        "lap_seconds": info["lap_seconds"],
        "lap_share": info["lap_seconds"] / result.seconds,
        "peak_added_bytes": peak,
        "objective": result.history[-1],
        "distance_after": result.distance_after,
        "perm": result.perm,
    }
    if cuda:
        out["host_peak_added_bytes"] = out.pop("peak_added_bytes")
        out["peak_added_bytes"] = torch.cuda.max_memory_allocated() - held
    return out


def as_sequential(params: dict, widths: list[int]) -> nn.Module:
    dims = [784, *widths, 10]
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    seq = nn.Sequential(*layers)
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for i, lin in enumerate(linears):
            lin.weight.copy_(params[f"layers.{i}.weight"])
            lin.bias.copy_(params[f"layers.{i}.bias"])
    return seq


def run_rebasin(a, b, widths, repeats: int = 1) -> dict:
    """rebasin's ``PermutationCoordinateDescent`` ``repeats`` times, run ``i`` with torch's
    global seed ``i`` (its layer order comes from it): the median CPU time, and every run's
    time and distance (the order decides the optimum)."""
    try:
        from rebasin import PermutationCoordinateDescent
    except ImportError:
        return {"installed": False}
    seconds, distances = [], []
    for i in range(repeats):
        torch.manual_seed(i)  # its random layer order: run i is reproducible, as our seed i
        seq_a, seq_b = as_sequential(a, widths), as_sequential(b, widths)
        cpu = time.process_time()
        PermutationCoordinateDescent(seq_a, seq_b, torch.randn(2, 1, 28, 28)).rebasin()
        seconds.append(time.process_time() - cpu)
        distances.append(params_distance(seq_a.state_dict(), seq_b.state_dict()))
    middle = sorted(range(repeats), key=seconds.__getitem__)[repeats // 2]
    return {
        "installed": True,
        "cpu_seconds": seconds[middle],
        "distance_after": distances[middle],
        "cpu_seconds_each": seconds,
        "distance_after_each": distances,
    }


def _median(xs: list[float]) -> float:
    ordered = sorted(xs)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def digits_resnet_pair(width: int, epochs: int, device: str = "cpu"):
    from lmckit.data import load_dataset
    from lmckit.train import TrainConfig, train

    data = load_dataset("digits")
    config = {"width_multiplier": width, "in_channels": 1}
    params, accuracy = [], []
    for seed in (0, 1):
        model = init_model("resnet20", config, seed).to(device)
        cfg = TrainConfig(
            epochs=epochs, batch_size=128, optimizer="sgd", lr=0.05, nesterov=True,
            weight_decay=5e-4, schedule="warmup_linear", seed=seed,
        )  # fmt: skip
        result = train(model, data, cfg, evaluate_each_epoch=False)
        params.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        accuracy.append(result.test.accuracy)
    return permutation_spec(model), params, f"digits-trained ({epochs} epochs; test acc {accuracy})"


def load_pair(source: dict):
    """``(spec, a, b)`` from a source: ``{"folder": F}`` (``lmckit train`` checkpoints) or
    ``{"resnet": width, "file": F}`` (the two state dicts saved by this script)."""
    if "folder" in source:
        found = sorted(Path(source["folder"]).glob("*-seed[01]*.safetensors"))
        ca, cb = (load_checkpoint(p.with_suffix("")) for p in found[:2])
        return permutation_spec(ca.model), ca.model.state_dict(), cb.model.state_dict()
    a, b = torch.load(source["file"], weights_only=True)
    model = init_model("resnet20", {"width_multiplier": source["resnet"], "in_channels": 1}, 0)
    return permutation_spec(model), a, b


VARIANTS = {  # name: (cost-matrix policy, overlap, LAP backend)
    "delta": (DeltaPolicy(), None, "jv"),
    "delta_no_overlap": (DeltaPolicy(), False, "jv"),
    "updates_on_gpu": (DeltaPolicy(gpu_min_flops=0), None, "jv"),
    "full": (None, None, "jv"),
    # the engine as of the previous stop: matrices re-formed every 8 sweeps, lapjv's LAPs
    "previous_stop": (DeltaPolicy(refresh=8), None, "lapjv"),
}


def child(source: dict, variant: str) -> None:
    """One variant in a fresh process, so its peak memory is its own."""
    torch.set_num_threads(1)
    spec, a, b = load_pair(source)
    device = source.get("device", "cpu")
    if torch.device(device).type == "cuda":
        a, b = ({k: v.to(device) for k, v in p.items()} for p in (a, b))
        # context, cuBLAS handle and pinned-memory pool made before the clock starts
        warm = torch.ones(256, 256, device=device)
        (warm @ warm).to("cpu", non_blocking=True)
        torch.empty(1 << 20, pin_memory=True)
        torch.cuda.synchronize()
    policy, overlap, backend = VARIANTS[variant]
    # numba's compiled LAP kernels loaded (or compiled, on a first run) before the clock, as
    # the CUDA context above: a once-per-process cost, reported apart
    load = compile_kernels()
    # repeat i uses seed i (WM's group order): times and optima over as many orders as
    # rebasin's runs draw
    runs = [
        run_lmckit(spec, a, b, policy, seed=i, overlap=overlap, lap_backend=backend)
        for i in range(source["repeats"])
    ]
    # the median run by wall time; peak memory from the first (later ones reuse its pages);
    # permutation, objective and distance of seed 0, compared across variants
    run = dict(sorted(runs, key=lambda r: r["wall_seconds"])[len(runs) // 2])
    run["peak_added_bytes"] = runs[0]["peak_added_bytes"]
    run["wall_seconds_each"] = [r["wall_seconds"] for r in runs]
    run["cpu_seconds_each"] = [r["cpu_seconds"] for r in runs]
    # totals over the same seeds: what variants are compared by
    run["wall_seconds_total"] = sum(run["wall_seconds_each"])
    run["cpu_seconds_total"] = sum(run["cpu_seconds_each"])
    run["distance_after_each"] = [r["distance_after"] for r in runs]
    for key in ("objective", "distance_after"):
        run[key] = runs[0][key]
    run["perm"] = runs[0]["perm"].to_dict()
    run["lap_kernels_load_seconds"] = load
    print(json.dumps(run))


def in_child(source: dict, variant: str, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(source), variant],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
        env={**os.environ, **(env or {})},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def bench_pair(name, source, origin, throughput, with_rebasin, delta_only=False) -> dict:
    print(f"{name}: matching", file=sys.stderr, flush=True)
    spec, a, b = load_pair(source)
    cuda = torch.device(source.get("device", "cpu")).type == "cuda"
    row: dict = {"pair": origin}
    params_bytes = sum(t.numel() * t.element_size() for t in a.values()) * 2
    row["two_models_bytes"] = params_bytes
    if cuda:
        variants = ["delta", "delta_no_overlap", "updates_on_gpu"]
    else:
        variants = ["delta"] + ([] if delta_only else ["full", "previous_stop"])
    runs = {variant: in_child(source, variant) for variant in variants}
    for variant in variants if not cuda else ():
        held = in_child(source, variant, FIXED_MMAP)["peak_added_bytes"]
        runs[variant]["peak_added_bytes_fixed_mmap_threshold"] = held
    if "full" in runs:
        row["same_permutation"] = runs["delta"]["perm"] == runs["full"]["perm"]
        row["objective_relative_difference"] = abs(
            runs["delta"]["objective"] - runs["full"]["objective"]
        ) / abs(runs["full"]["objective"])
        row["delta_speedup_over_full"] = (
            runs["full"]["cpu_seconds_total"] / runs["delta"]["cpu_seconds_total"]
        )
    if "previous_stop" in runs:
        row["same_permutation_as_previous_stop"] = (
            runs["delta"]["perm"] == runs["previous_stop"]["perm"]
        )
        row["delta_speedup_over_previous_stop"] = (
            runs["previous_stop"]["cpu_seconds_total"] / runs["delta"]["cpu_seconds_total"]
        )
    if cuda:
        for other in ("delta_no_overlap", "updates_on_gpu"):
            row[f"speedup_over_{other}"] = (
                runs[other]["wall_seconds_total"] / runs["delta"]["wall_seconds_total"]
            )
            row[f"same_permutation_as_{other}"] = runs["delta"]["perm"] == runs[other]["perm"]
    floor = flops_per_sweep(spec, a) / throughput
    for label, run in runs.items():
        run.pop("perm")
        run["floor_one_sweep_plus_laps"] = floor + run["lap_seconds"]
        clock = run["wall_seconds" if cuda else "cpu_seconds"]
        run["over_floor"] = clock / run["floor_one_sweep_plus_laps"]
        run["peak_over_two_models"] = run["peak_added_bytes"] / params_bytes
        if not cuda:
            run["peak_over_two_models_fixed_mmap_threshold"] = (
                run["peak_added_bytes_fixed_mmap_threshold"] / params_bytes
            )
        row[label] = run
    row["gflop_one_sweep"] = flops_per_sweep(spec, a) / 1e9
    if with_rebasin and not cuda:
        print(f"{name}: rebasin", file=sys.stderr, flush=True)
        widths = [a[f"layers.{i}.weight"].shape[0] for i in range(len(spec.groups))]
        rb = run_rebasin(a, b, widths, source["repeats"])
        if rb.get("installed"):
            rb["speedup_delta_over_rebasin"] = rb["cpu_seconds"] / runs["delta"]["cpu_seconds"]
            # both search in a random group order: optima over as many orders each
            ours = runs["delta"]["distance_after_each"]
            rb["delta_median_distance_at_most_rebasin_median_plus_1e-3"] = bool(
                _median(ours) <= _median(rb["distance_after_each"]) + 1e-3
            )
            rb["delta_best_distance_at_most_rebasin_best_plus_1e-3"] = bool(
                min(ours) <= min(rb["distance_after_each"]) + 1e-3
            )
        row["rebasin"] = rb
    # each row as it finishes, so that a run stopped later still reports it
    print(f"{name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="*", default=[], help="NAME=FOLDER of lmckit train")
    parser.add_argument("--rebasin", nargs="*", default=[], help="pair names to run rebasin on")
    parser.add_argument("--resnet", nargs="*", type=int, default=[], help="widths, e.g. 8 16")
    parser.add_argument("--resnet-epochs", type=int, default=2)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/bench_wm_delta"))
    parser.add_argument(
        "--delta-only", nargs="*", default=[], help="pairs timed without the previous engine"
    )
    add_device_argument(parser)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per variant (the median is reported)"
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child[0]), args.child[1])
        return
    torch.set_num_threads(1)
    throughput = matmul_throughput(device=args.device)
    rows = {}
    for entry in args.pairs:
        name, folder = entry.split("=", 1)
        source = {
            "folder": str(Path(folder).resolve()),
            "device": args.device,
            "repeats": args.repeats,
        }
        found = sorted(Path(folder).glob("*-seed[01]*.safetensors"))
        origin = f"trained with lmckit train ({found[0].stem}, {found[1].stem})"
        rows[name] = bench_pair(
            name, source, origin, throughput, name in args.rebasin, name in args.delta_only
        )
    args.scratch.mkdir(parents=True, exist_ok=True)
    for width in args.resnet:
        name = f"resnet20x{width}"
        print(f"{name}: training on digits", file=sys.stderr, flush=True)
        _, (a, b), origin = digits_resnet_pair(width, args.resnet_epochs, args.device)
        file = args.scratch / f"{name}.pt"
        torch.save((a, b), file)
        rows[name] = bench_pair(
            name,
            {"resnet": width, "file": str(file), "device": args.device, "repeats": args.repeats},
            origin,
            throughput,
            False,
            name in args.delta_only,
        )
    print(
        json.dumps(
            {
                "benchmark": "wm_delta",
                "machine": machine(args.device),
                # float32 GEMM rate where the products run (on a CPU: one thread)
                "matmul_gflops": throughput / 1e9,
                "policy": vars(DeltaPolicy()),
                "models": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
