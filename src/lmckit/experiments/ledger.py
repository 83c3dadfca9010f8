"""The job ledger of an experiment run: SQLite, written only by the driver process.

One row per job — its key (the result store's key of its artifact), step kind, job name,
settings, status (``pending``/``running``/``done``/``failed``), attempts, start and end
time, host and error text — and a long-format metrics table ``(job, metric, value)``.
WAL mode lets readers (``lmckit status``, ``lmckit report``) look while a run writes.
"""

from __future__ import annotations

import csv
import json
import socket
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmckit.errors import LmcError

__all__ = ["STATUSES", "Ledger"]

STATUSES = ("pending", "running", "done", "failed")
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    settings TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    started REAL,
    finished REAL,
    seconds REAL,
    host TEXT,
    error TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (job, metric)
);
CREATE TABLE IF NOT EXISTS runs (
    started REAL NOT NULL,
    experiment TEXT NOT NULL,
    environment TEXT NOT NULL
);
"""


class Ledger:
    """The ledger at ``path`` (created if missing)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LmcError(f"{self.path} is not a readable job ledger: {exc}") from None

    def close(self) -> None:
        """Close the database connection."""
        self.db.close()

    # -- writes (the driver only) --------------------------------------------------------
    def start_run(self, experiment: str, environment: Mapping[str, Any]) -> None:
        """Record that a run started, with its experiment file and environment; jobs a
        killed run left ``running`` go back to ``pending``."""
        self.db.execute(
            "INSERT INTO runs VALUES (?, ?, ?)", (time.time(), experiment, json.dumps(environment))
        )
        self.db.execute("UPDATE jobs SET status = 'pending' WHERE status = 'running'")

    def ensure(self, key: str, kind: str, name: str, settings: Mapping[str, Any]) -> None:
        """A row for the job (``pending`` unless it is already known)."""
        self.db.execute(
            "INSERT OR IGNORE INTO jobs (key, kind, name, settings, status) VALUES (?, ?, ?, ?, ?)",
            (key, kind, name, json.dumps(settings, sort_keys=True), "pending"),
        )

    def started(self, key: str) -> None:
        """The job is running (one more attempt)."""
        self.db.execute(
            "UPDATE jobs SET status = 'running', attempts = attempts + 1, started = ?, "
            "finished = NULL, host = ?, error = NULL WHERE key = ?",
            (time.time(), socket.gethostname(), key),
        )

    def done(self, key: str, metrics: Mapping[str, float], seconds: float | None) -> None:
        """The job's artifact is stored; its metrics replace any earlier ones."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "UPDATE jobs SET status = 'done', finished = ?, seconds = ?, error = NULL "
                "WHERE key = ?",
                (time.time(), seconds, key),
            )
            self.db.execute("DELETE FROM metrics WHERE job = ?", (key,))
            self.db.executemany(
                "INSERT INTO metrics VALUES (?, ?, ?)",
                [(key, name, _number(value)) for name, value in sorted(metrics.items())],
            )

    def failed(self, key: str, error: str) -> None:
        """The job raised; ``error`` is its traceback."""
        self.db.execute(
            "UPDATE jobs SET status = 'failed', finished = ?, error = ? WHERE key = ?",
            (time.time(), error, key),
        )

    # -- reads ---------------------------------------------------------------------------
    def status(self, key: str) -> str | None:
        """The job's status, or ``None`` for a job the ledger has not seen."""
        row = self.db.execute("SELECT status FROM jobs WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def jobs(self) -> list[dict[str, Any]]:
        """Every job row, by name."""
        cursor = self.db.execute("SELECT * FROM jobs ORDER BY name")
        names = [c[0] for c in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:
            row["settings"] = json.loads(row["settings"])
        return rows

    def metrics(self) -> list[dict[str, Any]]:
        """Every metric row ``{job, name, kind, metric, value}``."""
        cursor = self.db.execute(
            "SELECT m.job, j.name, j.kind, m.metric, m.value FROM metrics m "
            "JOIN jobs j ON j.key = m.job ORDER BY j.name, m.metric"
        )
        return [
            {"job": r[0], "name": r[1], "kind": r[2], "metric": r[3], "value": r[4]}
            for r in cursor.fetchall()
        ]

    def runs(self) -> list[dict[str, Any]]:
        """Every run's start time, experiment file and environment."""
        return [
            {"started": r[0], "experiment": r[1], "environment": json.loads(r[2])}
            for r in self.db.execute("SELECT * FROM runs ORDER BY started").fetchall()
        ]

    def summary(self) -> dict[str, dict[str, int]]:
        """``{kind: {status: count}}``."""
        out: dict[str, dict[str, int]] = {}
        for kind, status, count in self.db.execute(
            "SELECT kind, status, COUNT(*) FROM jobs GROUP BY kind, status ORDER BY kind"
        ):
            out.setdefault(kind, {s: 0 for s in STATUSES})[status] = count
        return out

    # -- export --------------------------------------------------------------------------
    def export_csv(self, folder: str | Path) -> list[Path]:
        """Write ``jobs.csv`` and ``metrics.csv`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name, rows in (("jobs", self.jobs()), ("metrics", self.metrics())):
            path = folder / f"{name}.csv"
            with open(path, "w", newline="") as fh:
                fields = list(rows[0]) if rows else ["key"]
                writer = csv.DictWriter(fh, fieldnames=fields)
                writer.writeheader()
                for row in rows:
                    writer.writerow(
                        {k: json.dumps(v) if isinstance(v, dict) else v for k, v in row.items()}
                    )
            written.append(path)
        return written

    def export_parquet(self, folder: str | Path) -> list[Path]:
        """Write ``jobs.parquet`` and ``metrics.parquet`` (needs ``pyarrow``)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise LmcError("Parquet export needs pyarrow (pip install pyarrow)") from None
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name, rows in (("jobs", self.jobs()), ("metrics", self.metrics())):
            flat = [
                {k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()} for r in rows
            ]
            path = folder / f"{name}.parquet"
            pq.write_table(pa.Table.from_pylist(flat), path)
            written.append(path)
        return written


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
