"""How far a float32 cost matrix kept by updates drifts, against forming it anew — what
``DeltaPolicy.refresh`` (re-form every k sweeps) is chosen by.

Walks the permutations of a pair at random (``--swaps`` units of every group shuffled per
step, more than weight matching's late sweeps move) and, after every step, updates each
group's kept matrix as :class:`~lmckit.match.weight_matcher.WeightMatcher` does (never
re-formed). Every ``--every`` steps it reports, per group, the largest entry error of the
kept matrix against the float64 matrix formed from scratch, relative to that matrix's
largest entry — beside the same error of a float32 matrix freshly formed at that step
(the rounding any formation carries). Prints one JSON document.

    python benchmarks/bench_refresh_drift.py --pair /tmp/w512 --steps 128
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from _timing import machine
from lmckit.checkpoint import load_checkpoint
from lmckit.match.weight_matcher import DeltaPolicy, WeightMatcher
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation, group_cost_matrix, group_rows


def load(folder: Path | None):
    if folder is None:  # two randomly initialised 3×512 MLPs
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(build_model("mlp", widths=[512, 512, 512]))
        return permutation_spec(models[0]), *(m.state_dict() for m in models), "random init"
    found = sorted(folder.glob("*-seed[01]*.safetensors"))
    ca, cb = (load_checkpoint(p.with_suffix("")) for p in found[:2])
    origin = f"trained ({found[0].stem}, {found[1].stem})"
    return permutation_spec(ca.model), ca.model.state_dict(), cb.model.state_dict(), origin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=None, help="folder of lmckit train")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--every", type=int, default=8)
    parser.add_argument("--swaps", type=int, default=20)
    args = parser.parse_args()
    spec, a, b, origin = load(args.pair)
    a64 = {k: v.double() for k, v in a.items()}
    b64 = {k: v.double() for k, v in b.items()}
    kept = WeightMatcher(spec, b, delta=DeltaPolicy(max_fraction=1.0, refresh=10**9))
    fresh = WeightMatcher(spec, b, delta=None)
    a2 = {
        (g, t.name, t.axis): group_rows(spec, t.name, t.axis, g, a[t.name])
        for g in kept.groups
        for t in kept.terms[g]
    }
    gen = torch.Generator().manual_seed(0)
    perm = {g: torch.randperm(n, generator=gen) for g, n in spec.groups.items()}
    rows = []
    for step in range(args.steps + 1):
        if step:
            moved = {}
            for g, p in perm.items():
                p = p.clone()
                idx = torch.randperm(len(p), generator=gen)[: args.swaps]
                p[idx] = p[idx[torch.randperm(len(idx), generator=gen)]]
                moved[g] = p
            perm = moved
        report = step % args.every == 0 or step == args.steps
        row = {"updates": step, "kept": {}, "fresh": {}}
        for g in kept.groups:
            got = kept.cost(g, a2, perm)
            if not report:
                continue
            names = {t.name for t in kept.terms[g]}
            truth = group_cost_matrix(spec, a64, b64, Permutation(spec, perm), g, names=names)
            scale = truth.abs().max().item()
            formed = fresh.cost(g, a2, perm)
            row["kept"][g] = (got.double() - truth).abs().max().item() / scale
            row["fresh"][g] = (formed.double() - truth).abs().max().item() / scale
        if report:
            row["kept_over_fresh_worst"] = max(row["kept"].values()) / max(row["fresh"].values())
            rows.append(row)
    out = {
        "benchmark": "refresh_drift",
        "machine": machine("cpu"),
        "pair": origin,
        "swaps_per_group_and_step": args.swaps,
        "rows": rows,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
