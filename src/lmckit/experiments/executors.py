"""Where jobs run: in this process, in worker processes, or as Ray tasks.

Every executor takes job payloads (plain data, see :mod:`lmckit.experiments.runner`) and
returns :class:`concurrent.futures.Future` objects holding :func:`~lmckit.experiments.
steps.execute`'s result. Per-job progress events reach the driver through
:meth:`Executor.poll_progress` (in-process and worker processes; Ray tasks report only
when they finish). Only the driver touches the ledger; workers write artifacts into the
store, which is safe to share (atomic, keyed).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing.managers import SyncManager
from typing import Any

from lmckit.errors import UsageError
from lmckit.progress import Progress

__all__ = ["EXECUTORS", "Executor", "make_executor"]

EXECUTORS = ("local", "ray")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system reports one
    (``taskset``, cgroups, batch schedulers), else ``os.cpu_count()``. Threads beyond these
    only contend for the same cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def requested_threads() -> int | None:
    """The thread count ``$OMP_NUM_THREADS`` asks for (its first entry, as OpenMP reads a
    nested list), or ``None`` where it is unset or not a positive integer (OpenMP then
    ignores it too)."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) >= 1 else None


def default_threads(jobs: int) -> int:
    """Torch threads per job when an experiment sets none: the usable cores shared among
    ``jobs``, at most ``$OMP_NUM_THREADS`` where it is set — how a user asks for one
    thread when several runs share a machine. (Ignoring it used to start two OpenMP threads
    per run on two cores: three such runs spent half their time in spinning barriers.)"""
    threads = max(1, usable_cores() // max(1, jobs))
    requested = requested_threads()
    return threads if requested is None else min(threads, requested)


class Executor:
    """Runs payloads; ``capacity`` jobs at a time."""

    capacity = 1

    def submit(self, payload: dict[str, Any]) -> Future:  # pragma: no cover - interface
        raise NotImplementedError

    def poll_progress(self) -> list[tuple[str, Progress]]:
        """Progress events ``(job name, event)`` received since the last call."""
        return []

    def close(self) -> None:
        """Release workers (after the jobs they run have finished)."""

    def abort(self) -> None:
        """Stop every running job now and release the workers (the run was interrupted:
        Ctrl-C or SIGTERM); :meth:`close` does nothing afterwards. A job stopped this way
        leaves nothing half written: artifacts appear whole or not at all."""


class InlineExecutor(Executor):
    """One job at a time, in this process (``--jobs 1``): the simplest and the default."""

    def __init__(self, on_progress: Callable[[str, Progress], None] | None = None) -> None:
        self.on_progress = on_progress

    def submit(self, payload: dict[str, Any]) -> Future:
        from lmckit.experiments.steps import execute

        name = payload["name"]
        callback = None
        if self.on_progress is not None:
            on_progress = self.on_progress

            def callback(event: Progress) -> None:
                on_progress(name, event)

        future: Future = Future()
        future.set_result(execute(payload, callback))
        return future


_EVENTS: Any = None

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with(driver: int) -> None:
    """In a worker process: be sent SIGTERM when the driver ``driver`` dies, however it
    dies (SIGKILL, the out-of-memory killer), so that no orphan goes on computing for
    hours a result nobody waits for. Linux only; elsewhere an orphan ends with its job."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl: keep the portable behaviour
            return
    if os.getppid() != driver:  # the driver died before the request took effect
        os._exit(1)


def _init_worker(events: Any, driver: int) -> None:
    global _EVENTS
    _die_with(driver)
    _EVENTS = events


def _execute_in_worker(payload: dict[str, Any]) -> dict[str, Any]:
    from lmckit.experiments.steps import execute

    name = payload["name"]

    def forward(event: Progress) -> None:
        if _EVENTS is not None:
            _EVENTS.put((name, event.step, event.total, dict(event.metrics)))

    return execute(payload, forward)


class ProcessExecutor(Executor):
    """``jobs`` worker processes (``--executor local --jobs N``); each job sets its own
    torch threads, so N × threads need not exceed the cores."""

    def __init__(self, jobs: int) -> None:
        context = multiprocessing.get_context("spawn")  # no forked torch thread pools
        self.manager = SyncManager(ctx=context)
        self.manager.start(_die_with, (os.getpid(),))
        self.events = self.manager.Queue()
        self.pool = ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=context,
            initializer=_init_worker,
            initargs=(self.events, os.getpid()),
        )
        self.capacity = jobs
        self.closed = False

    def submit(self, payload: dict[str, Any]) -> Future:
        return self.pool.submit(_execute_in_worker, payload)

    def poll_progress(self) -> list[tuple[str, Progress]]:
        out = []
        while True:
            try:
                name, step, total, metrics = self.events.get_nowait()
            except queue.Empty:
                return out
            out.append((name, Progress(step, total, metrics)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.manager.shutdown()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        # ProcessPoolExecutor stops its workers only after their jobs (3.14 adds
        # terminate_workers); a training job may run for hours, so end the processes.
        for process in list(getattr(self.pool, "_processes", {}).values()):
            if process.is_alive():
                process.terminate()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.manager.shutdown()


class RayExecutor(Executor):
    """Ray tasks (``--executor ray [--address ADDR]``), each declaring its step kind's
    resources (``num_cpus`` = the job's threads, ``num_gpus``); the same code path from a
    laptop's local Ray to a cluster with GPUs. Artifacts go to the shared ``--out`` folder."""

    def __init__(self, address: str | None, capacity: int) -> None:
        try:
            import ray
        except ImportError:
            raise UsageError("the ray executor needs Ray: pip install 'lmckit[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **({} if address else {"num_cpus": usable_cores()}),
            )
        self.remote = ray.remote(_execute_in_worker)
        self.capacity = capacity
        self.tasks: list[tuple[Any, Future]] = []  # (object ref, its future) not yet done

    def submit(self, payload: dict[str, Any]) -> Future:
        options = {"num_cpus": payload.get("num_cpus", 1), "num_gpus": payload.get("num_gpus", 0)}
        task = self.remote.options(**options).remote(payload)
        future = task.future()
        self.tasks = [(t, f) for t, f in self.tasks if not f.done()] + [(task, future)]
        return future

    def abort(self) -> None:
        for task, future in self.tasks:
            if not future.done():
                self.ray.cancel(task, force=True)
        self.tasks = []


def make_executor(
    kind: str,
    *,
    jobs: int = 1,
    address: str | None = None,
    on_progress: Callable[[str, Progress], None] | None = None,
) -> Executor:
    """The executor ``kind`` (``"local"`` or ``"ray"``) for ``jobs`` concurrent jobs."""
    if kind not in EXECUTORS:
        raise UsageError(f"executor must be one of {EXECUTORS}, got {kind!r}")
    if kind == "ray":
        return RayExecutor(address, capacity=max(1, jobs))
    if jobs == 1:
        return InlineExecutor(on_progress)
    return ProcessExecutor(jobs)
