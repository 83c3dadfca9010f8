"""The job ledger of an experiment folder: SQLite, written only by the driver process.

Every ``lmckit run`` into the folder is a *run* (``runs``: its start, the experiment file
as it ran — overrides applied —, the overrides themselves and the environment). Each run
has one row per job of its experiment (``jobs``, keyed by run and job name): the job's
result-store key, step kind, settings, status (``pending``/``running``/``done``/
``failed``/``interrupted``), whether its result was *reused* from the store rather than
computed, how many times its result was computed in this folder (``attempts``), when and
how long it was computed (for a reused result: the original computation's times), host and
error text; ``metrics`` holds its measurements ``(run, job name, metric, value)``;
``progress`` the latest progress event of each job that reports them (step of total, the
event's scalar metrics, when it came, and the first step this run saw with its time — the
job's pace in this run). The ``progress`` table was added without a schema change: an
older ledger gains it when opened.

Two jobs whose results coincide (STE returning WM's permutation, so that both curves are
one stored artifact) are still two rows. Readers (``lmckit status``, ``lmckit report``)
look at the latest run only, so a rerun with other settings never mixes with the old one.
WAL mode lets them read while a run writes.
"""

from __future__ import annotations

import csv
import io
import json
import socket
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmckit.errors import LmcError
from lmckit.files import claim

__all__ = ["PROGRESS_EVERY", "STATUSES", "Ledger", "LedgerError"]

STATUSES = ("pending", "running", "done", "failed", "interrupted")
# Seconds between two writes of one job's progress by the run (lmckit status reads them).
PROGRESS_EVERY = 10.0
SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    started REAL NOT NULL,
    experiment TEXT NOT NULL,
    overrides TEXT NOT NULL,
    environment TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    run INTEGER NOT NULL,
    name TEXT NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    settings TEXT NOT NULL,
    status TEXT NOT NULL,
    reused INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    started REAL,
    finished REAL,
    seconds REAL,
    host TEXT,
    error TEXT,
    PRIMARY KEY (run, name)
);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (key);
CREATE TABLE IF NOT EXISTS metrics (
    run INTEGER NOT NULL,
    name TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (run, name, metric)
);
CREATE TABLE IF NOT EXISTS progress (
    run INTEGER NOT NULL,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    total INTEGER,
    metrics TEXT NOT NULL,
    first_step INTEGER NOT NULL,
    first_time REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (run, name)
);
"""
JOB_COLUMNS = (
    *("run", "key", "kind", "name", "settings", "status", "reused", "attempts"),
    *("started", "finished", "seconds", "host", "error"),
)


class LedgerError(LmcError):
    """A ledger that cannot be read: not SQLite, or written by another lmckit."""


class Ledger:
    """The ledger at ``path``, created if missing. ``create=False``: it must exist, and it
    is opened read-only — what ``lmckit status`` and ``lmckit report`` read is never
    written, an empty or foreign SQLite file never given the ledger's schema (with no run
    writing it, not even SQLite's side files are made)."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise LedgerError(f"{self.path} holds no experiment ledger")
        self.run_id: int | None = None
        if not create:
            self._open_read_only()
            return
        for suffix in ("", "-wal", "-shm"):
            claim(self.path.with_name(self.path.name + suffix))
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master")}
            if "jobs" in tables and "info" not in tables:
                self.db.close()
                raise LedgerError(
                    f"{self.path} was written by an older lmckit (one row per job, not per "
                    "run); move it away (the store's results are reused) and run again"
                )
            self.db.executescript(SCHEMA)
            self.db.execute(
                "INSERT OR IGNORE INTO info VALUES ('schema', ?)", (str(SCHEMA_VERSION),)
            )
            version = self.db.execute("SELECT value FROM info WHERE name = 'schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path} is not a readable job ledger: {exc}") from None
        if int(version[0]) != SCHEMA_VERSION:
            self.db.close()
            raise LedgerError(
                f"{self.path} has ledger schema {version[0]}; this lmckit reads {SCHEMA_VERSION}"
            )

    def _open_read_only(self) -> None:
        # a run writing the ledger keeps its write-ahead log beside it: read through it;
        # without one the file is all there is, read as immutable (no side files made)
        live = self.path.with_name(self.path.name + "-wal").exists()
        uri = f"{self.path.resolve().as_uri()}?mode=ro" + ("" if live else "&immutable=1")
        try:
            self.db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=30)
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master")}
            if "jobs" in tables and "info" not in tables:
                raise LedgerError(
                    f"{self.path} was written by an older lmckit (one row per job, not per "
                    "run); move it away (the store's results are reused) and run again"
                )
            if "info" not in tables:
                raise LedgerError(
                    f"{self.path} holds no experiment ledger (an empty or foreign SQLite file)"
                )
            version = self.db.execute("SELECT value FROM info WHERE name = 'schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise LedgerError(f"{self.path} is not a readable job ledger: {exc}") from None
        except LedgerError:
            self.db.close()
            raise
        if version is None or int(version[0]) != SCHEMA_VERSION:
            self.db.close()
            found = "no schema version" if version is None else f"ledger schema {version[0]}"
            raise LedgerError(f"{self.path} has {found}; this lmckit reads {SCHEMA_VERSION}")

    def close(self) -> None:
        """Close the database connection."""
        self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes (the driver only) --------------------------------------------------------
    def start_run(
        self,
        experiment: str,
        environment: Mapping[str, Any],
        overrides: Mapping[str, Any] | None = None,
        planned: Mapping[str, int] | None = None,
    ) -> int:
        """Record a new run — the experiment file as it runs, its overrides, the
        environment and ``planned``, its job count per step (a job enters the ledger only
        once its inputs are done and its key known) — and return its id. Jobs that a
        killed run left ``running`` become ``interrupted``."""
        self.db.execute(
            "UPDATE jobs SET status = 'interrupted' WHERE status IN ('running', 'pending')"
        )
        cursor = self.db.execute(
            "INSERT INTO runs (started, experiment, overrides, environment) VALUES (?, ?, ?, ?)",
            (
                time.time(),
                experiment,
                json.dumps(dict(overrides or {}), sort_keys=True),
                json.dumps(environment),
            ),
        )
        self.run_id = int(cursor.lastrowid)
        if planned is not None:
            self.db.execute(
                "INSERT OR REPLACE INTO info VALUES (?, ?)",
                (f"planned.{self.run_id}", json.dumps(dict(planned), sort_keys=True)),
            )
        return self.run_id

    def _current(self) -> int:
        if self.run_id is None:
            raise LedgerError("no run started on this ledger (call start_run first)")
        return self.run_id

    def add_job(self, name: str, key: str, kind: str, settings: Mapping[str, Any]) -> None:
        """The job's row in the current run, ``pending``."""
        self.db.execute(
            "INSERT INTO jobs (run, name, key, kind, settings, status, attempts) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?)",
            (
                self._current(),
                name,
                key,
                kind,
                json.dumps(settings, sort_keys=True),
                self.computed_before(key),
            ),
        )

    def earlier(self, key: str) -> dict[str, Any] | None:
        """``{"status", "error"}`` of the latest earlier run's job with result key ``key``
        that got that far (done or failed), or ``None``."""
        row = self.db.execute(
            "SELECT status, error FROM jobs WHERE key = ? AND run < ? "
            "AND status IN ('done', 'failed') ORDER BY run DESC LIMIT 1",
            (key, self._current()),
        ).fetchone()
        return {"status": row[0], "error": row[1]} if row else None

    def computed_before(self, key: str) -> int:
        """How many times the result with key ``key`` was computed in this folder so far —
        by any job of any run (two jobs may share one result)."""
        row = self.db.execute("SELECT MAX(attempts) FROM jobs WHERE key = ?", (key,)).fetchone()
        return int(row[0] or 0)

    def started(self, name: str) -> None:
        """The job is running."""
        self.db.execute(
            "UPDATE jobs SET status = 'running', started = ?, host = ? WHERE run = ? AND name = ?",
            (time.time(), socket.gethostname(), self._current(), name),
        )

    def done(
        self,
        name: str,
        metrics: Mapping[str, float],
        *,
        seconds: float | None,
        reused: bool,
        finished: float | None = None,
    ) -> None:
        """The job's result is stored: computed now (one more attempt), or ``reused`` from
        the store — then ``finished``/``seconds`` are the original computation's, and its
        attempts stay as they were. Of ``metrics``, the numbers are recorded (a record's
        other entries, such as a method's label, are not metrics)."""
        run = self._current()
        finished = time.time() if finished is None else finished
        started = finished - seconds if seconds is not None else None
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "UPDATE jobs SET status = 'done', reused = ?, attempts = attempts + ?, "
                "started = COALESCE(?, started), finished = ?, seconds = ?, error = NULL "
                "WHERE run = ? AND name = ?",
                (int(reused), 0 if reused else 1, started, finished, seconds, run, name),
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO metrics VALUES (?, ?, ?, ?)",
                [
                    (run, name, metric, float(value))
                    for metric, value in sorted(metrics.items())
                    if isinstance(value, int | float) and not isinstance(value, bool)
                ],
            )

    def failed(self, name: str, error: str, *, ran: bool = True) -> None:
        """The job raised (``ran``: it was attempted in this run); ``error`` is its
        traceback or the reason."""
        self.db.execute(
            "UPDATE jobs SET status = 'failed', attempts = attempts + ?, finished = ?, error = ? "
            "WHERE run = ? AND name = ?",
            (int(ran), time.time(), error, self._current(), name),
        )

    def interrupted(self, name: str, why: str) -> None:
        """The job stopped without a result through no fault of its own (its worker was
        killed); a rerun runs it again."""
        self.db.execute(
            "UPDATE jobs SET status = 'interrupted', error = ? WHERE run = ? AND name = ?",
            (why, self._current(), name),
        )

    def interrupt_running(self, why: str) -> list[str]:
        """Every job of the current run still ``running`` becomes ``interrupted`` with
        ``why`` (the run itself was stopped); returns their names."""
        run = self._current()
        names = [
            r[0]
            for r in self.db.execute(
                "SELECT name FROM jobs WHERE run = ? AND status = 'running' ORDER BY name", (run,)
            )
        ]
        self.db.execute(
            "UPDATE jobs SET status = 'interrupted', error = ? "
            "WHERE run = ? AND status = 'running'",
            (why, run),
        )
        return names

    def progress(
        self,
        name: str,
        step: int,
        total: int | None,
        metrics: Mapping[str, Any],
        *,
        now: float | None = None,
    ) -> None:
        """Job ``name`` of the current run reported ``step`` of ``total`` at ``now``
        (default: the time). The first event of a job — or of a new phase, whose total
        differs or whose step went back — also becomes the row's start, from which
        :meth:`progress_rows` readers measure the pace. Of ``metrics``, the finite numbers
        and short strings are kept."""
        now = time.time() if now is None else now
        kept = {
            k: v
            for k, v in metrics.items()
            if (isinstance(v, int | float) and not isinstance(v, bool) and _number(v) is not None)
            or (isinstance(v, str) and len(v) <= 80)
        }
        run = self._current()
        row = self.db.execute(
            "SELECT step, total FROM progress WHERE run = ? AND name = ?", (run, name)
        ).fetchone()
        if row is not None and row[1] == total and step >= row[0]:
            self.db.execute(
                "UPDATE progress SET step = ?, metrics = ?, updated = ? WHERE run = ? AND name = ?",
                (step, json.dumps(kept, sort_keys=True), now, run, name),
            )
            return
        self.db.execute(
            "INSERT OR REPLACE INTO progress VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run, name, step, total, json.dumps(kept, sort_keys=True), step, now, now),
        )

    # -- reads ---------------------------------------------------------------------------
    def latest_run(self) -> int | None:
        """The id of the latest run (``None`` before the first)."""
        row = self.db.execute("SELECT MAX(id) FROM runs").fetchone()
        return None if row[0] is None else int(row[0])

    def _run(self, run: int | None) -> int | None:
        return self.latest_run() if run is None else run

    def jobs(self, run: int | None = None) -> list[dict[str, Any]]:
        """Every job row of ``run`` (default: the latest run), by name."""
        cursor = self.db.execute(
            f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE run = ? ORDER BY name",
            (self._run(run),),
        )
        rows = [dict(zip(JOB_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            row["settings"] = self._json(row["settings"], f"job {row['name']}'s settings", dict)
            row["reused"] = bool(row["reused"])
        return rows

    def finished_elsewhere(self, run: int | None = None) -> list[str]:
        """Names of the jobs earlier runs than ``run`` (default: the latest) finished that
        ``run`` has no row for — what a slice's report leaves out — sorted."""
        return [
            r[0]
            for r in self.db.execute(
                "SELECT DISTINCT name FROM jobs WHERE run < ?1 AND status = 'done' "
                "AND name NOT IN (SELECT name FROM jobs WHERE run = ?1) "
                "ORDER BY name",
                (self._run(run),),
            ).fetchall()
        ]

    def latest_by_name(self) -> dict[str, dict[str, Any]]:
        """Each job name's row in the latest run that has one — ``{name: {run, key, kind,
        status}}`` — what the folder knows of a job, whichever slice ran it last."""
        cursor = self.db.execute(
            "SELECT j.name, j.run, j.key, j.kind, j.status FROM jobs j "
            "WHERE j.run = (SELECT MAX(run) FROM jobs WHERE name = j.name)"
        )
        return {
            name: {"run": run, "key": key, "kind": kind, "status": status}
            for name, run, key, kind, status in cursor.fetchall()
        }

    def progress_rows(self, run: int | None = None) -> dict[str, dict[str, Any]]:
        """``{job name: {step, total, metrics, first_step, first_time, updated}}`` of
        ``run`` (default: the latest): each job's latest progress event (:meth:`progress`)."""
        cursor = self.db.execute(
            "SELECT name, step, total, metrics, first_step, first_time, updated "
            "FROM progress WHERE run = ?",
            (self._run(run),),
        )
        out = {}
        for name, step, total, metrics, first_step, first_time, updated in cursor.fetchall():
            out[name] = {
                "step": step,
                "total": total,
                "metrics": self._json(metrics, f"job {name}'s progress", dict),
                "first_step": first_step,
                "first_time": first_time,
                "updated": updated,
            }
        return out

    def metrics(self, run: int | None = None) -> list[dict[str, Any]]:
        """Every metric row ``{job, name, kind, metric, value}`` of ``run`` (default: the
        latest run); ``job`` is the job's result key."""
        cursor = self.db.execute(
            "SELECT j.key, j.name, j.kind, m.metric, m.value FROM metrics m "
            "JOIN jobs j ON j.run = m.run AND j.name = m.name WHERE m.run = ? "
            "ORDER BY j.name, m.metric",
            (self._run(run),),
        )
        return [
            {"job": r[0], "name": r[1], "kind": r[2], "metric": r[3], "value": r[4]}
            for r in cursor.fetchall()
        ]

    def runs(self) -> list[dict[str, Any]]:
        """Every run's id, start time, experiment file (as run), overrides and environment."""
        return [
            {
                "id": r[0],
                "started": r[1],
                "experiment": r[2],
                "overrides": self._json(r[3], f"run {r[0]}'s overrides", dict),
                "environment": self._json(r[4], f"run {r[0]}'s environment", dict),
            }
            for r in self.db.execute(
                "SELECT id, started, experiment, overrides, environment FROM runs ORDER BY id"
            ).fetchall()
        ]

    def planned(self, run: int | None = None) -> dict[str, int] | None:
        """``{kind: jobs}`` that ``run`` (default: the latest) set out to run, whether or
        not they have entered the ledger yet; ``None`` for a run recorded without it."""
        row = self.db.execute(
            "SELECT value FROM info WHERE name = ?", (f"planned.{self._run(run)}",)
        ).fetchone()
        if row is None:
            return None
        planned = self._json(row[0], f"run {self._run(run)}'s planned jobs", dict)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in planned.values()):  # fmt: skip
            raise LedgerError(
                f"{self.path}: cannot read run {self._run(run)}'s planned jobs: not counts"
            )
        return planned

    def _json(self, text: str, what: str, kind: type) -> Any:
        """``text`` decoded, or a :class:`LedgerError` naming ``what`` in this ledger: a
        ledger edited or damaged by hand is an error that says so, not an internal one."""
        try:
            value = json.loads(text)
        except (TypeError, json.JSONDecodeError):
            value = None
        if not isinstance(value, kind):
            shape = "a JSON object" if kind is dict else f"JSON ({kind.__name__})"
            raise LedgerError(f"{self.path}: cannot read {what}: not {shape}")
        return value

    def summary(self, run: int | None = None) -> dict[str, dict[str, int]]:
        """``{kind: {status: count}}`` of ``run`` (default: the latest); reused results
        count as ``done`` and also under ``reused``."""
        out: dict[str, dict[str, int]] = {}
        for kind, status, reused, count in self.db.execute(
            "SELECT kind, status, reused, COUNT(*) FROM jobs WHERE run = ? "
            "GROUP BY kind, status, reused ORDER BY kind",
            (self._run(run),),
        ):
            counts = out.setdefault(kind, {**{s: 0 for s in STATUSES}, "reused": 0})
            counts[status] += count
            if reused:
                counts["reused"] += count
        return out

    # -- export --------------------------------------------------------------------------
    def export_csv(self, folder: str | Path) -> list[Path]:
        """Write the latest run's ``jobs.csv`` and ``metrics.csv`` into ``folder``."""
        from lmckit.files import atomic_write_bytes

        folder = Path(folder)
        written = []
        for name, rows in (("jobs", self.jobs()), ("metrics", self.metrics())):
            path = folder / f"{name}.csv"
            text = io.StringIO()
            fields = list(rows[0]) if rows else ["key"]
            writer = csv.DictWriter(text, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow(
                    {k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()}
                )
            atomic_write_bytes(path, text.getvalue().encode())
            written.append(path)
        return written

    def export_parquet(self, folder: str | Path) -> list[Path]:
        """Write the latest run's ``jobs.parquet`` and ``metrics.parquet`` (needs
        ``pyarrow``)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise LmcError("Parquet export needs pyarrow (pip install pyarrow)") from None
        from lmckit.files import atomic_path

        folder = Path(folder)
        written = []
        for name, rows in (("jobs", self.jobs()), ("metrics", self.metrics())):
            flat = [
                {k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()} for r in rows
            ]
            path = folder / f"{name}.parquet"
            with atomic_path(path) as tmp:
                pq.write_table(pa.Table.from_pylist(flat), tmp)
            written.append(path)
        return written


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
