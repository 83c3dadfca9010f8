"""``lmckit demo``: the README's main job."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmckit.cli import arguments as arg
from lmckit.cli.applicability import Check
from lmckit.cli.progress import ProgressBars, budget

COMMAND = "demo"
APPLIES: list[tuple[str, Check]] = []
NO_REPEATS: tuple[str, ...] = ()


def cmd_demo(args: argparse.Namespace) -> int:
    from lmckit.experiments.demo import DemoRow, format_table, run_demo
    from lmckit.files import check_output_dir

    check_output_dir(args.out, "--out")
    with ProgressBars(not args.quiet) as bars:
        summary = run_demo(
            args.out,
            dataset=args.dataset,
            epochs=args.epochs,
            ste_epochs=args.ste_epochs,
            progress=bars,
            budget=budget(args),
        )
    rows = [DemoRow(**r) for r in summary["rows"]]
    ends = summary["endpoints"]
    print()
    print(
        f"MLP 3×512 on {summary['dataset']}, {summary['epochs']} epochs: test accuracy "
        f"A {100 * ends['A']['test_accuracy']:.2f} %, B {100 * ends['B']['test_accuracy']:.2f} %"
    )
    print(format_table(rows))
    print()
    print("pairwise test-loss barriers (naive -> weight matching):")
    for p in summary["pairwise_wm"]:
        print(
            f"  seeds {p['pair'][0]}–{p['pair'][1]}: {p['naive_loss_barrier']:.4f} -> "
            f"{p['wm_loss_barrier']:.4f}"
        )
    print(f"figures: {summary['figures']['interpolation']}, {summary['figures']['barriers']}")
    return 0


def add_parser(sub) -> None:
    """The ``lmckit demo`` parser."""
    p = sub.add_parser(
        "demo",
        help="train 3 MLPs, match them with every method, plot the interpolation curves",
        description="The README's main job: train three 3×512 MLPs on Fashion-MNIST (digits "
        "when it is not installed), match seed 1 to seed 0 with WM, AM, STE and Sinkhorn, "
        "interpolate naive vs matched and print the table. Finished pieces are cached in --out.",
    )
    p.add_argument(
        "--out", type=arg.out_path, default=Path("demo-out"),
        help="folder for the run: store, ledger, tables, curves, figures (demo-out)",
    )  # fmt: skip
    p.add_argument(
        "--dataset",
        type=arg.dataset,
        help="override the dataset (default: fashion-mnist or digits)",
    )
    p.add_argument(
        "--epochs", type=arg.int_at_least(1), help="default 5 (Fashion-MNIST) or 40 (digits)"
    )
    p.add_argument(
        "--ste-epochs", type=arg.int_at_least(1), default=1, help="epochs of STE matching (1)"
    )
    arg.add_max_hours(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
