"""MkDocs hook: the numbers of runs and benchmarks on the pages, from their results files.

Every ``{{ … }}`` placeholder of a page is replaced by the number it names
(:mod:`lmckit.experiments.results` has the grammar): a run's from ``docs/results/``, a
paper's from an experiment file's ``[[paper]]`` blocks, a benchmark's from
``benchmarks/results/``. A placeholder that names no single number fails the build, and so
does a number typed by hand in a result column of a reproduction page (a row not yet
generated says so with ``<!-- typed -->``).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError

from lmckit.experiments.results import ResultsError, render_placeholders, typed_numbers

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("reproductions.md", "reproductions/")


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = f"docs/{page.file.src_uri}"
    if page.file.src_uri.startswith(CHECKED):
        typed = typed_numbers(markdown)
        if typed:
            shown = "; ".join(f"line {n} ({col}): {lit!r}" for n, col, lit in typed[:8])
            raise PluginError(
                f"{where} types {len(typed)} run number(s) by hand instead of a placeholder "
                f"({{{{ FILE: STEP METRIC … ; FORMAT }}}}): {shown}"
            )
    try:
        rendered, _ = render_placeholders(markdown, ROOT, where)
    except ResultsError as exc:
        raise PluginError(str(exc)) from None
    return rendered
