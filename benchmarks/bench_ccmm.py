"""Time of CCMM's exact line search (:func:`lmckit.merge.ccmm`), the larger part of a
Frank–Wolfe iteration: STE-MM Fig. 5 runs CCMM on ten MLPs per width, 50 iterations each.

On ``--models`` random ResNet-20s (or the zoo's MLP, ``--model mlp``: 784 → 3 × 512·width
→ 10, STE-MM Fig. 5's models) of each width, one Frank–Wolfe step (a start half-way
between the identity and a random permutation per model and group, the vertex from the
LAP on its gradient), three variants alternating within each round (median of ``--repeats``):

* ``gradient``: the objective and its gradient at the start — the rest of an iteration;
* ``five_evaluations``: the baseline, what lmckit did until 2026-11-30: the objective
  evaluated at five steps (every model aligned anew at each) and a quartic fitted;
* ``lmckit``: the line search of :func:`~lmckit.merge.ccmm`: the models aligned at two
  more steps (the start's alignment comes from the gradient's forward) and the objective
  at every step from the Gram matrix of the three alignments (Lagrange interpolation).

``step`` is each search's step; ``objective_rel_diff`` the relative difference of the
objective at the two steps (0 when they agree). Prints one JSON document.

    python benchmarks/bench_ccmm.py [--model resnet20|mlp] [--widths 1 2] [--models 10]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from _timing import add_device_argument, machine, timed  # benchmarks/_timing.py
from lmckit.lap import assign_groups
from lmckit.merge.ccmm import _aligned, _line_search
from lmckit.models import permutation_spec
from lmckit.params import floating_names, pairwise_inner_sum
from lmckit.train import init_model


def five_evaluations(spec, floating, soft, vertices) -> float:
    """The baseline: f at γ = 0, ¼, ½, ¾, 1, each from freshly aligned models."""
    gammas = np.linspace(0.0, 1.0, 5)
    values = []
    with torch.no_grad():
        for gamma in gammas:
            mix = [
                {g: s[g] + float(gamma) * (v[g] - s[g]) for g in s}
                for s, v in zip(soft, vertices, strict=True)
            ]
            values.append(float(pairwise_inner_sum(_aligned(spec, floating, mix))))
    poly = np.polynomial.Polynomial.fit(gammas, values, 4)
    grid = np.linspace(0.0, 1.0, 1001)
    return float(grid[int(np.argmax(poly(grid)))])


def frank_wolfe_step(spec, floating, device):
    """A start half-way between the identity and a random permutation per model and group,
    and the Frank–Wolfe vertex from it (the LAP on the gradient), as CCMM would take."""
    g = torch.Generator().manual_seed(0)
    soft = [
        {k: 0.5 * (torch.eye(m) + torch.eye(m)[torch.randperm(m, generator=g)]).to(device)
         for k, m in spec.groups.items()}
        for _ in floating
    ]  # fmt: skip
    leaves = [{k: m.clone().requires_grad_(True) for k, m in s.items()} for s in soft]
    grads = iter(torch.autograd.grad(
        pairwise_inner_sum(_aligned(spec, floating, leaves)),
        [m for s in leaves for m in s.values()],
    ))  # fmt: skip
    vertices = []
    for s in soft:
        best = assign_groups({k: next(grads) for k in s}, spec.heads)
        vertices.append({k: torch.eye(m.shape[0], device=device)[best[k]] for k, m in s.items()})
    return soft, vertices


def measure(model: str, width: float, n_models: int, repeats: int, device: str) -> dict:
    config = (
        {"width_multiplier": width}
        if model == "resnet20"
        else {"in_dim": 784, "hidden": [round(512 * width)] * 3}
    )
    models = [init_model(model, config, seed=i).to(device) for i in range(n_models)]
    spec = permutation_spec(models[0])
    states = [m.state_dict() for m in models]
    keys = floating_names(states[0])
    sub = spec.restrict(keys)
    floating = [{k: s[k] for k in keys} for s in states]
    soft, vertices = frank_wolfe_step(sub, floating, device)

    def gradient():
        leaves = [{k: m.clone().requires_grad_(True) for k, m in s.items()} for s in soft]
        aligned = _aligned(sub, floating, leaves)
        torch.autograd.grad(pairwise_inner_sum(aligned), [m for s in leaves for m in s.values()])
        return [{k: t.detach() for k, t in a.items()} for a in aligned]

    at_start = gradient()
    variants = {
        "gradient": gradient,
        "five_evaluations": lambda: five_evaluations(sub, floating, soft, vertices),
        "lmckit": lambda: _line_search(sub, floating, soft, vertices, at_start),
    }
    seconds = timed(variants, repeats)
    steps = {k: variants[k]() for k in ("five_evaluations", "lmckit")}

    def objective(gamma):
        mix = [
            {k: s[k] + gamma * (v[k] - s[k]) for k in s}
            for s, v in zip(soft, vertices, strict=True)
        ]
        with torch.no_grad():
            return float(pairwise_inner_sum(_aligned(sub, floating, mix)))

    values = {k: objective(v) for k, v in steps.items()}
    return {
        "model": model,
        "width": width,
        "models": n_models,
        "parameters_per_model": sum(t.numel() for t in floating[0].values()),
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "line_search_speedup": round(seconds["five_evaluations"] / seconds["lmckit"], 2),
        "iteration_speedup": round(
            (seconds["gradient"] + seconds["five_evaluations"])
            / (seconds["gradient"] + seconds["lmckit"]),
            2,
        ),
        "step": steps,
        "objective_rel_diff": abs(values["lmckit"] - values["five_evaluations"])
        / abs(values["five_evaluations"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["resnet20", "mlp"], default="resnet20")
    parser.add_argument("--widths", type=float, nargs="+", default=[1, 2])
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    add_device_argument(parser)
    args = parser.parse_args()
    if args.models < 2 or args.repeats < 1 or args.threads < 1:
        parser.error("--models must be at least 2 (CCMM merges two or more), --repeats and "
                     "--threads at least 1")  # fmt: skip
    if min(args.widths) <= 0:
        parser.error(f"--widths must be positive, got {args.widths}")
    torch.set_num_threads(args.threads)
    results = [measure(args.model, w, args.models, args.repeats, args.device) for w in args.widths]
    print(json.dumps({"machine": machine(args.device), "results": results}, indent=2))


if __name__ == "__main__":
    main()
