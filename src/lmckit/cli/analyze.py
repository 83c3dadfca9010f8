"""``lmckit analyze``: distances, spectra, R(γ), the Taylor barrier and the width study's
diagnostics of two checkpoints (or Git Re-Basin's counterexample)."""

from __future__ import annotations

import argparse

from lmckit._catalog import MATCHERS
from lmckit.cli import arguments as arg
from lmckit.cli import inputs as cli_inputs
from lmckit.cli.applicability import DATA_OPTIONS, MODEL_CLASS, Check, excludes
from lmckit.cli.progress import ProgressBars
from lmckit.errors import UsageError
from lmckit.workflows.inputs import refuse_folders_for_data

COMMAND = "analyze"
_FIXED = "it draws a fixed construction"
APPLIES: list[tuple[str, Check]] = [
    *(
        (d, excludes("counterexample", _FIXED))
        for d in ("a", "b", "perm", "method", "gamma", "no_taylor", "layerwise", "no_data")
    ),
    *((d, excludes("counterexample", _FIXED)) for d in (*DATA_OPTIONS, "model_class")),
    ("method", excludes("perm", "the analysis uses the given permutation")),
    *((d, excludes("no_data", "weights only")) for d in DATA_OPTIONS),
    ("layerwise", excludes("no_data", "the diagnostics run the models on data")),
    ("no_taylor", excludes("no_data", "without data there is no Taylor barrier anyway")),
    *MODEL_CLASS,
]
NO_REPEATS = ("method", "gamma")


def cmd_analyze(args: argparse.Namespace) -> int:
    from lmckit.files import check_output_dir
    from lmckit.workflows.analysis import run_analyze, run_counterexample

    check_output_dir(args.out, "--out")
    if args.counterexample:
        if args.a or args.b:
            raise UsageError("--counterexample takes no checkpoints")
        result = run_counterexample(args.out)["result"]
        print(f"{'permutation':<40} {'error barrier':>13}")
        for perm, barrier in zip(result.permutations, result.barriers, strict=True):
            print(f"{perm.to_dict()!s:<40} {100 * barrier:>12.2f}%")
        print(
            f"lowest barrier over all {len(result.barriers)} permutations: "
            f"{100 * min(result.barriers):.2f}% (both networks: 0 % error)"
        )
        print(f"figure and data -> {args.out}")
        return 0
    if args.a is None or args.b is None:
        raise UsageError("analyze needs two checkpoints A and B (or --counterexample)")
    if not args.no_data:
        refuse_folders_for_data([args.a, args.b])
    a, b = cli_inputs.pair(args)
    data = None
    if not args.no_data:
        data = cli_inputs.data(a, args)
    with ProgressBars(not args.quiet) as bars:
        summary = run_analyze(
            a,
            b,
            data,
            args.out,
            methods=args.method,
            perm_file=args.perm,
            gammas=args.gamma,
            taylor=not args.no_taylor,
            layerwise=args.layerwise,
            seed=args.seed,
            progress=bars,
        )
    gammas = [f"{g:g}" for g in args.gamma]
    head = " ".join(f"{'R(γ=' + g + ')':>9}" for g in gammas)
    print(
        f"{'method':<10} {'L2 before':>10} {'L2 after':>10} {head} {'barrier½':>9} {'Taylor½':>9}"
    )
    for label, r in summary["results"].items():
        before, after = r["distances"]["parameters"]
        rs = " ".join(f"{r['R'][g]['total']:>9.4f}" for g in gammas)
        t = r.get("taylor")
        half = t["lambdas"].index(0.5) if t and 0.5 in t["lambdas"] else None
        actual = f"{t['actual'][half]:>9.4f}" if half is not None else f"{'—':>9}"
        taylor = f"{t['predicted'][half]:>9.4f}" if half is not None else f"{'—':>9}"
        print(f"{label:<10} {before:>10.3f} {after:>10.3f} {rs} {actual} {taylor}")
    if "layerwise" in summary:
        _print_layerwise(summary["layerwise"])
    print(f"analysis.json and figures -> {args.out}")
    return 0


def _print_layerwise(lw: dict) -> None:
    """The width study's per-layer diagnostics at λ=½, one block per method."""
    columns = (
        ("lewc", "LEWC"),
        ("weak_additivity", "ReLU add."),
        ("reciprocal_ab", "W_A z_B/W_A z_A"),
        ("commutativity", "commut."),
        ("norm_ratio", "‖f_C‖/‖f_A+f_B‖"),
        ("non_overlap", "non-overlap"),
    )
    head = " ".join(f"{title:>15}" for _, title in columns)
    for label, r in lw["methods"].items():
        print(f"\nlayerwise at λ=½, {label}:\n{'layer':<12} {head}")
        for row in r["layerwise"]["layers"]:
            cells = " ".join(
                f"{row[k]:>15.4f}" if row.get(k) is not None else f"{'—':>15}" for k, _ in columns
            )
            print(f"{row['name']:<12} {cells}")
    rp = lw["random_permutations"]
    print(f"\nmerges at λ=½ ({rp['rest']} test examples; temperature fitted on {rp['held']}):")
    print(
        f"{'merge':<10} {'accuracy':>9} {'acc. barrier':>13} {'cal. loss barrier':>18} {'temp.':>7}"
    )
    for label, m in rp["merges"].items():
        print(
            f"{label:<10} {100 * m['accuracy']:>8.2f}% {100 * m['accuracy_barrier']:>12.2f}% "
            f"{m['calibrated_loss_barrier']:>18.4f} {m['temperature']:>7.3f}"
        )
    f = lw["flatness"]
    print(
        f"flatness: θ_A moved d={f['distance']:.2f} at random: accuracy "
        + ", ".join(f"{100 * a:.1f}%" for a in f["accuracy"])
        + " at λ = "
        + ", ".join(f"{lam:g}" for lam in f["lambdas"])
    )


def add_parser(sub) -> None:
    """The ``lmckit analyze`` parser."""
    p = sub.add_parser(
        "analyze",
        help="L2 distances, spectra, singular-vector alignment R(γ) and the Taylor barrier of "
        "two checkpoints (or Git Re-Basin's counterexample)",
        description="Ito et al.'s measurements for each matching method: per-tensor L2 "
        "before/after, singular values (Fig. 1), R(θ_A, π(θ_B)) at each γ (Fig. 2), R to the "
        "merged model (Fig. 3), singular-vector cosine heat maps, and eq. 2's Taylor barrier "
        "beside the actual one along λ; conv nets also get their operator spectra. "
        "--counterexample draws Git Re-Basin Fig. 6 instead.",
    )
    p.add_argument("a", type=arg.weights, nargs="?", help="reference checkpoint")
    p.add_argument("b", type=arg.weights, nargs="?", help="checkpoint to permute")
    p.add_argument("--perm", type=arg.existing_file, help="use this permutation file")
    p.add_argument(
        "--method",
        nargs="+",
        default=["none", "wm-fast"],
        choices=["none", *sorted(MATCHERS)],
        help="none = no permutation",
    )
    p.add_argument(
        "--gamma",
        type=arg.float_in(0.0, 1.0),
        nargs="+",
        default=[0.0, 0.3],
        help="thresholds γ of R (singular values > γ × the largest)",
    )
    p.add_argument("--no-taylor", action="store_true", help="skip the Taylor barrier")
    p.add_argument(
        "--layerwise",
        action="store_true",
        help="also the width study's diagnostics at λ=½: LEWC, ReLU weak additivity, second "
        "moments, reciprocal orthogonality, commutativity, activation norms, the flatness "
        "proxy and random-permutation merges with temperature calibration",
    )
    p.add_argument(
        "--no-data",
        action="store_true",
        help="weights only: no Taylor barrier, no data-driven methods",
    )
    p.add_argument(
        "--counterexample",
        action="store_true",
        help="Git Re-Basin's counterexample (App. A.3, Fig. 6) instead",
    )
    p.add_argument(
        "--out", type=arg.out_path, required=True, help="folder for analysis.json and plots"
    )
    arg.add_data_arguments(p)
    arg.add_model_class_arguments(p)
    p.set_defaults(func=cmd_analyze)
