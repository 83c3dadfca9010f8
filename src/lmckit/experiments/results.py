"""An experiment run's results as a small JSON file, and the numbers the docs quote from it.

``lmckit report OUT`` writes ``OUT/results.json`` beside ``OUT/report.html``: one row per
(step, group, grid cell, metric) of the report's metrics table, with the values of its
repetitions, their mean and sample standard deviation, and the experiment file's
``[[paper]]`` blocks. The reproduction pages keep a copy of each file in ``docs/results/``
and never type a run's number: they write a *placeholder*, which the site's build replaces
with the number from the file (``docs/hooks/results.py``), so a page cannot state what its
results file does not hold. The placeholder's grammar::

    {{ FILE: STEP METRIC [KEY=VALUE ...] ; FORMAT }}          a run's number
    {{ paper FILE: STEP METRIC [KEY=VALUE ...] ; FORMAT }}    a [[paper]] block's number
    {{ bench FILE: DOTTED.PATH ; FORMAT }}                     a benchmark result's number
    {{ FILE: STEP METRIC [KEY=VALUE ...] / STEP METRIC [KEY=VALUE ...] ; FORMAT }}
                                                               the ratio of two runs' means
    {{ FILE: job seconds name=PATTERN ; FORMAT }}              finished jobs' wall-clock seconds

``FILE`` names ``docs/results/FILE.json`` (runs), ``experiments/FILE.toml`` (paper) or
``benchmarks/results/FILE.json`` (benchmarks). ``KEY=VALUE`` selects on the row's group
(``method``, ``block``, ``n``, ``cell``) or its grid cell (a grid key by its last dotted
part, ``width_multiplier=0.25``; ``variant=NAME`` for a ``[[variant]]`` cell), and for a
paper block on any of its keys (``source`` by substring). Exactly one row must match.
A space in a metric's name is written ``_`` (``test.accuracy[part_a].start``).
``FORMAT`` is a Python format spec (``.3f``, ``+.2f``, ``.3g``) followed by any of: ``±``
(mean ± std), ``×100`` (an accuracy in % or points), ``n`` (the number of values instead
of the mean), ``min`` / ``max`` (the smallest / largest value instead of the mean: a range
over seeds, "0.50–0.55", for files that hold the values), ``change`` (for a ratio:
``a / b − 1``, with ``×100`` a relative change in %, as "L2 −15 %"). A ``job seconds``
placeholder reads the file's ``jobs`` list (every finished job's name, step and seconds, as
the report's job table shows them); ``PATTERN`` is a job's name or a shell-style pattern
(``merge/b0/*``) — several matches give their mean, ``min``, ``max``, ``n`` or ``sum``.
Negative numbers are written with a minus sign (U+2212), as the pages do. A page that shows
a placeholder rather than its number (documentation of this grammar) writes ``{{! … }}``:
it renders as ``{{ … }}``, unevaluated.

Files extracted from reports written before ``results.json`` existed
(:func:`results_from_report`) hold each row's exact mean and count, and its standard
deviation as the report printed it (four significant digits), not the values themselves.
"""

from __future__ import annotations

import fnmatch
import html
import json
import math
import re
import statistics
import tomllib
from collections.abc import Mapping, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from lmckit.errors import UsageError
from lmckit.options import checked

__all__ = [
    "ResultsError",
    "format_number",
    "jobs_from_report",
    "read_results",
    "render_placeholders",
    "results_document",
    "results_from_report",
    "select_jobs",
    "select_row",
]

FORMAT_VERSION = 1
PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
VARIANT_KEY = "variant.name"


class ResultsError(UsageError):
    """A results file that is not one, or a placeholder that names no single number."""


def results_document(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    paper: Sequence[Mapping[str, Any]] = (),
    jobs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The results file's content for a report: ``rows`` as
    :func:`lmckit.experiments.report.metric_groups` returns them, ``paper`` the experiment
    file's ``[[paper]]`` blocks, ``jobs`` the ledger's jobs (the finished ones are kept, with
    their step, seconds and whether the run reused them from the store)."""
    return {
        "format": FORMAT_VERSION,
        "name": name,
        "source": "report",
        "rows": [
            {
                "kind": r["kind"],
                "group": dict(r["group"]),
                "grid": dict(r["grid"]),
                "metric": r["metric"],
                "mean": r["mean"],
                "std": r["std"],
                "n": len(r["values"]),
                "values": list(r["values"]),
            }
            for r in rows
        ],
        "paper": [dict(p) for p in paper],
        "jobs": [
            {
                "name": j["name"],
                "kind": j["kind"],
                "seconds": j["seconds"],
                "reused": bool(j.get("reused")),
            }
            for j in jobs
            if j["status"] == "done" and j.get("seconds") is not None
        ],
    }


def dumps(document: Mapping[str, Any]) -> str:
    """A results document as JSON text, a row per line (small diffs when a run changes)."""
    head = {k: v for k, v in document.items() if k not in ("rows", "paper", "jobs")}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "rows": [']
    rows = [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in document["rows"]]
    lines.append(",\n".join(rows))
    lines.append('], "paper": ' + json.dumps(document.get("paper", []), ensure_ascii=False))
    if "jobs" in document:
        jobs = [json.dumps(j, ensure_ascii=False, sort_keys=True) for j in document["jobs"]]
        lines.append(', "jobs": [')
        lines.append(",\n".join(jobs))
        lines.append("]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def read_results(path: str | Path) -> dict[str, Any]:
    """A results file, checked: every row has a step, group, grid, metric, mean and count.

    Raises:
        ResultsError: the file is unreadable, not JSON, or not a results file.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ResultsError(f"cannot read the results file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path} is not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
        raise ResultsError(f"{path} is not a results file (no list of rows)")
    for i, row in enumerate(document["rows"]):
        missing = {"kind", "group", "grid", "metric", "mean", "n"} - set(row)
        if missing:
            raise ResultsError(f"{path}: row {i} lacks {', '.join(sorted(missing))}")
    jobs = document.get("jobs", [])
    if not isinstance(jobs, list) or not all(
        isinstance(j, dict)
        and isinstance(j.get("name"), str)
        and isinstance(j.get("seconds"), int | float)
        and not isinstance(j["seconds"], bool)
        for j in jobs
    ):
        raise ResultsError(f"{path}: 'jobs' is not a list of jobs with a name and seconds")
    return document


def _grid_matches(grid: Mapping[str, Any], key: str, value: str) -> bool | None:
    """Whether a grid cell has ``key=value`` (``None``: the cell has no such key)."""
    if key == "variant":
        return None if VARIANT_KEY not in grid else str(grid[VARIANT_KEY]) == value
    for k, v in grid.items():
        if k.rsplit(".", 1)[-1] == key or k == key:
            return _same(v, value)
    return None


def _same(actual: Any, wanted: str) -> bool:
    if isinstance(actual, bool):
        return str(actual).lower() == wanted.lower()
    if isinstance(actual, int | float):
        try:
            return math.isclose(float(actual), float(wanted), rel_tol=0, abs_tol=1e-12)
        except ValueError:
            return False
    return str(actual) == wanted


def _filters(words: Sequence[str], where: str) -> dict[str, str]:
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise ResultsError(f"{where}: {word!r} is not KEY=VALUE")
        out[key] = value
    return out


def select_row(
    document: Mapping[str, Any], kind: str, metric: str, filters: Mapping[str, str], where: str
) -> dict[str, Any]:
    """The one row of ``document`` with this step and metric whose group and grid cell
    have every ``filters`` entry.

    Raises:
        ResultsError: no row or several rows match (the message lists what would).
    """
    wanted = metric.replace(" ", "_")  # a placeholder writes a metric's spaces as "_"
    candidates = [
        r for r in document["rows"] if r["kind"] == kind and r["metric"].replace(" ", "_") == wanted
    ]
    if not candidates:
        metrics = sorted({r["metric"] for r in document["rows"] if r["kind"] == kind})
        raise ResultsError(
            f"{where}: no {kind!r} row has the metric {metric!r}"
            + (f" (its metrics: {', '.join(metrics[:12])}…)" if metrics else " (no such step)")
        )
    found = []
    for row in candidates:
        ok = True
        for key, value in filters.items():
            if key in row["group"]:
                ok = _same(row["group"][key], value)
            else:
                ok = bool(_grid_matches(row["grid"], key, value))
            if not ok:
                break
        if ok:
            found.append(row)
    if len(found) != 1:
        shown = "; ".join(_describe(r) for r in (found or candidates)[:6])
        what = "no row" if not found else f"{len(found)} rows"
        raise ResultsError(f"{where}: {what} match (candidates: {shown})")
    return found[0]


@checked
def select_jobs(document: Mapping[str, Any], pattern: str, where: str) -> dict[str, Any]:
    """The finished jobs of ``document`` whose name is ``pattern`` or matches it as a
    shell-style pattern, as a row: their seconds as ``values``, with mean, std and count.

    Raises:
        ResultsError: the file has no job list, or no job matches (some names are listed).
    """
    if not isinstance(document, Mapping):
        kind = type(document).__name__
        raise ResultsError(f"{where}: a results document is a mapping, got {kind}")
    if "jobs" not in document:
        raise ResultsError(
            f"{where}: this results file has no job list (written before results files "
            "kept one: rerun the report, or scripts/extract_report_results.py)"
        )
    jobs = document["jobs"]
    found = [j for j in jobs if j["name"] == pattern] or [
        j for j in jobs if fnmatch.fnmatchcase(j["name"], pattern)
    ]
    if not found:
        shown = ", ".join(j["name"] for j in jobs[:8])
        raise ResultsError(f"{where}: no finished job is named {pattern!r} (jobs: {shown}…)")
    values = [float(j["seconds"]) for j in found]
    mean = sum(values) / len(values)
    std = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": mean, "std": std, "n": len(values), "values": values}


def _describe(row: Mapping[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in row["group"].items()]
    parts += [
        f"variant={v}" if k == VARIANT_KEY else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in row["grid"].items()
    ]
    return " ".join(parts) or "(no group)"


FORMAT_SPEC = re.compile(r"^[+]?,?\.\d+[fge]$")


def format_number(
    mean: float | None,
    std: float | None,
    count: int | None,
    spec: str,
    where: str,
    values: Sequence[float] | None = None,
) -> str:
    """A number as a placeholder's ``FORMAT`` asks (see the module's docstring); ``values``
    are the numbers behind ``mean`` where the file holds them (for ``min``, ``max``,
    ``sum``)."""
    words = spec.split()
    flags = {w for w in words if w in ("±", "×100", "n", "change", "min", "max", "sum")}
    if "change" in flags:
        raise ResultsError(f"{where}: 'change' is for a ratio of two numbers ('A / B')")
    picks = flags & {"min", "max", "sum"}
    if len(picks) > 1 or (picks and flags & {"±", "n"}):
        raise ResultsError(f"{where}: {spec!r} asks for more than one number")
    if picks:
        if not values:
            raise ResultsError(
                f"{where}: '{next(iter(picks))}' needs the values behind the mean, and this "
                "file holds only the mean (extracted from a report: rerun it)"
            )
        mean = {"min": min, "max": max, "sum": sum}[picks.pop()](values)
    specs = [w for w in words if w not in flags]
    if len(specs) > 1 or (specs and not FORMAT_SPEC.match(specs[0])):
        raise ResultsError(f"{where}: {spec!r} is not a format (e.g. '.3f', '.1f ×100 ±')")
    if "n" in flags:
        if count is None:
            raise ResultsError(f"{where}: this number has no count")
        return str(count)
    if not specs:
        raise ResultsError(f"{where}: no format spec in {spec!r} (e.g. '.3f')")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        raise ResultsError(f"{where}: the number is missing (NaN or none) in its file")
    scale = 100.0 if "×100" in flags else 1.0
    text = _signed(format(scale * mean, specs[0]))
    if "±" in flags:
        if std is None:
            raise ResultsError(f"{where}: '±' asked for a single value (no spread)")
        text += " ± " + format(scale * std, specs[0].lstrip("+"))
    return text


def _signed(text: str) -> str:
    text = text.replace("-", "\u2212")
    # a mean that rounds to zero keeps no sign: −0.000 reads as a finding
    if re.fullmatch(r"[\u2212+]0(\.0*)?", text):
        return text[1:] if text[0] == "\u2212" else text
    return text


class _Sources:
    """The files placeholders read, each loaded once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[Path, Any] = {}
        self.used: set[Path] = set()

    def results(self, name: str) -> dict[str, Any]:
        return self._load(self.root / "docs" / "results" / f"{name}.json", read_results)

    def paper(self, name: str) -> list[dict[str, Any]]:
        def read(path: Path) -> list[dict[str, Any]]:
            try:
                return tomllib.loads(path.read_text()).get("paper", [])
            except OSError as exc:
                raise ResultsError(f"cannot read the experiment file {path}: {exc}") from None
            except tomllib.TOMLDecodeError as exc:
                raise ResultsError(f"{path} is not valid TOML ({exc})") from None

        return self._load(self.root / "experiments" / f"{name}.toml", read)

    def bench(self, name: str) -> Any:
        def read(path: Path) -> Any:
            try:
                return json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ResultsError(f"cannot read the benchmark result {path}: {exc}") from None

        return self._load(self.root / "benchmarks" / "results" / f"{name}.json", read)

    def _load(self, path: Path, reader):
        if path not in self.cache:
            if not path.is_file():
                raise ResultsError(f"{path.relative_to(self.root)} does not exist")
            self.cache[path] = reader(path)
        self.used.add(path)
        return self.cache[path]


def _evaluate(body: str, sources: _Sources, where: str) -> str:
    head, sep, spec = body.partition(";")
    if not sep:
        raise ResultsError(f"{where}: no '; FORMAT' in {{{{ {body} }}}}")
    name_part, colon, selector = head.partition(":")
    if not colon:
        raise ResultsError(f"{where}: no 'FILE:' in {{{{ {body} }}}}")
    names = name_part.split()
    words = selector.split()
    where = f"{where} {{{{ {body.strip()} }}}}"
    if len(names) == 2 and names[0] == "bench":
        if len(words) != 1:
            raise ResultsError(f"{where}: a benchmark number takes one dotted path")
        value: Any = sources.bench(names[1])
        for part in words[0].split("."):
            if isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            elif isinstance(value, dict) and part in value:
                value = value[part]
            else:
                raise ResultsError(f"{where}: no {part!r} at this point of the path")
        if isinstance(value, dict) and "mean" in value:
            runs = len(value.get("runs", [])) or None
            return format_number(value["mean"], value.get("std"), runs, spec, where)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ResultsError(f"{where}: the path names {type(value).__name__}, not a number")
        return format_number(float(value), None, None, spec, where)
    if "/" in words and len(names) == 1:  # the ratio of two runs' means
        cut = words.index("/")
        parts = [words[:cut], words[cut + 1 :]]
        if any(len(p) < 2 for p in parts):
            raise ResultsError(f"{where}: each side of '/' needs STEP and METRIC")
        document = sources.results(names[0])
        top, bottom = (
            select_row(document, p[0], p[1], _filters(p[2:], where), where)["mean"] for p in parts
        )
        if not bottom:
            raise ResultsError(f"{where}: the ratio's denominator is zero or missing")
        ratio = top / bottom
        flags = spec.split()
        if "change" in flags:
            ratio -= 1.0
            spec = " ".join(w for w in flags if w != "change")
        if "±" in spec.split() or "n" in spec.split():
            raise ResultsError(f"{where}: a ratio has no spread or count")
        return format_number(ratio, None, None, spec, where)
    if len(words) < 2:
        raise ResultsError(f"{where}: a run's number needs STEP and METRIC")
    kind, metric, filters = words[0], words[1], _filters(words[2:], where)
    if len(names) == 2 and names[0] == "paper":
        blocks = sources.paper(names[1])
        found = [
            p
            for p in blocks
            if p.get("step") == kind
            and p.get("metric") == metric
            and all(
                (value in str(p.get(key, ""))) if key == "source" else _same(p.get(key), value)
                for key, value in filters.items()
            )
        ]
        if len(found) != 1:
            raise ResultsError(
                f"{where}: {len(found)} [[paper]] blocks of experiments/{names[1]}.toml match"
                + ("; " + "; ".join(p.get("source", "?") for p in found[:6]) if found else "")
            )
        return format_number(found[0]["value"], found[0].get("std"), None, spec, where)
    if len(names) != 1:
        raise ResultsError(
            f"{where}: {name_part.strip()!r} is not FILE, 'paper FILE' or 'bench FILE'"
        )
    if kind == "job":
        if metric != "seconds" or set(filters) != {"name"}:
            raise ResultsError(f"{where}: a job's number is 'job seconds name=PATTERN'")
        row = select_jobs(sources.results(names[0]), filters["name"], where)
    else:
        row = select_row(sources.results(names[0]), kind, metric, filters, where)
    return format_number(row["mean"], row.get("std"), row["n"], spec, where, row.get("values"))


def render_placeholders(text: str, root: str | Path, where: str = "page") -> tuple[str, set[Path]]:
    """``text`` with every placeholder replaced by its number, and the files they read.

    Raises:
        ResultsError: a placeholder is malformed or names no single number; the message
            gives ``where`` and the placeholder.
    """
    sources = _Sources(Path(root))

    def replace(match: re.Match[str]) -> str:
        if match.group(1).startswith("!"):  # a placeholder shown, not evaluated (docs)
            return "{{ " + match.group(1)[1:].strip() + " }}"
        line = text.count("\n", 0, match.start()) + 1
        return _evaluate(match.group(1), sources, f"{where}:{line}")

    return PLACEHOLDER.sub(replace, text), sources.used


class _MetricRows(HTMLParser):
    """The metrics table of a report: each row's data attributes and cell texts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[tuple[dict[str, str], list[str]]] = []
        self._cells: list[str] | None = None
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            found = {k: v or "" for k, v in attrs}
            if "data-kind" in found:
                self.rows.append((found, []))
                self._cells = self.rows[-1][1]
        elif tag == "td" and self._cells is not None:
            self._cells.append("")
            self._in_cell = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_cell = False
        elif tag == "tr":
            self._cells = None

    def handle_data(self, data: str) -> None:
        if self._cells is not None and self._in_cell:
            self._cells[-1] += data


class _JobRows(HTMLParser):
    """The job table of a report (``<table class='jobs'>``): its header and each row's
    cell texts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self._inside = False
        self._cells: list[str] | None = None
        self._target: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._inside = ("class", "jobs") in attrs
        elif tag == "tr" and self._inside:
            self._cells = []
        elif tag in ("td", "th") and self._cells is not None:
            self._target = self.header if tag == "th" else self._cells
            self._target.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._target = None
        elif tag == "tr" and self._cells is not None:
            if self._cells:
                self.rows.append(self._cells)
            self._cells = None
        elif tag == "table":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._target is not None:
            self._target[-1] += data


@checked
def jobs_from_report(text: str) -> list[dict[str, Any]]:
    """The finished jobs of a report's job table: name, step, seconds and whether the run
    reused the job from the store (columns read from the table's header: older reports
    have no "result" column, and their jobs count as computed)."""
    parser = _JobRows()
    parser.feed(text)
    column = {name.strip(): i for i, name in enumerate(parser.header)}
    if not {"job", "step", "status", "seconds"} <= set(column):
        return []
    jobs = []
    for cells in parser.rows:
        if len(cells) != len(column) or cells[column["status"]].strip() != "done":
            continue
        try:
            seconds = float(cells[column["seconds"]].replace(",", "").strip())
        except ValueError:
            continue
        result = cells[column["result"]].strip() if "result" in column else ""
        jobs.append(
            {
                "name": cells[column["job"]].strip(),
                "kind": cells[column["step"]].strip(),
                "seconds": seconds,
                "reused": result.startswith("reused"),
            }
        )
    return jobs


NUMBER = r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)"


def _grid_from_label(label: str) -> dict[str, Any]:
    """A grid cell from the label a report prints (``key=value, …`` or a variant's name);
    keys come back as ``grid.KEY``, the variant as ``variant.name``."""
    grid: dict[str, Any] = {}
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(label):
        depth += 1 if ch in "[{(" else (-1 if ch in "]})" else 0)
        if depth == 0 and label.startswith(", ", i):
            parts.append(label[start:i])
            start = i + 2
    parts.append(label[start:])
    for part in (p.strip() for p in parts if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            grid[VARIANT_KEY] = part
            continue
        try:
            grid[f"grid.{key}"] = json.loads(value)
        except json.JSONDecodeError:
            grid[f"grid.{key}"] = value
    return grid


def _is_accuracy(metric: str) -> bool:
    return "accuracy" in metric and "ratio" not in metric


def _accuracy_scale(rows: list[tuple[dict[str, str], list[str]]], name: str) -> float:
    """How a report printed its accuracies: 100 where in percent (reports since the
    percent columns), 1 where as fractions (earlier ones) — read from the rows whose
    printed mean can be told from their exact data mean. A report that prints both ways
    is refused: its spreads could not be read back."""
    found: set[float] = set()
    for attrs, cells in rows:
        if not _is_accuracy(attrs.get("data-metric", "")) or "data-mean" not in attrs:
            continue
        mean = float(attrs["data-mean"])
        shown = re.match(NUMBER, cells[4].strip()) if len(cells) > 4 else None
        if shown is None or abs(mean) < 1e-4:
            continue
        printed = float(shown.group(0))
        for scale in (1.0, 100.0):
            if abs(printed - scale * mean) <= 5e-4 * abs(scale * mean):
                found.add(scale)
                break
    if len(found) > 1:
        raise ResultsError(f"{name}: the report prints accuracies both as fractions and in %")
    return found.pop() if found else 100.0


@checked
def results_from_report(text: str, name: str) -> dict[str, Any]:
    """A results document read back from a report's HTML (for reports written before
    ``results.json``): exact means and counts from the rows' data attributes, standard
    deviations from the printed table (four significant digits), paper blocks from the
    experiment file the report embeds.

    Raises:
        ResultsError: the page has no metrics table with data attributes.
    """
    parser = _MetricRows()
    parser.feed(text)
    if not parser.rows:
        raise ResultsError(f"{name}: no metrics rows with data attributes (not a report?)")
    rows = []
    accuracy_scale = _accuracy_scale(parser.rows, name)
    for attrs, cells in parser.rows:
        if len(cells) < 6:
            raise ResultsError(f"{name}: a metrics row has {len(cells)} cells, not 7")
        metric = attrs["data-metric"]
        scale = accuracy_scale if _is_accuracy(metric) else 1.0
        shown = cells[4]
        std = None
        if " ± " in shown:
            spread = re.match(NUMBER, shown.split(" ± ", 1)[1].strip())
            std = float(spread.group(0)) / scale if spread else None
        mean = float(attrs["data-mean"]) if "data-mean" in attrs else None
        rows.append(
            {
                "kind": attrs["data-kind"],
                "group": json.loads(html.unescape(attrs["data-group"])),
                "grid": _grid_from_label(cells[2]),
                "metric": metric,
                "mean": mean,
                "std": std,
                "n": int(attrs.get("data-count", cells[5]) or 0),
            }
        )
    paper: list[dict[str, Any]] = []
    embedded = re.search(r"<h2>Experiment file</h2>\s*<pre>(.*?)</pre>", text, re.DOTALL)
    if embedded:
        try:
            paper = tomllib.loads(html.unescape(embedded.group(1))).get("paper", [])
        except tomllib.TOMLDecodeError:
            paper = []
    return {
        "format": FORMAT_VERSION,
        "name": name,
        "source": "extracted from the report's metrics table (std at 4 significant digits)",
        "rows": rows,
        "paper": paper,
        "jobs": jobs_from_report(text),
    }


# A run's number as a page might type it: a decimal, a percentage, a ratio ("1.8×").
TYPED = re.compile(r"(?<![\w.=])[\u2212+-]?\d+\.\d+(?:\s?[×%])?|(?<![\w.])\d+\s?%")
TYPED_MARK = "<!-- typed -->"
LABEL_HEADERS = {
    "table / figure", "figure", "file", "setting", "our setting", "verdict", "file, report",
    "status", "needs", "rows", "paper rows", "estimated time", "lmckit's default",
    "paper recipe", "tested against", "paper's rule", "model", "method", "case", "recipe",
}  # fmt: skip


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def typed_numbers(markdown: str) -> list[tuple[int, str, str]]:
    """Numbers typed by hand in a page's result columns: ``(line, column header, literal)``.

    A table's result columns are all but its first (the row's label) and those whose header
    names a paper, a file, a setting or a verdict (:data:`LABEL_HEADERS`, or containing
    "paper"). In them a decimal, a percentage or a ratio outside a placeholder is a number
    typed by hand — unless the row carries ``<!-- typed -->`` (a row not generated yet,
    counted by the docs test). Code spans and the ``γ = 0.3`` of a setting are left alone.
    """
    found = []
    header: list[str] | None = None
    for number, line in enumerate(markdown.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if all(re.fullmatch(r":?-+:?", c) for c in cells) or TYPED_MARK in line:
            continue
        for title, cell in zip(header[1:], cells[1:], strict=False):
            if title in LABEL_HEADERS or "paper" in title:
                continue
            bare = PLACEHOLDER.sub(" ", re.sub(r"`[^`]*`", " ", cell))
            bare = re.sub(r"\[[^\]]*\]\([^)]*\)", " ", bare)  # a link's text and address
            bare = re.sub(r"=\s*[\u2212+-]?[\d.]+", "= ", bare)  # a setting: γ = 0.3
            found += [(number, title, m.group(0)) for m in TYPED.finditer(bare)]
    return found
