"""The reproduction rows that did not finish on 2 CPU cores, or need a GPU, run at the papers'
settings on one GPU — in commands of a few minutes each, resumable from a store.

Each row is an experiment file (``experiments/NAME.toml``) run whole by ``lmckit run`` into
``STORE/NAME``. A command spends at most ``--minutes`` of wall clock: it runs the first
unfinished row, stops it with SIGTERM at its deadline (the run's ledger keeps every finished
job, and a model in training resumes from its last save), and the same command run again
goes on where it stopped. A row that completes gets its report (``lmckit report``) and its
results file copied to ``--results-dir`` (default ``docs/results/``) as ``NAME.json`` — or
``NAME-gpu.json`` where a file of that name is already there (a CPU run's: the page's
placeholders choose which to read). The pages render their numbers from those files.

    python scripts/gpu_rows.py list [--store STORE]
    python scripts/gpu_rows.py run [ROW ...] --store STORE [--minutes 9] [--device cuda]
        [--jobs 1] [--data-dir DIR] [--results-dir docs/results]

``--tiny`` shrinks every row to seconds on a CPU (the bundled digits, one epoch, small
models, few points): what the test suite runs, never a result. CIFAR rows need their
dataset on the machine (``--data-dir``): the device machines reach no network, and the
datasets are larger than what a command can carry there.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    """One experiment file, the page rows it fills and what it needs."""

    name: str
    fills: str
    needs: str
    tiny: dict[str, object] = field(default_factory=dict)
    dataset_on_disk: bool = False  # CIFAR: not downloadable where the GPU is
    paper: dict[str, object] = field(default_factory=dict)  # --set for the papers' setting

    @property
    def file(self) -> Path:
        return ROOT / "experiments" / f"{self.name}.toml"


_TINY_MLP = {"data.dataset": "digits", "train.epochs": 1}  # widths stay ×512: ¼ is 128 units

ROWS: tuple[Row, ...] = (
    Row(
        "lewc-width-fmnist-full",
        "width study Table 1 / Figs. 1–8 at ×8 and ×16 (width page, summary)",
        "about 2 GPU-hours (×16 dominates)",
        {
            **_TINY_MLP,
            "grid": {"model.width_multiplier": [0.25, 0.5]},
            "train.batch_size": 64,
            "compare.0.lambdas": 3,
        },
    ),
    Row(
        "stemm-fig5",
        "STE-MM Fig. 5 at 2 × (the Alg. 1 merge; ¼ … 1 × already on the page)",
        "two to three GPU-hours (its LAPs run on the CPU)",
        {
            **_TINY_MLP,
            "seeds": [0, 1, 2],
            "grid": {"model.width_multiplier": [0.25]},
            "merge.0.n": [2],
            "merge.0.options.ste-mm.epochs": 1,
        },
    ),
    Row(
        "rebasin-split-resnet20-fmnist",
        "Git Re-Basin §5.4 with ResNet-20 ×1: the table's endpoints and ECEs per input "
        "(recorded by the curve step since 2026-12-07; the CPU run's file predates them)",
        "minutes on a GPU (about 4 h of jobs on one CPU core)",
    ),
    Row(
        "stemm-geometry-fmnist",
        "STE-MM Figs. 6–10 with STE-MM at the paper's 10 epochs and n = 2, 3, 5, 10 "
        "(the CPU run: 2 epochs at n = 2, 5, 10)",
        "about an hour on a GPU (STE-MM's LAPs run on the CPU)",
        {**_TINY_MLP, "merge.0.n": [2, 3], "merge.1.n": [3], "merge.1.options.ste-mm.epochs": 1},
        paper={"merge.1.options.ste-mm.epochs": 10, "merge.1.n": [2, 3, 5, 10]},
    ),
    Row(
        "ito-fig5-fmnist",
        "Ito et al. Fig. 5 with the paper's WM (Peña et al.'s Sinkhorn on L2) at 100 epochs, "
        "ito-fmnist-mlp's training length (the CPU run: STE and exact WM, 10 epochs)",
        "under an hour on a GPU (Peña et al.'s Sinkhorn: 1,180 steps per pair)",
        {**_TINY_MLP, "triplets.0.landscape": 3, "triplets.0.options.sinkhorn": {"steps": 5}},
        paper={
            "train.epochs": 100,
            "triplets.0.methods": ["sinkhorn", "sinkhorn-mid", "wm-fast"],
            "triplets.0.options.sinkhorn": {"lr": 1.0, "steps": 1180, "recipe": "paper"},
        },
    ),
    Row(
        "rebasin-failure-modes-vgg-fmnist",
        "Git Re-Basin A.1: VGG-11 ×1",
        "under 30 GPU-minutes",
    ),
    Row(
        "width-resnet20-fmnist",
        "Git Re-Basin Fig. 4 with ResNet-20 (×1, ×2)",
        "minutes to an hour on a GPU (BatchNorm re-estimated on the training set at every λ)",
    ),
    Row(
        "ito-resnet20-cifar10",
        "Ito et al. Tables 1–3, ResNet-20 ×16 on CIFAR-10",
        "about a GPU-day, and CIFAR-10 on the machine",
        dataset_on_disk=True,
    ),
    Row(
        "ito-vgg11-cifar10",
        "Ito et al. Tables 1–3, VGG-11 ×4 on CIFAR-10",
        "several GPU-hours, and CIFAR-10 on the machine",
        dataset_on_disk=True,
    ),
    Row(
        "rebasin-split-cifar100",
        "Git Re-Basin §5.4 / Fig. 5, ResNet20 on CIFAR-100",
        "a few GPU-hours, and CIFAR-100 on the machine",
        dataset_on_disk=True,
    ),
    Row(
        "width-cifar10",
        "Git Re-Basin Fig. 4 ladder on CIFAR-10",
        "about a GPU-day, and CIFAR-10 on the machine",
        dataset_on_disk=True,
    ),
    Row(
        "lewc-width-cifar10",
        "width study, CIFAR-10",
        "several GPU-days, and CIFAR-10 on the machine",
        dataset_on_disk=True,
    ),
    Row(
        "lewc-width-cifar100",
        "width study, CIFAR-100",
        "several GPU-days, and CIFAR-100 on the machine",
        dataset_on_disk=True,
    ),
)


def _overrides(settings: dict[str, object]) -> list[str]:
    """``--set`` pairs for ``lmckit run`` (TOML values; a table as inline TOML)."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            out.append(f"{key}={{ {inner} }}")
        else:
            out.append(f"{key}={json.dumps(value)}")
    return out


DONE = "gpu_rows.done"  # written in a row's run folder once its run and report are complete


def complete(out: Path) -> bool | None:
    """Whether the run in ``out`` is complete and reported (None: never started)."""
    if (out / DONE).is_file():
        return True
    return False if (out / "ledger.sqlite").is_file() else None


def run_command(row: Row, out: Path, args: argparse.Namespace) -> list[str]:
    """``lmckit run`` of ``row`` into ``out``: the file with the row's ``paper`` settings,
    and with ``--tiny`` its tiny ones on top (they win)."""
    command = [
        sys.executable, "-m", "lmckit.cli", "run", str(row.file), "--out", str(out),
        "--device", args.device, "--jobs", str(args.jobs), "--quiet",
    ]  # fmt: skip
    if args.data_dir:
        command += ["--data-dir", str(args.data_dir), "--no-download"]
    for pair in _overrides({**row.paper, **(row.tiny if args.tiny else {})}):
        command += ["--set", pair]
    return command


def run_row(row: Row, store: Path, seconds: float, args: argparse.Namespace, log=print) -> str:
    """Run ``row`` for at most ``seconds``: ``"complete"``, ``"stopped"`` (deadline; run the
    command again) or ``"failed"``."""
    out = store / row.name
    command = run_command(row, out, args)
    log(f"{row.name}: running for at most {seconds / 60:.1f} min -> {out}")
    with subprocess.Popen(command, start_new_session=False) as process:
        try:
            code = process.wait(timeout=max(seconds, 1.0))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the run records what it finished
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log(f"{row.name}: stopped at its deadline; run the same command again to go on")
            return "stopped"
    if code != 0:
        log(f"{row.name}: `lmckit run` exited {code} (see `lmckit status {out}`)")
        return "failed"
    report = subprocess.run([sys.executable, "-m", "lmckit.cli", "report", str(out)], check=False)
    if report.returncode != 0 or not (out / "results.json").is_file():
        log(f"{row.name}: the report was not written")
        return "failed"
    target_dir = Path(args.results_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{row.name}.json"
    if target.exists():
        target = target_dir / f"{row.name}-gpu.json"
    shutil.copyfile(out / "results.json", target)
    (out / DONE).write_text(json.dumps({"results": str(target), "device": args.device}) + "\n")
    log(f"{row.name}: complete; results -> {target}")
    return "complete"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="each row, what it fills and needs, and its state")
    ls.add_argument("--store", type=Path)
    go = sub.add_parser("run", help="run unfinished rows for at most --minutes")
    go.add_argument("rows", nargs="*", help="rows to run (default: every runnable one)")
    go.add_argument("--store", type=Path, required=True, help="folder of the runs (kept)")
    go.add_argument("--minutes", type=float, default=9.0, help="wall clock of this command")
    go.add_argument("--device", default="cuda")
    go.add_argument("--jobs", type=int, default=1)
    go.add_argument("--data-dir", type=Path, help="datasets on disk (CIFAR rows need it)")
    go.add_argument("--results-dir", default=str(ROOT / "docs" / "results"))
    go.add_argument("--tiny", action="store_true", help="seconds on a CPU: for the tests")
    args = parser.parse_args(argv)
    for option, path in (
        ("--store", args.store),
        ("--results-dir", getattr(args, "results_dir", None)),
    ):
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            parser.error(f"{option} {path} is a file; a folder is needed")
    if args.command == "run":
        if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", args.device):
            parser.error(f"--device {args.device!r} is not cpu, cuda, cuda:N or mps")
        if args.data_dir is not None and not args.data_dir.is_dir():
            parser.error(f"--data-dir {args.data_dir} is not a folder")
    rows = {row.name: row for row in ROWS}
    if args.command == "list":
        for row in ROWS:
            state = complete(args.store / row.name) if args.store else None
            shown = {None: "not started", True: "complete", False: "unfinished"}[state]
            settings = " ".join(f"--set {pair}" for pair in _overrides(row.paper))
            print(
                f"{row.name}: {row.fills} — needs {row.needs} [{shown}]"
                + (f"; runs with {settings}" if settings else "")
            )
        return 0
    unknown = [r for r in args.rows if r not in rows]
    if unknown:
        parser.error(f"unknown rows {unknown}; rows: {list(rows)}")
    if args.minutes <= 0 or args.jobs < 1:
        parser.error("--minutes must be positive and --jobs at least 1")
    chosen = [rows[r] for r in args.rows] or [
        r for r in ROWS if not r.dataset_on_disk or args.data_dir
    ]
    deadline = time.monotonic() + 60 * args.minutes
    for row in chosen:
        if args.tiny and not row.tiny:
            print(f"{row.name}: no tiny settings (a convolutional row): skipped")
            continue
        if complete(args.store / row.name):
            continue
        left = deadline - time.monotonic()
        if left <= 5:
            print("out of time: run the same command again")
            return 3
        state = run_row(row, args.store, left, args)
        if state == "stopped":
            return 3
        if state == "failed":
            return 1
    print("every chosen row is complete")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
