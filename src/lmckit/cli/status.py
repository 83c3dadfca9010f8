"""``lmckit status``: an experiment run's job ledger, summarised."""

from __future__ import annotations

import argparse

from lmckit.cli import arguments as arg
from lmckit.cli.applicability import Check
from lmckit.errors import UsageError

COMMAND = "status"
APPLIES: list[tuple[str, Check]] = []
NO_REPEATS: tuple[str, ...] = ()


def cmd_status(args: argparse.Namespace) -> int:
    from lmckit.experiments.ledger import Ledger
    from lmckit.experiments.status import status_lines
    from lmckit.files import check_output_dir, locked_output

    path = args.out / "ledger.sqlite"
    if not path.is_file():
        raise UsageError(f"{args.out} holds no experiment ledger (ledger.sqlite)")
    exports = [(f, o) for f, o in ((args.csv, "--csv"), (args.parquet, "--parquet")) if f]
    for folder, option in exports:  # before the table is printed, not after
        check_output_dir(folder, option)
    if args.parquet:
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:  # before any output, not after
            raise UsageError("--parquet needs pyarrow (pip install pyarrow); --csv does not")
    ledger = Ledger(path, create=False)
    try:
        for line in status_lines(args.out, ledger):
            print(line)
        # the tables go into folders lmckit guards: a user's own jobs.csv is never replaced
        for folder, option in exports:
            export = ledger.export_csv if option == "--csv" else ledger.export_parquet
            with locked_output(folder, option):
                for written in export(folder):
                    print(f"wrote {written}")
    finally:
        ledger.close()
    return 0


def add_parser(sub) -> None:
    """The ``lmckit status`` parser."""
    p = sub.add_parser("status", help="summarise an experiment run's job ledger")
    p.add_argument("out", type=arg.existing_dir, help="the run's --out folder")
    p.add_argument(
        "--csv", type=arg.out_path, metavar="DIR", help="also write jobs.csv and metrics.csv"
    )
    p.add_argument(
        "--parquet", type=arg.out_path, metavar="DIR", help="also write Parquet (pyarrow)"
    )
    p.set_defaults(func=cmd_status)
