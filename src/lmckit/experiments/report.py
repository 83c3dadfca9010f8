"""``lmckit report OUT``: one self-contained HTML page for an experiment run, and its numbers
as ``OUT/results.json`` (:mod:`lmckit.experiments.results`: what the docs quote).

The page holds the experiment file, its figures (PNG, embedded), a table of every metric
the ledger records — mean ± standard deviation over the seeds or pairs of each group —,
the environment and versions of every run, and every job's status and time. It needs
nothing but the file itself to display.
"""

from __future__ import annotations

import html
import json
import math
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from lmckit.errors import OutputPathError, UsageError
from lmckit.experiments.ledger import Ledger, LedgerError
from lmckit.experiments.results import dumps, results_document
from lmckit.files import atomic_write_bytes, read_head, special_kind
from lmckit.plots.report import (
    analysis_figures,
    axis_figures,
    barrier_figures,
    cell_label,
    cosine_figures,
    curve_figures,
    job_labels,
    layerwise_figures,
    merge_figures,
    merge_geometry_figures,
    moment_figures,
    part_figures,
    rank_figures,
    spectra_figures,
    triplet_landscape_figures,
)
from lmckit.store import Store

__all__ = ["metric_groups", "write_report"]

# Which label keys tell jobs of a kind apart (the rest — seed, pair — are repetitions).
GROUP_BY = {
    "train": ("cell",),
    "match": ("cell", "method"),
    "curve": ("block", "cell", "method"),
    "merge": ("block", "cell", "method", "n"),
    "analysis": ("block", "cell", "method"),
    "triplet": ("block", "cell", "method"),
    "spectra": ("cell",),
}


NAIVE_COLOUR = "#555555"
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd",
)  # fmt: skip


def method_colours(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """One colour per method for every figure of a report: the naive path ("none") grey,
    the others in a fixed palette in sorted order (so a method keeps its colour from figure
    to figure, and two methods of one report never share one while the palette lasts)."""
    methods = sorted({str(r["group"]["method"]) for r in rows if "method" in r["group"]})
    colours = {"none": NAIVE_COLOUR}
    for i, method in enumerate(m for m in methods if m != "none"):
        colours[method] = PALETTE[i % len(PALETTE)]
    return colours


def metric_groups(jobs: Sequence[Mapping], metrics: Sequence[Mapping]) -> list[dict[str, Any]]:
    """Every (kind, group, metric) with the values of its repetitions, their mean and
    sample standard deviation (``None`` for a single value). A metric belongs to the job
    that recorded it (by name): two jobs may share a result key — Git Re-Basin's Alg. 2
    STE returning weight matching's permutation gives its curve WM's key — and each keeps
    its own method (by key, both curves were filed under one)."""
    done = [j for j in jobs if j["status"] == "done"]
    by_name = {j["name"]: j for j in done if "name" in j}
    by_key = {j["key"]: j for j in done}
    values: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for m in metrics:
        job = by_name.get(m["name"]) if "name" in m else by_key.get(m["job"])
        if job is None or m["value"] is None:
            continue
        labels = job_labels(job)
        group = {k: labels[k] for k in GROUP_BY.get(job["kind"], ()) if k in labels}
        grid = {k: v for k, v in labels.items() if "." in k}
        where = (json.dumps(group, sort_keys=True), json.dumps(grid, sort_keys=True))
        values[(job["kind"], *where, m["metric"])].append(float(m["value"]))
    rows = []
    for (kind, group, grid, metric), vals in sorted(values.items()):
        rows.append(
            {
                "kind": kind,
                "group": json.loads(group),
                "grid": json.loads(grid),
                "metric": metric,
                "values": vals,
                "mean": statistics.fmean(vals),
                "std": statistics.stdev(vals) if len(vals) > 1 else None,
            }
        )
    return rows


def _number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.4g}"


def _unit(metric: str) -> tuple[float, str]:
    """How the tables show a metric, as the figures do: accuracies in %, accuracy barriers
    and gaps in percentage points, everything else as it is."""
    if "accuracy" not in metric or "ratio" in metric:
        return 1.0, ""
    if any(w in metric for w in ("barrier", "gap", "drop", "diff")):
        return 100.0, " pp"
    return 100.0, " %"


def _paper_cell(r: Mapping[str, Any], paper: Sequence[Mapping[str, Any]]) -> str:
    found = [
        p
        for p in paper
        if p["step"] == r["kind"]
        and p["metric"] == r["metric"]
        and p.get("method", r["group"].get("method")) == r["group"].get("method")
        and p.get("block", r["group"].get("block")) == r["group"].get("block")
        and p.get("n", r["group"].get("n")) == r["group"].get("n")
    ]
    scale, unit = _unit(r["metric"])
    return "; ".join(
        f"{_number(scale * p['value'])}"
        f"{' ± ' + _number(scale * p['std']) if 'std' in p else ''}{unit} "
        f"({html.escape(p['source'])})"
        for p in found
    )


def _metrics_table(rows: list[dict[str, Any]], paper: Sequence[Mapping[str, Any]] = ()) -> str:
    lines = [
        "<table class='metrics'><thead><tr><th>step</th><th>group</th><th>grid cell</th>"
        "<th>metric</th><th>mean ± std</th><th>n</th><th>paper</th></tr></thead><tbody>"
    ]
    for r in rows:
        group = ", ".join(f"{k}={v}" for k, v in r["group"].items() if k != "cell")
        scale, unit = _unit(r["metric"])
        std = "" if r["std"] is None else f" ± {_number(scale * r['std'])}"
        lines.append(
            f"<tr data-kind='{html.escape(r['kind'])}' data-metric='{html.escape(r['metric'])}' "
            f"data-group='{html.escape(json.dumps(r['group'], sort_keys=True))}' "
            f"data-mean='{r['mean']!r}' data-count='{len(r['values'])}'>"
            f"<td>{html.escape(r['kind'])}</td><td>{html.escape(group)}</td>"
            f"<td>{html.escape(cell_label(r['grid']))}</td><td>{html.escape(r['metric'])}</td>"
            f"<td class='num'>{_number(scale * r['mean'])}{std}{unit}</td>"
            f"<td class='num'>{len(r['values'])}</td><td>{_paper_cell(r, paper)}</td></tr>"
        )
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _jobs_table(jobs: Sequence[Mapping]) -> str:
    lines = [
        "<table class='jobs'><thead><tr><th>job</th><th>step</th><th>status</th>"
        "<th>result</th><th>computed</th><th>attempts</th><th>seconds</th><th>host</th>"
        "</tr></thead><tbody>"
    ]
    for j in jobs:
        origin = "reused from the store" if j.get("reused") else "computed in this run"
        when = (
            datetime.fromtimestamp(j["finished"], UTC).strftime("%Y-%m-%d %H:%M")
            if j.get("finished") and j["status"] == "done"
            else ""
        )
        lines.append(
            f"<tr><td>{html.escape(j['name'])}</td><td>{j['kind']}</td>"
            f"<td class='{j['status']}'>{j['status']}</td>"
            f"<td>{origin if j['status'] == 'done' else ''}</td><td>{when}</td>"
            f"<td class='num'>{j['attempts']}</td>"
            f"<td class='num'>{_number(j['seconds'])}</td>"
            f"<td>{html.escape(j['host'] or '')}</td></tr>"
        )
    lines.append("</tbody></table>")
    return "\n".join(lines)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222;
       padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } .sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1.5rem; width: 100%;
        table-layout: auto; }
th, td { border-bottom: 1px solid #ddd; padding: 0.2rem 0.6rem; text-align: left;
         overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.failed { color: #b00; } td.done { color: #070; }
p.warn { color: #b00; }
figure { display: inline-block; margin: 0.5rem 1rem 1rem 0; max-width: 100%; }
figure img { max-width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; }
pre { background: #f6f6f6; padding: 0.8rem; white-space: pre-wrap; overflow-wrap: anywhere;
      font-size: 0.8rem; }
"""


GENERATOR = "<meta name='generator' content='lmckit report'>"


def write_report(out: str | Path) -> Path:
    """Write ``out/report.html`` for the experiment run in ``out``, and ``out/results.json``
    beside it (every row of its metrics table with the values behind it, and the experiment
    file's ``[[paper]]`` blocks); returns the report's path.

    Raises:
        UsageError: ``out`` holds no experiment run (no ledger).
    """
    out = Path(out)
    if not (out / "ledger.sqlite").is_file():
        raise UsageError(f"{out} holds no experiment run (no ledger.sqlite)")
    existing = out / "report.html"
    special = special_kind(existing)
    if special is not None:
        raise OutputPathError(f"{existing} is {special}, not a regular file; refusing to write it")
    results = out / "results.json"
    if (special := special_kind(results)) is not None:
        raise OutputPathError(f"{results} is {special}, not a regular file; refusing to write it")
    head = read_head(existing)  # never the whole of a large file
    ours = GENERATOR.encode() in head or b"lmckit report</title>" in head  # older reports
    if (existing.exists() or existing.is_symlink()) and not ours:
        raise OutputPathError(
            f"{existing} exists and is not a report lmckit wrote; refusing to overwrite it"
        )
    with Ledger(out / "ledger.sqlite", create=False) as ledger:
        jobs, metrics, runs = ledger.jobs(), ledger.metrics(), ledger.runs()
        planned = ledger.planned() if runs else None
        # a slice's report shows its own jobs; it says what earlier slices finished besides
        sliced = bool(runs and runs[-1]["environment"].get("only"))
        earlier = ledger.finished_elsewhere() if sliced else []
    # the file as the latest run ran it, from the ledger (OUT/experiment.toml is a copy)
    if runs:
        text, where = runs[-1]["experiment"], f"the experiment file {out}/ledger.sqlite records"
    else:
        toml = out / "experiment.toml"
        text, where = (toml.read_text() if toml.exists() else ""), str(toml)
    try:
        raw = tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError as exc:
        raise LedgerError(f"{where} is not valid TOML ({exc})") from None
    store = Store(out / "store")
    missing = [
        j["name"]
        for j in jobs
        if j["status"] == "done"
        and j["kind"] in ("curve", "spectra")
        and not (store.folder(j["kind"], j["key"]) / "meta.json").is_file()
    ]
    rows = metric_groups(jobs, metrics)
    colours = method_colours(rows)
    figures = (
        barrier_figures(rows, colours)
        + axis_figures(rows)
        + curve_figures(out, jobs, colours)
        + part_figures(out, jobs, colours)
        + merge_figures(rows, colours)
        + merge_geometry_figures(out, jobs, colours)
        + triplet_landscape_figures(out, jobs)
        + analysis_figures(rows, colours)
        + layerwise_figures(rows, colours)
        + cosine_figures(rows)
        + moment_figures(out, jobs)
        + spectra_figures(out, jobs)
        + rank_figures(rows)
    )
    counts: dict[str, int] = defaultdict(int)
    for j in jobs:
        counts[j["status"]] += 1
    reused = sum(1 for j in jobs if j.get("reused"))
    environment = runs[-1]["environment"] if runs else {}
    overrides = runs[-1]["overrides"] if runs else {}
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{GENERATOR}",
        f"<title>{html.escape(raw.get('name', 'experiment'))} — lmckit report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(raw.get('name', 'experiment'))}</h1>",
        f"<p class='sub'>{html.escape(raw.get('description', ''))}</p>",
        "<p>"
        + ", ".join(f"{n} job{'s' * (n != 1)} {s}" for s, n in sorted(counts.items()))
        + (f" ({reused} of them reused from the store)" if reused else "")
        + (
            f", {waiting} more of the run's plan not started (waiting for their inputs, "
            "or the run stopped first)"
            if planned is not None and (waiting := sum(planned.values()) - len(jobs)) > 0
            else ""
        )
        + f"; the latest of {len(runs)} run(s) into this folder"
        + (
            " — a slice: only the jobs matching "
            + html.escape(" ".join(environment["only"]))
            + " and their inputs"
            + (
                f" ({len(earlier)} job(s) finished by earlier runs are not in it: to report "
                "slices together, run once more with all their <code>--only</code> patterns, "
                "which reuses every job)"
                if earlier
                else ""
            )
            if environment.get("only")
            else ""
        )
        + (
            " — with overrides "
            + html.escape(", ".join(f"{k} = {v!r}" for k, v in overrides.items()))
            if overrides
            else ""
        )
        + "; report written "
        + datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        + (
            f"; expected run time: {html.escape(raw['expected_runtime'])}"
            if raw.get("expected_runtime")
            else ""
        )
        + "</p>",
        *(
            [
                f"<p class='warn'>{len(missing)} finished job(s) have no result in "
                f"{html.escape(str(out / 'store'))} (removed after the run?), so their "
                "figures are left out; <code>lmckit run</code> into this folder computes "
                "them again: " + html.escape(", ".join(missing)) + "</p>"
            ]
            if missing
            else []
        ),
        "<h2>Figures</h2>",
    ]
    for caption, data in figures:
        parts.append(
            f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    parts += [
        "<h2>Metrics</h2><p>Mean ± sample standard deviation over the seeds (training) or "
        "pairs of seeds (matching, curves) of each group; n is the number of values; "
        "the published number where the experiment file gives one.</p>",
        _metrics_table(rows, raw.get("paper", [])),
        "<h2>Experiment file</h2>",
        f"<pre>{html.escape(text)}</pre>",
        "<h2>Environment</h2><table>",
        *(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in environment.items()
        ),
        "</table>",
        "<h2>Jobs</h2>",
        _jobs_table(jobs),
        "</body></html>",
    ]
    document = results_document(raw.get("name", out.name), rows, raw.get("paper", []), jobs)
    atomic_write_bytes(out / "results.json", dumps(document).encode())
    path = out / "report.html"
    atomic_write_bytes(path, "\n".join(parts).encode())
    return path
