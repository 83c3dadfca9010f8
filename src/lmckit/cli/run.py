"""``lmckit run``: an experiment file's jobs, resumable."""

from __future__ import annotations

import argparse
import sys

from lmckit._catalog import EXECUTORS
from lmckit.cli import arguments as arg
from lmckit.cli.applicability import Check
from lmckit.cli.progress import JobBars, ProgressBars, budget

COMMAND = "run"
APPLIES: list[tuple[str, Check]] = [
    ("address", lambda a: None if a.executor == "ray" else "it is for --executor ray")
]
NO_REPEATS: tuple[str, ...] = ()


def cmd_run(args: argparse.Namespace) -> int:
    from lmckit.experiments.runner import run_experiment
    from lmckit.experiments.schema import load_experiment, parse_overrides
    from lmckit.files import check_output_dir

    experiment = load_experiment(args.experiment, parse_overrides(args.set or []))
    check_output_dir(args.out, "--out")
    print(f"experiment {experiment.name}: {experiment.description or '(no description)'}")
    if experiment.expected_runtime:
        print(f"expected run time: {experiment.expected_runtime}")
    if args.dry_run:
        return _print_plan(experiment, args)
    if args.executor == "local":
        from lmckit.experiments.executors import usable_cores

        cores = usable_cores()
        if args.jobs > cores:  # allowed (memory-bound jobs), but rarely what was meant
            print(
                f"note: --jobs {args.jobs} is more than this machine's {cores} usable CPU "
                f"core(s): the jobs will share them (--jobs {cores} is usually faster)",
                file=sys.stderr,
            )
    with ProgressBars(not args.quiet) as bars:
        overall = bars("jobs", keep=True)
        summary = run_experiment(
            experiment,
            args.out,
            executor=args.executor,
            jobs=args.jobs,
            address=args.address,
            retry_failed=args.retry_failed,
            data_dir=args.data_dir,
            download=not args.no_download,
            device=args.device,
            log=lambda message: print(message, flush=True),
            overall=overall,
            job_progress=None if args.jobs > 1 and args.executor == "ray" else JobBars(bars),
            budget=budget(args),
            reuse_from=args.reuse_from or (),
            only=args.only or (),
        )
    print(
        f"{len(summary.done)} jobs run, {len(summary.reused)} reused from the store, "
        f"{len(summary.failed)} failed, {len(summary.waiting)} waiting on failed jobs "
        f"({summary.seconds:.1f} s) -> {args.out}"
    )
    if summary.failed:
        print(f"see `lmckit status {args.out}` for the errors; rerun with --retry-failed")
    return 0 if summary.complete else 1


def _print_plan(experiment, args: argparse.Namespace) -> int:
    """``lmckit run --dry-run``: one line per job the run would take up, then the counts."""
    from lmckit.experiments.runner import plan_run

    planned = plan_run(
        experiment,
        args.out,
        data_dir=args.data_dir,
        download=not args.no_download,
        budget=budget(args),
        reuse_from=args.reuse_from or (),
        only=args.only or (),
        log=print,
    )
    from lmckit.experiments.status import plan_lines

    for line in plan_lines(planned, retry_failed=args.retry_failed, only=bool(args.only)):
        print(line)
    return 0


def add_parser(sub) -> None:
    """The ``lmckit run`` parser."""
    p = sub.add_parser(
        "run",
        help="run an experiment file (a sweep of training, matching, curves, merges)",
        description="Expand an experiment file into jobs and run those whose results are not "
        "stored yet. Kill it at any time and rerun: finished jobs are reused. Results, the "
        "job ledger and the experiment file go to --out.",
    )
    p.add_argument("experiment", type=arg.existing_file, help="experiment file (.toml)")
    p.add_argument("--out", type=arg.out_path, required=True, help="folder for the run")
    p.add_argument(
        "--executor", choices=EXECUTORS, default="local",
        help="local: --jobs processes on this machine; ray: a Ray cluster (--address)",
    )  # fmt: skip
    p.add_argument("--jobs", type=arg.int_in(1, 4096), default=1, help="jobs at a time")
    p.add_argument("--address", help="Ray cluster address (with --executor ray)")
    p.add_argument("--retry-failed", action="store_true", help="rerun jobs that failed before")
    p.add_argument(
        "--reuse-from",
        action="append",
        type=arg.existing_dir,
        metavar="FOLDER",
        help="an earlier run's folder (any experiment) whose finished results (and the "
        "resume files of jobs it left half done) this run copies instead of recomputing; "
        "only read (repeatable)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a value of the file, e.g. --set train.epochs=2 (repeatable)",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="run only the jobs whose names match (shell-style, e.g. 'merge/b1/*'; names as "
        "the report's job table lists them) and the jobs they need (repeatable)",
    )
    p.add_argument("--data-dir", type=arg.existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=arg.device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument(
        "--max-hours",
        type=arg.positive,
        metavar="H",
        help="refuse a run whose largest training job is estimated beyond H hours (default 24)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the jobs this command would take up (with --only: the matching ones and "
        "what they need) and what --out knows of each (finished, failed, resumable), then "
        "stop: nothing is run or written",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)
