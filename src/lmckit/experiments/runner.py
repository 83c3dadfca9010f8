"""Running an experiment: expand it into jobs, run what is missing, record everything.

``run_experiment(experiment, out)`` expands the experiment into its jobs
(:func:`~lmckit.experiments.dag.build_jobs`) and runs them, dependencies first, on an
executor. Before a job runs, the driver computes its result-store key from its settings
and its dependencies' content hashes; the job then finds its artifact in the store (a
finished job is never redone) or computes and stores it. The driver alone writes the job
ledger (``out/ledger.sqlite``): per run, one row per job with its store key, status,
whether it was reused, attempts, times, host, error text and metrics, and the latest
progress event of each running job (every :data:`~lmckit.experiments.ledger.PROGRESS_EVERY`
seconds; :mod:`lmckit.experiments.ledger`). ``out/experiment.toml`` is the experiment as it
ran, overrides applied. A folder holds the runs of one experiment: a run of another one into
it is refused. ``reuse_from`` names other runs' folders whose stores are read (never written)
for the artifacts this run needs (:class:`~lmckit.store.Store`): how one
experiment takes another's finished models and matchings.

Ctrl-C or SIGTERM stops the run's jobs at once (worker processes included; on Linux a
worker also dies with a driver killed by SIGKILL) and records them as ``interrupted``.
Killing a run at any moment loses nothing finished: artifacts are written atomically and
keyed by content, so the next run reuses them; a job that was running starts again.
Failed jobs are recorded with their traceback and not retried unless
``retry_failed=True``; the jobs that depend on them wait.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch

from lmckit import __version__
from lmckit.budget import Budget
from lmckit.errors import LmcError, Terminated, UsageError
from lmckit.experiments.dag import build_jobs, select_jobs
from lmckit.experiments.executors import default_threads, make_executor, usable_cores
from lmckit.experiments.ledger import PROGRESS_EVERY, Ledger
from lmckit.experiments.schema import DEFAULT_NAME, Experiment, model_configs
from lmckit.experiments.steps import ARTIFACT_KIND, STEPS, Job, dataset_for, job_key
from lmckit.files import atomic_write_bytes, check_outputs, special_kind, writes_folder
from lmckit.progress import Progress, ProgressCallback
from lmckit.resume import save_interval, saved_progress
from lmckit.store import Store

__all__ = [
    "PlannedJob",
    "RunFolderError",
    "RunSummary",
    "earlier_experiment",
    "plan_run",
    "run_experiment",
    "sigterm_as_interrupt",
]


def check_training_jobs(jobs: list[Job], data_for, budget: Budget) -> None:
    """Refuse a run whose training jobs cannot finish: every model's weights, gradients and
    optimiser state must fit in memory (counted on the meta device), and the job with the
    most work (parameters × epochs × examples) must fit the time budget — one forward pass
    of its model is timed and scaled to its epochs (a lower bound: training also runs the
    backward pass)."""
    from lmckit.models import build_model
    from lmckit.train import TrainConfig, init_model, train_examples
    from lmckit.workflows.training import check_training_budget, check_training_time

    heaviest, most = None, -1.0
    seen: set[str] = set()
    for job in jobs:
        if job.kind != "train":
            continue
        s = job.settings
        signature = repr((s["model_name"], s["model_config"], s["train_config"].get("epochs")))
        if signature in seen:
            continue
        seen.add(signature)
        config = TrainConfig.from_dict(s["train_config"])
        data = data_for(s["model_name"])
        check_training_budget(s["model_name"], s["model_config"], data, config, budget)
        with torch.device("meta"):
            numel = sum(
                p.numel() for p in build_model(s["model_name"], **s["model_config"]).parameters()
            )
        work = float(numel) * config.epochs * train_examples(config, data)
        if work > most:
            heaviest, most = (job, config, data), work
    if heaviest is not None:
        job, config, data = heaviest
        model = init_model(job.settings["model_name"], job.settings["model_config"], 0)
        check_training_time(model, data, config, f"training job {job.name}", budget)
    _check_epoch_jobs(jobs, data_for, budget)


def _check_epoch_jobs(jobs: list[Job], data_for, budget: Budget) -> None:
    """Refuse a run whose matching or merging job with the most epochs of work (STE,
    STE-MM, the learned transforms: ``options.epochs``) cannot finish in the budget: at
    least a forward pass over the training examples per epoch, timed on the job's model
    (a lower bound: each step also runs a backward pass and a projection)."""
    from lmckit.budget import check_budget, forward_seconds
    from lmckit.train import init_model

    heaviest, most = None, 0.0
    for job in jobs:
        epochs = (
            job.settings.get("options", {}).get("epochs")
            if job.kind in ("match", "merge")
            else None
        )
        if isinstance(epochs, bool) or not isinstance(epochs, int | float) or epochs <= 0:
            continue
        data = data_for(job.settings["model_name"])
        examples = job.settings.get("server_examples") or len(data.train_y)
        if epochs * examples > most:
            heaviest, most = (job, epochs, examples, data), float(epochs * examples)
    if heaviest is None:
        return
    job, epochs, examples, data = heaviest
    model = init_model(job.settings["model_name"], job.settings["model_config"], 0)
    seconds, n = forward_seconds(model, None, data.loader("test", batch_size=256))
    per_epoch = examples * seconds / max(n, 1)
    check_budget(
        f"{job.kind} job {job.name} ({job.settings['method']}) for {epochs} epoch(s)",
        seconds=epochs * per_epoch,
        detail=f"each epoch ≥ a forward pass over {examples} examples, {per_epoch:.2g} s measured",
        budget=budget,
    )


def _worker_died(ledger: Ledger, jobs: list[Job], summary: RunSummary) -> None:
    """A worker process of the pool died: every job the pool was running stops without a
    result (``interrupted``; a rerun runs it again)."""
    for job in jobs:
        ledger.interrupted(job.name, "its worker process died (killed, or out of memory)")
        summary.waiting.append(job.name)


@dataclass
class RunSummary:
    """What a run did: job names by outcome, and where its ledger is."""

    out: Path
    done: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """Every job finished."""
        return not self.failed and not self.waiting


class RunFolderError(UsageError):
    """``--out`` holds another experiment's run, or ``--reuse-from`` names no run."""


def earlier_experiment(out: Path) -> str | None:
    """The name of the experiment run into ``out`` before (from ``out/experiment.toml``,
    or the ledger's latest run when that file is gone), ``None`` for a fresh folder.

    Raises:
        RunFolderError: ``out/experiment.toml`` exists but is not an experiment file.
    """
    import tomllib

    toml = out / "experiment.toml"
    text = None
    if special_kind(toml) is not None:
        raise RunFolderError(f"{toml} is {special_kind(toml)}, not the run's experiment file")
    if toml.is_file():
        try:
            text = toml.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise RunFolderError(f"{toml} is unreadable: {exc}") from None
    elif (out / "ledger.sqlite").is_file():
        with Ledger(out / "ledger.sqlite", create=False) as ledger:
            runs = ledger.runs()
        text = runs[-1]["experiment"] if runs else None
    if text is None:
        return None
    try:
        name = tomllib.loads(text).get("name", DEFAULT_NAME)
    except tomllib.TOMLDecodeError as exc:
        raise RunFolderError(f"{toml} is not an experiment file ({exc})") from None
    if not isinstance(name, str):
        raise RunFolderError(f'{toml} names no experiment (no name = "...")')
    return name


def _check_outputs(experiment: Experiment, out: Path) -> None:
    """What a run writes into ``out`` overwrites none of its inputs (the experiment file)."""
    check_outputs(
        [out / n for n in ("experiment.toml", "ledger.sqlite", "store")],
        [experiment.source] if experiment.source is not None else [],
    )


def _check_run_folders(experiment: Experiment, out: Path, reuse_from: list[Path]) -> None:
    """After :func:`check_outputs`: ``out/experiment.toml`` is lmckit's, so it names the
    experiment run there before."""
    earlier = earlier_experiment(out)
    if earlier is not None and earlier != experiment.name:
        raise RunFolderError(
            f"--out {out} holds a run of experiment {earlier!r}, not {experiment.name!r}; "
            f"choose a new folder (lmckit run --reuse-from {out} reuses its finished results)"
        )
    for folder in reuse_from:
        if not (folder / "store").is_dir():
            raise RunFolderError(f"--reuse-from {folder} holds no run (no {folder / 'store'})")
        if folder.resolve() == out.resolve():
            raise RunFolderError(
                f"--reuse-from {folder} is --out itself; its results are reused anyway"
            )


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM raises :class:`~lmckit.errors.Terminated` (a
    ``KeyboardInterrupt``) in the main thread, so a scheduler's or ``kill``'s stop ends
    the run as Ctrl-C does instead of killing the driver and orphaning its workers.
    Elsewhere than the main thread signals are left to the caller."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def source_revision(folder: str | Path) -> str | None:
    """The git commit of the work tree holding ``folder`` — ``"<sha> (modified)"`` when a
    tracked file under ``folder`` differs from it —, or ``None`` outside a git work tree
    (an installed package) or without git. Which code produced a run's results: a version
    number does not change between commits."""

    # a git hook's GIT_DIR (or a user's) would point git at another repository
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE",
                                                             "GIT_INDEX_FILE")}  # fmt: skip

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), *args],
                capture_output=True,
                text=True,
                timeout=10,
                env=env,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "--quiet", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{commit} (modified)" if changed else commit


def environment(threads: int | None = None) -> dict[str, Any]:
    """Versions and machine facts recorded with every run (``threads``: each job's torch
    threads, which its timings depend on; ``lmckit_source``: the commit of a git checkout's
    lmckit, see :func:`source_revision`)."""
    import numpy
    import scipy

    revision = source_revision(Path(__file__).resolve().parents[1])
    return {
        "lmckit": __version__,
        **({"lmckit_source": revision} if revision else {}),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": usable_cores(),
        "cuda": torch.cuda.is_available(),
        **({"threads_per_job": threads} if threads is not None else {}),
    }


@dataclass
class PlannedJob:
    """One job a run would do (:func:`plan_run`) and what its folder knows of it.

    ``named``: the job matches an ``only`` pattern (or there are none), else a job it
    needs. ``earlier``: the status of the folder's latest row for this name (``"done"``,
    ``"failed"``, ``"interrupted"``, ``"running"``, …; ``None``: no run has had it) and
    ``run``, that row's run. ``deps``: the jobs it needs. ``resumable``: what the job's
    resume file says (:func:`lmckit.resume.saved_progress`) when a job left unfinished
    has one."""

    name: str
    kind: str
    named: bool
    deps: tuple[str, ...] = ()
    earlier: str | None = None
    run: int | None = None
    resumable: dict[str, Any] | None = None


def plan_run(
    experiment: Experiment,
    out: str | Path,
    *,
    data_dir: str | Path | None = None,
    download: bool = True,
    budget: Budget | None = None,
    reuse_from: Sequence[str | Path] = (),
    only: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> list[PlannedJob]:
    """The jobs :func:`run_experiment` with these arguments would take up, in its order,
    checked as it checks them (the folders, the ``only`` patterns, the training budget) —
    and nothing run or written: ``out`` is only read, and need not exist. ``log`` gets the
    notes the run would print (:func:`short_splits`).

    The folder's ledger is read by job name: a job it records as done is reused, and one
    it records as failed is not run again (without ``retry_failed``), when its settings and
    inputs are unchanged (its key, known only once its inputs exist, is the one stored);
    the results of ``reuse_from`` folders are found by key at run time, so they are not
    listed here.
    """
    out = Path(out)
    data_key = str(data_dir) if data_dir is not None else None

    def data_for(model_name: str):
        return dataset_for(model_name, experiment.dataset, data_key, download)

    _check_outputs(experiment, out)
    _check_run_folders(experiment, out, [Path(r) for r in reuse_from])
    configs = model_configs(experiment, data_for)
    jobs = build_jobs(experiment, configs)
    selected = select_jobs(jobs, only) if only else jobs
    check_training_jobs(selected, data_for, budget or Budget())
    if log is not None:
        for line in short_splits(experiment, data_for(configs[0][0])):
            log(line)
    named = {job.name for job in selected if not only or any(fnmatch(job.name, p) for p in only)}
    known: dict[str, dict[str, Any]] = {}
    if (out / "ledger.sqlite").is_file():
        with Ledger(out / "ledger.sqlite", create=False) as ledger:
            known = ledger.latest_by_name()
    store = Store(out / "store")
    planned = []
    for job in selected:
        row = known.get(job.name, {})
        progress = None
        if row and row["status"] != "done" and row["key"]:
            progress = saved_progress(store.resume_file(row["key"]))
        planned.append(
            PlannedJob(
                job.name,
                job.kind,
                job.name in named,
                tuple(job.deps),
                row.get("status"),
                row.get("run"),
                progress,
            )
        )
    return planned


def short_splits(experiment: Experiment, data: Any) -> list[str]:
    """One line for each evaluation subset (``splits = { train = N }`` of a compare or
    triplet block) larger than the split ``data`` has: the whole split is used, as the
    curve's record says — said here too, where the user reads the run."""
    sizes = {"train": len(data.train_x), "test": len(data.test_x)}
    lines = []
    for kind, blocks in (("compare", experiment.compare), ("triplets", experiment.triplets)):
        for i, block in enumerate(blocks):
            for split, asked in block.splits.items():
                if asked != "all" and int(asked) > sizes[split]:
                    lines.append(
                        f"note: {kind}[{i}].splits.{split} asks {int(asked):,} examples; "
                        f"{experiment.dataset} has {sizes[split]:,} {split} examples, all used"
                    )
    return lines


@writes_folder("out")
def run_experiment(
    experiment: Experiment,
    out: str | Path,
    *,
    executor: str = "local",
    jobs: int = 1,
    address: str | None = None,
    retry_failed: bool = False,
    data_dir: str | Path | None = None,
    download: bool = True,
    device: str = "cpu",
    log: Callable[[str], None] = print,
    overall: ProgressCallback | None = None,
    job_progress: Callable[[str], ProgressCallback | None] | None = None,
    budget: Budget | None = None,
    reuse_from: Sequence[str | Path] = (),
    only: Sequence[str] = (),
) -> RunSummary:
    """Run ``experiment`` into ``out`` (see the module docstring).

    Args:
        executor: ``"local"`` (``jobs`` worker processes; 1 runs in this process) or
            ``"ray"`` (tasks on the Ray cluster at ``address``, or a local Ray instance).
        jobs: jobs at a time; each uses ``experiment.threads`` torch threads, by default
            the cores this process may use (its CPU affinity) divided by ``jobs``, at most
            ``$OMP_NUM_THREADS`` (:func:`~lmckit.experiments.executors.default_threads`).
        retry_failed: run again the jobs the ledger records as failed.
        data_dir, download: where the dataset is (see :func:`lmckit.data.load_dataset`).
        overall: a :class:`~lmckit.progress.Progress` after every job (step of total).
        job_progress: ``job name -> callback`` for the events within a job.
        budget: what one training job may take (default 24 h and the memory available);
            the largest is estimated before anything runs (:func:`check_training_jobs`).
        reuse_from: folders of earlier runs (of any experiment) whose stored results this
            run copies instead of computing them again; they are only read.
        only: shell-style patterns of job names (:func:`~lmckit.experiments.dag.select_jobs`):
            run only the matching jobs and what they need — a slice of a long experiment,
            e.g. the merges one session has time for. Recorded with the run; the resume
            files of jobs outside the slice are kept for the run that does them.

    Raises:
        RunFolderError: ``out`` holds a run of another experiment, or a ``reuse_from``
            folder holds no run.
        ExperimentError: a pattern of ``only`` matches no job.
    """
    start = time.perf_counter()
    out = Path(out)
    save_interval()  # a bad $LMCKIT_RESUME_EVERY fails here, not in every job
    threads = experiment.threads or default_threads(jobs)
    data_key = str(data_dir) if data_dir is not None else None

    def data_for(model_name: str):
        return dataset_for(model_name, experiment.dataset, data_key, download)

    reuse = [Path(r) for r in reuse_from]
    all_jobs, ledger = _start_run(
        experiment, out, data_for, reuse=reuse, only=only, budget=budget, threads=threads,
        log=log,
    )  # fmt: skip
    summary = RunSummary(out)
    on_progress = _progress_recorder(ledger, job_progress)
    common = {
        "store": str(out / "store"),
        "reuse_from": [str(r / "store") for r in reuse],
        "dataset": experiment.dataset,
        "data_dir": data_key,
        "download": download,
        "device": device,
        "threads": threads,
        "num_cpus": threads,
    }
    with sigterm_as_interrupt():
        pool = make_executor(executor, jobs=jobs, address=address, on_progress=on_progress)
        scheduler = _Scheduler(
            pool, all_jobs, ledger, summary, common, data_for, retry_failed=retry_failed,
            log=log, overall=overall,
        )  # fmt: skip
        try:
            scheduler.run(on_progress)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
            why = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
            stopped = ledger.interrupt_running(f"the run was stopped ({why}) while this job ran")
            summary.waiting.extend(stopped)
            pool.abort()
            raise
        finally:
            pool.close()
            ledger.close()
    # resume files of jobs no longer in the file (edited, copied runs); a slice's run cannot
    # tell those from the jobs outside it
    if summary.complete and not only:
        for stale in Store(out / "store").resume_files():
            stale.unlink(missing_ok=True)
    summary.seconds = time.perf_counter() - start
    return summary


def _start_run(
    experiment: Experiment,
    out: Path,
    data_for: Callable[[str], Any],
    *,
    reuse: list[Path],
    only: Sequence[str],
    budget: Budget | None,
    threads: int,
    log: Callable[[str], None],
) -> tuple[list[Job], Ledger]:
    """Check the run's folders, expand the experiment into its jobs (the ``only`` slice),
    refuse training beyond the budget, write the experiment file and open the ledger with
    the run recorded: the jobs and the ledger."""
    _check_outputs(experiment, out)
    _check_run_folders(experiment, out, reuse)
    configs = model_configs(experiment, data_for)
    all_jobs = build_jobs(experiment, configs)
    if only:
        all_jobs = select_jobs(all_jobs, only)
    check_training_jobs(all_jobs, data_for, budget or Budget())
    for line in short_splits(experiment, data_for(configs[0][0])):  # the same sizes for all
        log(line)
    as_run = experiment.as_run()
    atomic_write_bytes(out / "experiment.toml", as_run.encode())
    ledger = Ledger(out / "ledger.sqlite")
    facts = environment(threads)
    if reuse:
        facts["reuse_from"] = [str(r) for r in reuse]
    if only:
        facts["only"] = list(only)
    planned: dict[str, int] = {}
    for job in all_jobs:
        planned[job.kind] = planned.get(job.kind, 0) + 1
    ledger.start_run(as_run, facts, experiment.overrides, planned)
    return all_jobs, ledger


def _progress_recorder(
    ledger: Ledger, job_progress: Callable[[str], ProgressCallback | None] | None
) -> Callable[[str, Progress], None]:
    """``on_progress(job name, event)``: the ledger keeps each job's latest event, for
    ``lmckit status`` (at most one write per :data:`PROGRESS_EVERY` seconds a job, and its
    first and last events); ``job_progress`` makes each job's bar."""
    recorded: dict[str, float] = {}
    bars: dict[str, ProgressCallback | None] = {}

    def on_progress(name: str, event: Progress) -> None:
        now = time.time()
        last = event.total is not None and event.step >= event.total
        if name not in recorded or last or now - recorded[name] >= PROGRESS_EVERY:
            ledger.progress(name, event.step, event.total, event.metrics, now=now)
            recorded[name] = now
        if job_progress is None:
            return
        if name not in bars:
            bars[name] = job_progress(name)
        if bars[name] is not None:
            bars[name](event)

    return on_progress


class _Scheduler:
    """Hands the jobs to the executor as their inputs finish (at most its capacity at a
    time), records each in the ledger, and skips those whose inputs failed or that failed
    before (unless ``retry_failed``)."""

    def __init__(
        self,
        pool: Any,
        jobs: list[Job],
        ledger: Ledger,
        summary: RunSummary,
        common: dict[str, Any],
        data_for: Callable[[str], Any],
        *,
        retry_failed: bool,
        log: Callable[[str], None],
        overall: ProgressCallback | None,
    ) -> None:
        self.pool, self.ledger, self.summary, self.common = pool, ledger, summary, common
        self.data_for, self.retry_failed, self.log, self.overall = (
            data_for, retry_failed, log, overall
        )  # fmt: skip
        self.total = len(jobs)
        self.remaining: list[Job] = list(jobs)
        self.results: dict[str, dict[str, Any]] = {}
        self.blocked: set[str] = set()
        self.running: dict[Any, tuple[Job, str]] = {}
        self.finished = 0

    def run(self, on_progress: Callable[[str, Progress], None]) -> None:
        """Until every job has run, failed or waits on a failed one."""
        while self.remaining or self.running:
            self.submit_ready()
            for name, event in self.pool.poll_progress():
                on_progress(name, event)
            done = [f for f in self.running if f.done()]
            if not done:
                time.sleep(0.05)
                continue
            for future in done:
                self.collect(future)

    def submit_ready(self) -> None:
        """Submit the jobs whose inputs are done, while the executor has room."""
        for job in list(self.remaining):
            if len(self.running) >= self.pool.capacity:
                break
            if any(d in self.blocked for d in job.deps):
                self.blocked.add(job.name)
                self.remaining.remove(job)
                self.summary.waiting.append(job.name)
                continue
            if not all(d in self.results for d in job.deps):
                continue
            self.remaining.remove(job)
            self._submit(job)

    def _submit(self, job: Job) -> None:
        ledger = self.ledger
        data = self.data_for(job.settings["model_name"])
        deps = {d: self.results[d] for d in job.deps}
        key, _ = job_key(job, deps, data)
        ledger.add_job(job.name, key, job.kind, {**job.settings, "labels": job.labels})
        earlier = ledger.earlier(key)
        if earlier and earlier["status"] == "failed" and not self.retry_failed:
            ledger.failed(job.name, earlier["error"] or "failed before", ran=False)
            self.blocked.add(job.name)
            self.summary.failed.append(job.name)
            self.log(f"{job.name}: failed in an earlier run (see lmckit status; --retry-failed)")
            return
        ledger.started(job.name)
        payload = {
            "name": job.name,
            "kind": job.kind,
            "key": key,
            "settings": dict(job.settings),
            "deps": deps,
            "dep_order": list(job.deps),
            **self.common,
            "num_gpus": STEPS[job.kind].num_gpus,
        }
        self.running[self.pool.submit(payload)] = (job, key)

    def collect(self, future: Any) -> None:
        """Record the outcome of a finished job's ``future``."""
        job, key = self.running.pop(future)
        try:
            result = future.result()
        except BrokenProcessPool:
            _worker_died(self.ledger, [job, *(j for j, _ in self.running.values())], self.summary)
            raise LmcError(
                "a worker process died (killed, or out of memory) while running "
                f"{job.name}; finished results are kept — rerun the same command to "
                "continue"
            ) from None
        self.finished += 1
        if "error" in result:
            self.ledger.failed(job.name, result["error"])
            self.blocked.add(job.name)
            self.summary.failed.append(job.name)
            last = result["error"].strip().splitlines()[-1]
            self.log(f"{job.name}: failed ({last}); recorded in the ledger")
        else:
            record = dict(result["record"])
            # the time the artifact took to compute (stored with it), not this run's
            seconds = record.pop("seconds", result["seconds"])
            self.ledger.done(
                job.name,
                record,
                seconds=seconds,
                reused=result["reused"],
                finished=result.get("created") if result["reused"] else None,
            )
            self.results[job.name] = {
                "key": key,
                "content": result["content"],
                "kind": ARTIFACT_KIND[job.kind],
            }
            (self.summary.reused if result["reused"] else self.summary.done).append(job.name)
        if self.overall is not None:
            self.overall(Progress(self.finished, self.total, {"job": job.name}))
