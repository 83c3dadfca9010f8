"""For each number typed by hand in a reproduction page's result columns, the rows of the
results files the row links (``NAME-report.html`` → ``docs/results/NAME.json``) whose mean
or spread prints as that number — the placeholders that could replace it. A helper for
converting a page; it writes nothing.

    python scripts/suggest_placeholders.py docs/reproductions.md [LINE ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from lmckit.experiments.results import read_results, typed_numbers

ROOT = Path(__file__).resolve().parents[1]


def _describe(row) -> str:
    words = [f"{k}={v}" for k, v in row["group"].items() if k != "cell"]
    words += [
        f"variant={v}" if k == "variant.name" else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in row["grid"].items()
    ]
    return f"{row['kind']} {row['metric']} {' '.join(words)}"


def main(argv: list[str]) -> int:
    page = Path(argv[0])
    wanted = {int(a) for a in argv[1:]}
    lines = page.read_text().splitlines()
    for number, column, literal in typed_numbers(page.read_text()):
        if wanted and number not in wanted:
            continue
        names = re.findall(r"([\w.-]+)-report\.html", lines[number - 1])
        value = literal.replace("\u2212", "-").rstrip("×% ").strip()
        decimals = len(value.split(".", 1)[1]) if "." in value else 0
        hits = []
        for name in dict.fromkeys(names):
            path = ROOT / "docs" / "results" / f"{name}.json"
            if not path.is_file():
                continue
            for row in read_results(path)["rows"]:
                for scale, flag in ((1.0, ""), (100.0, " ×100")):
                    for what, x in (("mean", row["mean"]), ("std", row.get("std"))):
                        if x is not None and f"{scale * x:.{decimals}f}" == value:
                            hits.append(f"{name}: {_describe(row)} ({what}{flag})")
        print(f"{number} [{column}] {literal}: " + ("; ".join(hits[:6]) or "—"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
