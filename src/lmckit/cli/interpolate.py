"""``lmckit interpolate``: loss and accuracy along the linear path between two checkpoints."""

from __future__ import annotations

import argparse

from lmckit._catalog import MATCHERS
from lmckit.cli import arguments as arg
from lmckit.cli import inputs as cli_inputs
from lmckit.cli.applicability import MODEL_CLASS, Check, excludes
from lmckit.cli.progress import ProgressBars, budget
from lmckit.errors import UsageError
from lmckit.workflows.inputs import refuse_folders_for_data

COMMAND = "interpolate"
APPLIES: list[tuple[str, Check]] = [
    ("method", excludes("perm", "the path uses the given permutation")),
    *MODEL_CLASS,
]
NO_REPEATS = ("method",)


def cmd_interpolate(args: argparse.Namespace) -> int:
    from lmckit.files import check_output_dir
    from lmckit.params import has_batchnorm
    from lmckit.workflows.interpolation import run_interpolate

    check_output_dir(args.out, "--out")
    refuse_folders_for_data([args.a, args.b])
    a, b = cli_inputs.pair(args)
    if "bn_batches" in args.given and not has_batchnorm(a.params):
        raise UsageError("--bn-batches does not apply here: the model has no BatchNorm")
    data = cli_inputs.data(a, args)
    from lmckit.workflows.estimates import check_curves

    paths = 1 if args.perm else len(args.method)
    check_curves(
        a, data, paths=paths, lambdas=args.lambdas, test_only=args.test_only,
        budget=budget(args),
    )  # fmt: skip
    with ProgressBars(not args.quiet) as bars:
        summary = run_interpolate(
            a,
            b,
            data,
            args.out,
            methods=args.method,
            perm_file=args.perm,
            lambdas=args.lambdas,
            calibrated=args.calibrated,
            test_only=args.test_only,
            bn_batches=args.bn_batches,
            repair=args.repair,
            seed=args.seed,
            progress=bars,
        )
    extra = f" {'ppl(λ=½)':>9} {'ppl ends':>9}" if data.next_token else ""
    print(
        f"{'curve':<10} {'loss barrier':>13} {'convex':>9} {'acc barrier':>12} {'acc(λ=½)':>9}"
        + extra
    )
    for label, c in summary["curves"].items():
        t = c.barriers["test"]
        row = (
            f"{label:<10} {t['loss']['rebasin']:>13.4f} {t['loss']['convex']:>9.4f} "
            f"{100 * t['accuracy']['rebasin']:>11.2f}% "
            f"{100 * c.midpoint('test', 'accuracy'):>8.2f}%"
        )
        if data.next_token:  # per-token losses: perplexities too
            ppl = c.perplexities("test")
            row += f" {ppl['perplexity.midpoint']:>9.3f} {ppl['perplexity.endpoints']:>9.3f}"
        print(row)
    print(f"curves, barriers and plots -> {args.out}")
    return 0


def add_parser(sub) -> None:
    """The ``lmckit interpolate`` parser."""
    p = sub.add_parser(
        "interpolate",
        help="loss/accuracy along the linear path between two checkpoints, naive and matched",
        description="Evaluate θ(λ) = (1−λ)θ_A + λπ(θ_B) on train and test data for each "
        "matching method (or a given permutation file), with barriers, ensemble reference and "
        "plots. BatchNorm statistics are re-estimated at every interior λ.",
    )
    p.add_argument("a", type=arg.weights, help="checkpoint A, the path's start (λ = 0)")
    p.add_argument("b", type=arg.weights, help="checkpoint B, permuted onto A; the end (λ = 1)")
    p.add_argument(
        "--perm", type=arg.existing_file, help="use this permutation file instead of --method"
    )
    p.add_argument(
        "--method",
        nargs="+",
        default=["none", "wm-fast"],
        choices=["none", *sorted(MATCHERS)],
        help="none = the naive path",
    )
    p.add_argument("--out", type=arg.out_path, required=True, help="folder for curves and plots")
    p.add_argument("--lambdas", type=arg.int_at_least(2), default=25, help="points on the path")
    p.add_argument("--calibrated", action="store_true", help="temperature-calibrated loss too")
    p.add_argument("--test-only", action="store_true", help="skip the training split")
    p.add_argument(
        "--bn-batches", type=arg.int_at_least(1), default=20, help="batches for BN reset"
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="REPAIR channel statistics at every interior λ (BN-free nets)",
    )
    arg.add_data_arguments(p)
    arg.add_model_class_arguments(p)
    p.set_defaults(func=cmd_interpolate)
