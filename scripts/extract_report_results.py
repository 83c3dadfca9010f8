"""Write ``docs/results/NAME.json`` for every ``docs/NAME-report.html`` the reproduction and
study pages link: the results file of a report written before ``lmckit report`` wrote
``results.json`` (exact means and counts from the table's data attributes, spreads as
printed, the finished jobs' seconds from its job table). A report rerun since replaces its
file with the run's own ``results.json``; such a file written before results files kept
their jobs gets the job table's list added, its rows untouched.

    python scripts/extract_report_results.py [NAME ...]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lmckit.experiments.results import dumps, jobs_from_report, results_from_report

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["reproductions.md", "reproductions/*.md"]


def linked_reports() -> list[str]:
    names: set[str] = set()
    for pattern in PAGES:
        for page in (ROOT / "docs").glob(pattern):
            names |= set(re.findall(r"([\w.-]+)-report\.html", page.read_text()))
    return sorted(n for n in names if (ROOT / "docs" / f"{n}-report.html").is_file())


def main(argv: list[str]) -> int:
    names = argv or linked_reports()
    missing = [n for n in names if not (ROOT / "docs" / f"{n}-report.html").is_file()]
    if missing:
        print(f"no report docs/NAME-report.html for {', '.join(missing)}", file=sys.stderr)
        return 2
    for name in names:
        report = ROOT / "docs" / f"{name}-report.html"
        document = results_from_report(report.read_text(), name)
        target = ROOT / "docs" / "results" / f"{name}.json"
        existing = target.read_text() if target.is_file() else ""
        if existing and '"source": "report"' in existing.splitlines()[0]:
            kept = json.loads(existing)
            if "jobs" not in kept:
                kept["jobs"] = jobs_from_report(report.read_text())
                target.write_text(dumps(kept))
                print(f"{name}: kept (written by lmckit report), {len(kept['jobs'])} jobs added")
            else:
                print(f"{name}: kept (written by lmckit report)")
            continue
        target.write_text(dumps(document))
        print(f"{name}: {len(document['rows'])} rows, {target.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
