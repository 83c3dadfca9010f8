"""Weight matching over orthogonal maps (``wm-orth``) against permutation weight matching,
in one run: time, sweeps and where the objective's gain is made.

For each pair — lmckit checkpoints given with ``--pair A B`` (the study's trained Llamas or
GPTs), else random initialisations of the zoo's GPT and Llama — the spec's kinds are traced
(:func:`lmckit.tracing.symmetry_kinds`, distance-keeping part), both models' norm gains
folded, then:

* **wm**: permutation weight matching over the same spec (``wm-fast``): seconds, sweeps;
* **wm-orth**: the orthogonal descent from there, twice — to the cap (``gain_tol=0``, the
  rule before the gain test existed) and with the default gain test
  (:func:`lmckit.match.orthogonal.orthogonal_weight_matching`, ``--max-iter`` sweeps at
  most): seconds, sweeps, whether it stopped at the cap, and the first sweep by which it had
  made 90 %, 99 %, 99.99 % of its gain after its first sweep, with the objective's
  largest fall between sweeps (the rounding floor of the model's dtype: in float32 the
  maps never settle to the descent's 1e-12 step test, so it runs to the cap).

Prints one JSON document.

    python benchmarks/bench_wm_orth.py [--pair A.safetensors B.safetensors ...] [--zoo gpt llama]
        [--max-iter 100]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from _timing import machine  # benchmarks/_timing.py (scripts run from this folder)
from lmckit.checkpoint import load_checkpoint
from lmckit.match.orthogonal import orthogonal_weight_matching
from lmckit.match.weight import weight_matching
from lmckit.models import build_model, permutation_spec
from lmckit.tracing import symmetry_kinds
from lmckit.transform import fold_norms, orthogonal_subgroup

ZOO = {
    "gpt": {"vocab_size": 256, "context": 64},
    "llama": {"vocab_size": 256, "context": 64},
}


def zoo_pair(name: str):
    """``(label, model, spec, params_a, params_b)``: two seeded random initialisations."""
    torch.manual_seed(0)
    model = build_model(name, **ZOO[name])
    a = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    b = dict(build_model(name, **ZOO[name]).state_dict())
    return f"{name} (random init)", model, permutation_spec(model), a, b


def checkpoint_pair(path_a: str, path_b: str):
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    return f"{path_a} / {path_b}", a.model, a.spec, a.params, b.params


def first_sweep_reaching(history: list[float], start: float, share: float) -> int | None:
    """The first sweep (1-based) whose objective holds ``share`` of the final gain."""
    gain = history[-1] - start
    if gain <= 0:
        return None
    return next(i + 1 for i, v in enumerate(history) if v - start >= share * gain)


def measure(label, model, spec, params_a, params_b, max_iter: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    started = time.perf_counter()
    kinds = orthogonal_subgroup(symmetry_kinds(model, ids, spec).spec)
    traced = time.perf_counter() - started
    fa, fb = fold_norms(kinds, params_a), fold_norms(kinds, params_b)
    weight_matching(kinds, fa, fb)  # warm-up: numba compiles the LAP kernels on first use
    wm = weight_matching(kinds, fa, fb)
    runs = {}
    for rule, gain_tol in (("to_the_cap", 0.0), ("gain_tol", None)):
        times: list[float] = []
        clock = [time.perf_counter()]

        def tick(event, times=times, clock=clock) -> None:
            now = time.perf_counter()
            times.append(now - clock[0])
            clock[0] = now

        clock[0] = time.perf_counter()
        orth = orthogonal_weight_matching(
            kinds, fa, fb, init=wm.alignment, max_iter=max_iter, progress=tick, gain_tol=gain_tol
        )
        runs[rule] = (orth, times)
    capped, capped_times = runs["to_the_cap"]
    early, _ = runs["gain_tol"]
    history = list(capped.history)
    start = history[0]  # WM's own objective counts the folded gains: not comparable
    falls = [history[i] - history[i + 1] for i in range(len(history) - 1)]
    return {
        "pair": label,
        "dtype": str(next(iter(fa.values())).dtype).removeprefix("torch."),
        "parameters": sum(t.numel() for t in params_a.values()),
        "kinds": kinds.kind_counts(),
        "trace_seconds": traced,
        "wm": {"seconds": wm.seconds, "sweeps": wm.iterations},
        "wm_orth": {
            "seconds": capped.seconds,
            "sweeps": capped.iterations,
            "seconds_per_sweep": sum(capped_times) / len(capped_times),
            "stopped_at_cap": capped.iterations == max_iter,
            "objective": history[-1],
            "gain_after_sweep_1": history[-1] - start,
            "sweep_reaching_gain_share": {
                str(s): first_sweep_reaching(history, start, s) for s in (0.9, 0.99, 0.9999)
            },
            "largest_fall_between_sweeps": max(falls, default=0.0),
            "relative_largest_fall": max(falls, default=0.0) / abs(history[-1]),
        },
        "wm_orth_gain_tol": {
            "gain_tol": early.info["gain_tol"],
            "stopped": early.info["stopped"],
            "seconds": early.seconds,
            "sweeps": early.iterations,
            "objective": early.history[-1],
            "objective_short_of_the_capped_run": (history[-1] - early.history[-1])
            / abs(history[-1]),
            "distance_after": early.distance_after,
            "capped_distance_after": capped.distance_after,
        },
        "slowdown_vs_wm": capped.seconds / max(wm.seconds, 1e-9),
        "slowdown_vs_wm_with_gain_tol": early.seconds / max(wm.seconds, 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"), default=[])
    parser.add_argument(
        "--zoo", nargs="*", choices=sorted(ZOO), default=None,
        help="random-init zoo pairs too (default: both, unless --pair is given)",
    )  # fmt: skip
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=256, help="token ids of the example batch")
    args = parser.parse_args()
    zoo = args.zoo if args.zoo is not None else ([] if args.pair else sorted(ZOO))
    pairs = [checkpoint_pair(*p) for p in args.pair] + [zoo_pair(n) for n in zoo]
    results = [measure(*p, max_iter=args.max_iter, vocab=args.vocab) for p in pairs]
    print(
        json.dumps(
            {"machine": machine("cpu"), "max_iter": args.max_iter, "pairs": results}, indent=2
        )
    )


if __name__ == "__main__":
    main()
