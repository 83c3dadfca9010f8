"""An experiment run's state as text: what ``lmckit status`` prints about a run folder's
ledger (the latest run, counts per step, jobs waiting, running, failed and resumable) and
what ``lmckit run --dry-run`` prints about the jobs a run would take up. Every function
returns lines; the command line prints them."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from lmckit.experiments.ledger import PROGRESS_EVERY, STATUSES, Ledger
from lmckit.files import folder_holder


def status_lines(out: Path, ledger: Ledger) -> list[str]:
    """``lmckit status``'s summary of the run folder ``out`` whose ledger is ``ledger``
    (opened read-only by the caller): the latest run's header, the jobs of each step by
    status (and waiting, where the run recorded its plan), what is running and for how long,
    each failure's last line and each resumable job's saved progress."""
    lines: list[str] = []
    runs = ledger.runs()
    if runs:
        last = runs[-1]
        when = datetime.fromtimestamp(last["started"]).strftime("%Y-%m-%d %H:%M")
        sets = ", ".join(f"{k}={v!r}" for k, v in last["overrides"].items())
        source = str(last["environment"].get("lmckit_source") or "")
        code = source[:12] + (" (modified)" if source.endswith("(modified)") else "")
        only = last["environment"].get("only") or []
        lines.append(
            f"run {len(runs)} of {len(runs)}, started {when}"
            + (f", with --set {sets}" if sets else "")
            + (f", only {' '.join(only)} and their inputs" if only else "")
            + (f", lmckit {code}" if code else "")
            + " (earlier runs are kept in the ledger; this shows the latest)"
        )
    summary, jobs, planned = ledger.summary(), ledger.jobs(), ledger.planned()
    waiting = waiting_counts(summary, planned)
    columns = (*STATUSES, "reused")
    lines.append(
        f"{'step':<8} "
        + (f"{'waiting':>11} " if planned is not None else "")
        + " ".join(f"{s:>11}" for s in columns)
    )
    empty = {**dict.fromkeys(STATUSES, 0), "reused": 0}
    for kind in sorted(set(summary) | set(waiting)):
        counts = summary.get(kind, empty)
        lines.append(
            f"{kind:<8} "
            + (f"{waiting.get(kind, 0):>11} " if planned is not None else "")
            + " ".join(f"{counts[s]:>11}" for s in columns)
        )
    running = sum(counts["running"] for counts in summary.values())
    held = folder_holder(out) is not None
    if sum(waiting.values()) and not held:
        lines.append(
            f"{sum(waiting.values())} job(s) never started: the run stopped first, or "
            "their inputs failed; the same lmckit run command goes on"
        )
    if running and not held:
        lines.append(
            f"no lmckit run holds {out} now: its {running} job(s) marked running "
            "stopped with their run (killed); the same lmckit run command runs them again"
        )
    elif running:
        lines.extend(running_lines(jobs, time.time(), ledger.progress_rows()))
    for job in jobs:
        if job["status"] in ("failed", "interrupted"):
            last_lines = (job["error"] or "").strip().splitlines()
            reason = last_lines[-1] if last_lines else ""
            # attempts count finished tries; an interrupted one never finished
            tries = f" ({job['attempts']} attempt(s))" if job["status"] == "failed" else ""
            lines.append(f"{job['status']}: {job['name']}{tries}: {reason}")
    lines.extend(resumable_lines(out, jobs))
    return lines


def plan_lines(planned: list, *, retry_failed: bool = False, only: bool = False) -> list[str]:
    """``lmckit run --dry-run``: one line per job of ``planned``
    (:func:`lmckit.experiments.runner.plan_run`) saying what the run would do with it, then
    the counts; ``only``: the plan is a slice (``--only``), its jobs named or needed."""
    lines = []
    width = max(len(job.name) for job in planned)
    counts = {"finished before": 0, "failed before": 0, "waiting": 0, "resumable": 0, "to run": 0}
    stuck: set[str] = set()  # failed before and not retried, or waiting on such a job
    for job in planned:
        blocker = next((d for d in job.deps if d in stuck), None)
        if blocker is not None and job.earlier != "done":
            state = f"waits: it needs {blocker}, which will not run"
            counts["waiting"] += 1
            stuck.add(job.name)
        elif job.earlier == "done":
            state = f"finished in run {job.run} (reused if its inputs are unchanged)"
            counts["finished before"] += 1
        elif job.earlier == "failed" and not retry_failed:
            state = f"failed in run {job.run} (not run again without --retry-failed; "
            state += "the jobs that need it wait)"
            counts["failed before"] += 1
            stuck.add(job.name)
        elif job.resumable is not None:
            state = resumable_line(job.name, job.resumable).split(" saved ", 1)[1]
            state = f"{job.earlier} in run {job.run}; resumes from its file, saved {state}"
            counts["resumable"] += 1
        else:
            state = "to run" if job.earlier is None else f"to run ({job.earlier} in run {job.run})"
            counts["to run"] += 1
        needed = "" if job.named else "  (needed)"
        lines.append(f"  {job.name:<{width}}  {state}{needed}")
    named = sum(job.named for job in planned)
    which = f"{named} named by --only, {len(planned) - named} they need" if only else "all"
    tally = ", ".join(f"{n} {what}" for what, n in counts.items())
    lines.append(f"dry run: {len(planned)} jobs ({which}): {tally}; nothing was run or written")
    return lines


def waiting_counts(
    summary: dict[str, dict[str, int]], planned: dict[str, int] | None
) -> dict[str, int]:
    """Per step, the jobs of the run's plan not yet in its ledger — waiting for their
    inputs (a job enters the ledger once its inputs are done and its result key known)."""
    if planned is None:
        return {}
    return {
        kind: max(0, count - sum(summary.get(kind, {}).get(s, 0) for s in STATUSES))
        for kind, count in planned.items()
    }


def _duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"2.5 h"``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def running_lines(
    jobs: list[dict[str, Any]],
    now: float,
    progress: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """One line per job running at ``now`` (seconds since the epoch): for how long, and
    how long the finished jobs of its step took to compute (shortest–longest; a reused
    job keeps its time), to judge what is left — and, where the ledger has the job's
    latest progress event (``progress``: :meth:`Ledger.progress_rows
    <lmckit.experiments.ledger.Ledger.progress_rows>`), where it is (:func:`progress_text`)."""
    took: dict[str, list[float]] = {}
    for job in jobs:
        if job["status"] == "done" and job["seconds"] is not None:
            took.setdefault(job["kind"], []).append(job["seconds"])
    lines = []
    for job in jobs:
        if job["status"] != "running" or job["started"] is None:
            continue
        line = f"running: {job['name']} for {_duration(now - job['started'])}"
        done = took.get(job["kind"])
        if done:
            span = _duration(min(done))
            if len(done) > 1:
                span += f" to {_duration(max(done))}"
            line += f" (its step's {len(done)} finished job(s) took {span})"
        row = (progress or {}).get(job["name"])
        if row is not None:
            line += "; " + progress_text(row, now)
        lines.append(line)
    return lines


def progress_text(row: dict[str, Any], now: float) -> str:
    """``at step S of T (epoch E), about D more at this run's pace`` for a job's latest
    progress event (a ledger progress row): the pace is the time per step since the first
    step this run saw of it (a resumed job's earlier steps are not in it); ``last report
    M min ago`` when the event is old — the job may be stuck in a long step or its
    worker gone."""
    step, total = row["step"], row["total"]
    text = f"at step {step}" + (f" of {total}" if total is not None else "")
    epoch = row["metrics"].get("epoch")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool):
        text += f" (epoch {epoch:g})"
    ran, steps = row["updated"] - row["first_time"], step - row["first_step"]
    if total is not None and total > step and steps > 0 and ran > 0:
        text += f", about {_duration(ran / steps * (total - step))} more at this run's pace"
    if now - row["updated"] > 6 * PROGRESS_EVERY:
        text += f" (last report {_duration(now - row['updated'])} ago)"
    return text


def resumable_line(name: str, progress: dict[str, Any]) -> str:
    """``resumable: NAME saved after epoch E of N (M min of work kept; about T more at its
    pace)`` (``point`` for an interpolation's λ points) for a job's resume file
    (:func:`lmckit.resume.saved_progress`); the estimate is the time per epoch of the
    process that saved the file (from where it resumed, when the file says) times the
    epochs left — for a file saved within an epoch only where it records the epoch's steps
    (STE-MM's do)."""
    seconds, epoch, epochs = progress["seconds"] or 0, progress["epoch"] or 0, progress["epochs"]
    step, per_epoch = progress["step_in_epoch"] or 0, progress.get("steps_per_epoch")
    where = f"after {progress.get('unit') or 'epoch'} {epoch}"
    done = _epochs_done(epoch, step, per_epoch)
    if step:
        where = f"at step {step}" + (f" of {per_epoch}" if per_epoch else "")
        where += f" of epoch {epoch + 1}"
    kept = f"{seconds / 60:.0f} min of work kept"
    if done and isinstance(epochs, int) and epochs > done:
        pace = seconds / done
        began = progress.get("resumed_from")
        began = began if isinstance(began, dict) else {}  # older files have none
        began_at = _epochs_done(began.get("epoch") or 0, began.get("step_in_epoch"), per_epoch)
        if began_at is not None and done > began_at and seconds > (began.get("seconds") or 0):
            pace = (seconds - (began.get("seconds") or 0)) / (done - began_at)
        kept += f"; about {_duration(pace * (epochs - done))} more at its pace"
    return f"resumable: {name} saved {where} of {epochs} ({kept})"


def _epochs_done(epoch: int, step: int | None, per_epoch: int | None) -> float | None:
    """Epochs done at step ``step`` of epoch ``epoch + 1`` (fractional; ``None`` when the
    step is within an epoch of unknown length)."""
    if not step:
        return epoch
    return epoch + step / per_epoch if per_epoch else None


def resumable_lines(out: Path, jobs: list[dict[str, Any]]) -> list[str]:
    """One line per unfinished job of ``jobs`` whose state a resume file in ``out``'s store
    holds: how far it got (:func:`resumable_line`)."""
    from lmckit.resume import saved_progress
    from lmckit.store import Store

    store = Store(out / "store")
    if not store.resume_files():
        return []
    lines = []
    for job in jobs:
        if job["status"] == "done" or not job["key"]:
            continue
        progress = saved_progress(store.resume_file(job["key"]))
        if progress is not None:
            lines.append(resumable_line(job["name"], progress))
    return lines
