"""Issue 29's measurement: do orthogonal and invertible maps connect independently trained
transformers that permutations leave apart?

For every pair of the checkpoints given, with both models' norm gains folded (the same
functions): the naive path, weight matching over permutations (``wm-fast``), weight
matching over permutations *and* orthogonal maps (the spec's kinds from
:func:`lmckit.tracing.symmetry_kinds`, the descent started at WM's permutations), the same
refined by least squares on activations for the invertible head maps (``wm-full``) and
every group fitted on activations (``am-full``) — each as a linear path evaluated on a
seeded subset of the test split (loss, calibrated loss, accuracy; perplexity for token
data), plus the logit ensemble. With ``--merge``, all the checkpoints merged by MergeMany
over permutations and over orthogonal maps too (``merge-many-orth``). Prints one JSON
object (per pair and mean ± std over pairs) and writes it to ``--out``.

    python scripts/orthogonal_transformers.py CKPT CKPT CKPT --test 1024 --out result.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import torch

from lmckit.checkpoint import load_checkpoint
from lmckit.data import load_dataset
from lmckit.evaluate import evaluate
from lmckit.evaluate.interpolation import interpolate
from lmckit.match import symmetry_matching, weight_matching
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.merge import merge_many, merge_many_orthogonal
from lmckit.tracing.kinds import symmetry_kinds
from lmckit.transform import fold_norms, unfold_norms

PATHS = (
    "naive", "wm", "naive-folded", "wm-folded", "wm+orth", "wm+orth-in-A-layout", "wm-full",
    "am-full", "ste-orth",
)  # fmt: skip


def _path_record(curve, data) -> dict[str, float]:
    out = {}
    for metric, definitions in curve.barriers["test"].items():
        if metric in ("loss", "calibrated_loss", "accuracy"):
            out[f"{metric}_barrier"] = definitions["rebasin"]
    out["loss_midpoint"] = curve.midpoint("test", "loss")
    out["accuracy_midpoint"] = curve.midpoint("test", "accuracy")
    if data.next_token:
        out.update(curve.perplexities("test"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="lmckit checkpoints (stems or paths)")
    parser.add_argument("--test", type=int, default=1024, help="test examples (seeded subset)")
    parser.add_argument("--lambdas", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--paths", nargs="+", default=list(PATHS), choices=list(PATHS), help="paths to evaluate"
    )
    parser.add_argument(
        "--activations",
        type=int,
        default=2000,
        help="training examples for the activation fits (seeded subset)",
    )
    parser.add_argument(
        "--ste-examples", type=int, default=2048,
        help="ste-orth: training examples (seeded subset), one epoch over them",
    )  # fmt: skip
    parser.add_argument("--ste-batch", type=int, default=64, help="ste-orth: batch size")
    parser.add_argument("--merge", action="store_true", help="also merge all checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ckpts = [load_checkpoint(p) for p in args.checkpoints]
    model = ckpts[0].model
    data = load_dataset(ckpts[0].meta["dataset"])
    g = torch.Generator().manual_seed(0)
    chosen = torch.randperm(len(data.test_x), generator=g)[: min(args.test, len(data.test_x))]
    loaders = {"test": data.subset(test_idx=chosen).loader("test", batch_size=256, shuffle=False)}
    example = data.test_x[:2]
    fit = torch.randperm(len(data.train_x), generator=g)[: args.activations]
    fit_batches = [(data.train_x[fit[k : k + 250]], None) for k in range(0, len(fit), 250)]
    ste_rows = torch.randperm(len(data.train_x), generator=g)[: args.ste_examples]
    ste_data = data.subset(train_idx=ste_rows)
    start = time.perf_counter()
    report = symmetry_kinds(model, example, ckpts[0].spec)
    spec = report.spec
    print(report, flush=True)
    originals = [dict(c.params) for c in ckpts]
    folded = [fold_norms(spec, p) for p in originals]
    pairs = {}
    for i, j in itertools.combinations(range(len(ckpts)), 2):
        a, b = folded[i], folded[j]
        t0 = time.perf_counter()
        wm_original = weight_matching(spec, originals[i], originals[j], seed=0)
        wm = weight_matching(spec, a, b, seed=0)
        t_wm = time.perf_counter() - t0
        t0 = time.perf_counter()
        orth = orthogonal_weight_matching(spec, a, b, init=wm.perm, seed=0)
        t_orth = time.perf_counter() - t0
        record = {
            "wm_seconds": t_wm / 2,
            "orth_seconds": t_orth,
            "orth_sweeps": orth.iterations,
            "l2": {
                "naive": wm_original.distance_before,
                "wm": wm_original.distance_after,
                "naive-folded": wm.distance_before,
                "wm-folded": wm.distance_after,
                "wm+orth": orth.distance_after,
            },
        }
        rotated = orth.perm.apply(b)
        gains_a = {k: originals[i][k] for k in spec.folds}
        paths = {
            "naive": (originals[i], originals[j]),
            "wm": (originals[i], wm_original.perm.apply(originals[j])),
            "naive-folded": (a, b),
            "wm-folded": (a, wm.perm.apply(b)),
            "wm+orth": (a, rotated),
            # B rotated, then laid out with A's gains: both ends share A's norm gains
            "wm+orth-in-A-layout": (originals[i], unfold_norms(spec, rotated, gains_a)),
        }
        for name in ("wm-full", "am-full", "ste-orth"):
            if name not in args.paths:
                continue
            t0 = time.perf_counter()
            start_method, symmetries = name.split("-")
            options = (
                {"data": ste_data, "batch_size": args.ste_batch, "epochs": 1}
                if start_method == "ste"
                else {"data": fit_batches}
            )
            full = symmetry_matching(
                ckpts[0].spec, originals[i], originals[j], model=model,
                example_inputs=example, start=start_method, symmetries=symmetries, **options,
            )  # fmt: skip
            record[f"{name.replace('-', '_')}_seconds"] = time.perf_counter() - t0
            record["l2"][name] = full.distance_after
            record[f"{name}_stages"] = full.info["stages"]
            paths[name] = (a, full.perm.apply(b))
        paths = {k: v for k, v in paths.items() if k in args.paths}
        for name, (end_a, end_b) in paths.items():
            curve = interpolate(
                model, end_a, end_b, loaders, lambdas=args.lambdas, calibrated=True,
                ensemble=name == "naive",
            )  # fmt: skip
            record[name] = _path_record(curve, data)
            if name == "naive":
                record["ensemble"] = {
                    "loss_midpoint": curve.midpoint("test", "ensemble_loss"),
                    "accuracy_midpoint": curve.midpoint("test", "ensemble_accuracy"),
                }
            print(f"pair {i}-{j} {name}: {record[name]}", flush=True)
        pairs[f"{i}-{j}"] = record
    summary = {}
    for path in args.paths:
        for key in pairs[next(iter(pairs))][path]:
            values = [p[path][key] for p in pairs.values()]
            mean = statistics.fmean(values)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            summary[f"{path}.{key}"] = {"mean": mean, "std": std}
    merges = {}
    if args.merge:
        test = loaders["test"]
        singles = [evaluate(model, p, test) for p in originals]
        merges["models"] = [{"loss": m.loss, "accuracy": m.accuracy} for m in singles]
        for name, merger in (
            ("merge-many", merge_many),
            ("merge-many-orth", merge_many_orthogonal),
        ):
            t0 = time.perf_counter()
            options = {"model": model, "example_inputs": example} if name.endswith("orth") else {}
            merged = merger(ckpts[0].spec, originals, seed=0, **options)
            m = evaluate(model, merged.merged, test)
            merges[name] = {
                "loss": m.loss,
                "accuracy": m.accuracy,
                "perplexity": math.exp(m.loss) if data.next_token else None,
                "rounds": merged.iterations,
                "seconds": time.perf_counter() - t0,
            }
            print(f"{name}: {merges[name]}", flush=True)
    result = {
        "checkpoints": [str(p) for p in args.checkpoints],
        "merges": merges,
        "test_examples": len(chosen),
        "kinds": report.counts(),
        "pairs": pairs,
        "summary": summary,
        "seconds": time.perf_counter() - start,
        "torch_threads": torch.get_num_threads(),
    }
    text = json.dumps(result, indent=1, default=lambda x: None if math.isnan(x) else x)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
