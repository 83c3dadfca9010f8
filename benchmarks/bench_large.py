"""Weight matching at size: Hugging Face model folders of 124 M (GPT-2 small's config) and
1.1 B parameters (a Llama config of TinyLlama's shape), planted and independent pairs.

For each model, two cases:

* **planted** — B is A under a random permutation of every traced group, written as a model
  folder by :func:`lmckit.model_folder.write_model_folder`; weight matching must recover it
  exactly (B aligned equals A bit for bit);
* **independent** — two random initialisations (seeds 0 and 1);
* **rebasin** — PyPI ``rebasin`` 0.0.47 on the independent pair, where it is importable
  (``PYTHONPATH=/path/to/rebasin``; it needs ``torchview`` and ``graphviz``), under an
  address-space limit;
* **wm-orth** — the independent pair matched over orthogonal maps too
  (:func:`lmckit.match.symmetry_matching`, ``symmetries="orth"``: the kinds check on A's
  model in float64, norm gains folded, weight matching, then the orthogonal descent to
  ``--orth-sweeps`` sweeps or its stopping rule), beside weight matching of the same pair
  in the same process: seconds of each stage, sweeps, why the descent stopped, the weight
  distances and peak RSS in models. With ``--max-memory`` both matches run within it
  (``symmetry_matching(max_memory=...)``: the kinds check in float32 where its float64
  copies would not fit, the match refused up front where the models, their folded
  readers and B's moved copy exceed it); the case reports the budget, the kinds check's
  precision and whether the peak stayed within it.

Each case runs in a fresh process (its peak resident memory is its own): it loads both
folders (memory-mapped; the spec traced on A), matches with
:class:`~lmckit.match.weight_matcher.ProfiledWeightMatcher` and writes B aligned as a model
folder. Reported: load and trace time, sweeps, time per sweep, the LAP share, the GEMM
floor (the multiply-adds the products did, at this machine's float32 GEMM rate measured in
the same process), peak RSS against one model's size and — above the process's baseline
with its libraries imported — against issue 28's bound (two models + half a model + the
groups' kept cost matrices), and the writing time. Prints one
JSON document; finished cases are kept in ``--partial`` and not rerun.

    python benchmarks/make_hf_pairs.py /work/runs/hf-large
    python benchmarks/bench_large.py /work/runs/hf-large [--only gpt2-124m] [--cases planted]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from _timing import machine  # benchmarks/_timing.py (scripts run from this folder)

MODELS = ("gpt2-124m", "llama-1.1b")
CASES = ("planted", "independent", "rebasin", "wm-orth")


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def gemm_rate(n: int = 2048, k: int = 8192, repeats: int = 3) -> float:
    """This process's float32 GEMM rate (multiply-adds ×2 per second) on an ``(n, k) @ (k,
    n)`` product, the shape of a cost-matrix term: the best of ``repeats``."""
    a, b = torch.randn(n, k), torch.randn(k, n)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n * n * k / best


def plant(root: Path, name: str) -> Path:
    """B = A under a seeded random permutation, as a model folder (made once)."""
    from lmckit.model_folder import load_model_folder, write_model_folder
    from lmckit.perm import Permutation

    out = root / f"{name}-planted"
    if (out / "lmckit.json").is_file():
        return out
    a = load_model_folder(root / f"{name}-seed0")
    perm = Permutation.random(a.spec, 1234)
    write_model_folder(out, a, perm=perm, about={"planted": perm.to_dict()})
    return out


def run_case(root: Path, name: str, case: str, aligned: Path) -> dict:
    """One case, in this process (see the module docstring)."""
    from lmckit.match.weight_matcher import MemoryNeed, ProfiledWeightMatcher
    from lmckit.model_folder import load_model_folder, read_layout, write_model_folder
    from lmckit.perm import Permutation

    rate = gemm_rate()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # libraries, GEMM test
    path_b = plant(root, name) if case == "planted" else root / f"{name}-seed1"
    layout = read_layout(root / f"{name}-seed0")
    one = 4 * sum(math.prod(e.shape) for e in layout.tensors.values())  # float32, as loaded
    start = time.perf_counter()
    # the trace's verification kept within the bound too: float64 only where it fits
    a = load_model_folder(root / f"{name}-seed0", max_memory=2 * one + one // 2)
    traced = time.perf_counter() - start
    b = load_model_folder(path_b, spec=a.spec)
    loaded = time.perf_counter() - start
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    need = MemoryNeed.of(a.spec, a.params, b.params)
    matcher = ProfiledWeightMatcher(a.spec, b.params)
    result = matcher.match(a.params, distances=False)
    info = result.info
    start = time.perf_counter()
    write_model_folder(aligned, b, perm=result.perm, about={"bench": name, "case": case})
    written = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    unique = {k: t for k, t in a.params.items() if k not in a.trace_report.aliases}  # tied once
    model_bytes = sum(t.numel() * t.element_size() for t in unique.values())
    out = {
        "model": name,
        "case": case,
        "parameters": sum(t.numel() for t in unique.values()),
        "groups": len(a.spec.groups),
        "permuted_fraction": a.trace_report.permuted_fraction,
        "trace_precision": a.trace_report.precision,
        "load_and_trace_seconds_a": round(traced, 2),
        "load_seconds_both": round(loaded, 2),
        "sweeps": result.iterations,
        "match_seconds": round(result.seconds, 2),
        "seconds_per_sweep": round(result.seconds / result.iterations, 2),
        "lap_seconds": round(info["lap_seconds"], 2),
        "lap_share": round(info["lap_seconds"] / result.seconds, 3),
        "gemm_seconds": round(info["gemm_seconds"], 2),
        "gemm_flops": info["gemm_flops"],
        "gemm_rate_flops": rate,
        "gemm_floor_seconds": round(info["gemm_flops"] / rate, 2),
        "write_aligned_seconds": round(written, 2),
        "model_bytes": model_bytes,
        "peak_rss_bytes": peak,
        "peak_rss_after_loading_bytes": rss_loaded,
        "baseline_rss_bytes": baseline,
        "peak_rss_models": round(peak / model_bytes, 2),
        "match_rss_models": round((peak - baseline) / model_bytes, 2),
        "bound_bytes": 2 * model_bytes + model_bytes // 2 + need.kept_costs,
        "within_bound": peak - baseline <= 2 * model_bytes + model_bytes // 2 + need.kept_costs,
        "memory_need_estimate": {
            "models": need.models,
            "kept_costs": need.kept_costs,
            "working": need.working,
        },
    }
    if case == "planted":
        planted = json.loads((path_b / "lmckit.json").read_text())["planted"]
        expected = Permutation.from_dict(planted, a.spec).inverse()
        out["recovered_exactly"] = all(
            torch.equal(result.perm[g], expected[g]) for g in a.spec.groups
        )
    return out


def run_orthogonal(root: Path, name: str, sweeps: int, max_memory: int | None = None) -> dict:
    """The ``wm-orth`` case, in this process (see the module docstring)."""
    from lmckit.match import weight_matching
    from lmckit.match.symmetries import symmetry_matching
    from lmckit.model_folder import example_inputs, load_model_folder

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    a = load_model_folder(root / f"{name}-seed0", max_memory=max_memory)
    b = load_model_folder(root / f"{name}-seed1", spec=a.spec, max_memory=max_memory)
    loaded = time.perf_counter() - start
    wm = weight_matching(a.spec, a.params, b.params, max_memory=max_memory)
    x, kwargs = example_inputs(a.model, a.layout.config)
    result = symmetry_matching(
        a.spec, a.params, b.params, model=a.model, example_inputs=x,
        example_kwargs=kwargs, max_iter=sweeps, max_memory=max_memory,
    )  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    unique = {k: t for k, t in a.params.items() if k not in a.trace_report.aliases}
    model_bytes = sum(t.numel() * t.element_size() for t in unique.values())
    stages = {s["method"]: s for s in result.info["stages"]}
    orth = stages["wm-orth"]
    return {
        "model": name,
        "case": "wm-orth",
        "parameters": sum(t.numel() for t in unique.values()),
        "load_seconds_both": round(loaded, 2),
        "wm_seconds": round(wm.seconds, 2),
        "wm_sweeps": wm.iterations,
        "wm_distance": round(wm.distance_after, 4),
        "distance_before": round(wm.distance_before, 4),
        # what symmetry_matching did besides its stages: the kinds check and the folds
        "kinds_check_and_fold_seconds": round(
            result.seconds - sum(st["seconds"] for st in result.info["stages"]), 2
        ),
        "kinds": result.info.get("kinds"),
        "kinds_precision": result.info.get("kinds_precision"),
        "orth_seconds": round(orth["seconds"], 2),
        "orth_sweeps": result.iterations,
        "orth_sweep_cap": sweeps,
        "orth_stopped": result.info.get("stopped"),
        "orth_seconds_per_sweep": round(orth["seconds"] / max(result.iterations, 1), 2),
        "orth_distance_folded": round(result.distance_after, 4),
        "total_seconds": round(result.seconds, 2),
        "model_bytes": model_bytes,
        "peak_rss_bytes": peak,
        "baseline_rss_bytes": baseline,
        "match_rss_models": round((peak - baseline) / model_bytes, 2),
        "max_memory_bytes": max_memory,
        "within_max_memory": None if max_memory is None else peak <= max_memory,
    }


def run_rebasin(root: Path, name: str, memory_gib: float) -> dict:
    """PyPI ``rebasin`` 0.0.47's ``PermutationCoordinateDescent`` on the independent pair,
    in this process under an address-space limit of ``memory_gib`` (so that running out of
    memory is an error it reports, not the machine's): seconds, peak RSS, whether B's
    outputs stayed as they were (a correct alignment changes none), or its error."""
    import transformers

    limit = int(memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out: dict = {"model": name, "case": "rebasin", "address_space_limit_gib": memory_gib}
    try:
        from rebasin import PermutationCoordinateDescent
    except ImportError as exc:
        return {**out, "skipped": f"rebasin is not importable: {exc}"}
    cls = transformers.AutoModelForCausalLM
    a = cls.from_pretrained(root / f"{name}-seed0", local_files_only=True).eval()
    b = cls.from_pretrained(root / f"{name}-seed1", local_files_only=True).eval()
    ids = torch.randint(0, a.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = b(ids).logits
    start = time.perf_counter()
    try:
        PermutationCoordinateDescent(a, b, ids).rebasin()
    except (Exception, MemoryError) as exc:  # whatever it does on this model is the result
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return {
            **out,
            "error": f"{type(exc).__name__}: {first}",
            "seconds_until_error": round(time.perf_counter() - start, 1),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
    with torch.no_grad():
        after = b(ids).logits
    return {
        **out,
        "seconds": round(time.perf_counter() - start, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "output_change_relative": float((after - before).abs().max() / before.abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the folder make_hf_pairs.py wrote")
    parser.add_argument("--only", choices=MODELS, nargs="+", default=list(MODELS))
    parser.add_argument("--cases", choices=CASES, nargs="+", default=list(CASES))
    parser.add_argument("--partial", type=Path, help="finished cases (default ROOT/bench.jsonl)")
    parser.add_argument(
        "--rebasin-gib", type=float, default=16.0,
        help="the address-space limit rebasin runs under (GiB)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    parser.add_argument(
        "--orth-sweeps", type=positive, default=100, help="the wm-orth case's sweep cap"
    )
    parser.add_argument(
        "--max-memory", type=float, metavar="GIB",
        help="the wm-orth case's memory budget in GiB (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--report-only", action="store_true", help="print the finished cases, run nothing"
    )
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # a child process's case
    args = parser.parse_args()
    if args.case:
        name, case = args.case
        if case == "rebasin":
            print(json.dumps(run_rebasin(args.root, name, args.rebasin_gib)))
            return
        if case == "wm-orth":
            budget = None if args.max_memory is None else int(args.max_memory * (1 << 30))
            print(json.dumps(run_orthogonal(args.root, name, args.orth_sweeps, budget)))
            return
        print(json.dumps(run_case(args.root, name, case, args.root / f"{name}-{case}-aligned")))
        return
    partial = args.partial or args.root / "bench.jsonl"
    done = {}
    if partial.is_file():
        for line in partial.read_text().splitlines():
            row = json.loads(line)
            done[(row["model"], row["case"])] = row
    for name in args.only:
        for case in args.cases:
            if (name, case) in done or args.report_only:
                continue
            command = [sys.executable, __file__, str(args.root), "--case", name, case]
            try:
                child = subprocess.run(
                    [
                        *command,
                        "--rebasin-gib",
                        str(args.rebasin_gib),
                        "--orth-sweeps",
                        str(args.orth_sweeps),
                        *(["--max-memory", str(args.max_memory)] if args.max_memory else []),
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=args.timeout,
                )
            except subprocess.TimeoutExpired:
                row = {"model": name, "case": case, "error": f"not done in {args.timeout} s"}
                done[(name, case)] = row
                with open(partial, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                continue
            if child.returncode != 0:
                print(child.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name} {case} failed")
            row = json.loads(child.stdout.strip().splitlines()[-1])
            done[(name, case)] = row
            with open(partial, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{name} {case}: {row.get('match_seconds', row)}", file=sys.stderr)
    rows = [done[(n, c)] for n in args.only for c in args.cases if (n, c) in done]
    print(json.dumps({"machine": machine("cpu"), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
