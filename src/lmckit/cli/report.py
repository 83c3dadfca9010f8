"""``lmckit report``: an experiment run's self-contained HTML report."""

from __future__ import annotations

import argparse

from lmckit.cli import arguments as arg
from lmckit.cli.applicability import Check

COMMAND = "report"
APPLIES: list[tuple[str, Check]] = []
NO_REPEATS: tuple[str, ...] = ()


def cmd_report(args: argparse.Namespace) -> int:
    from lmckit.experiments.report import write_report

    print(f"report -> {write_report(args.out)}")
    return 0


def add_parser(sub) -> None:
    """The ``lmckit report`` parser."""
    p = sub.add_parser("report", help="write a self-contained HTML report of an experiment run")
    p.add_argument("out", type=arg.existing_dir, help="the run's --out folder")
    p.set_defaults(func=cmd_report)
