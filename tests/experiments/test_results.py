"""Results files: what ``lmckit report`` writes beside the report, what the docs quote."""

import json
import re
import statistics
from pathlib import Path

import pytest

from lmckit.experiments.report import write_report
from lmckit.experiments.results import (
    TYPED_MARK,
    ResultsError,
    format_number,
    jobs_from_report,
    read_results,
    render_placeholders,
    results_from_report,
    select_row,
    typed_numbers,
)
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.experiments.conftest import TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    run_experiment(load_experiment(TINY), out, log=lambda _: None)
    write_report(out)
    return out


def test_the_results_file_holds_the_ledger_s_values_and_the_report_s_rows(run):
    """Each row's mean and spread are those of its values (recomputed here), and reading
    the report's HTML back gives the same rows: the two files cannot disagree."""
    document = read_results(run / "results.json")
    assert document["rows"] and document["source"] == "report"
    for row in document["rows"]:
        assert row["n"] == len(row["values"])
        assert row["mean"] == pytest.approx(statistics.fmean(row["values"]), rel=1e-12)
        if row["n"] > 1:
            assert row["std"] == pytest.approx(statistics.stdev(row["values"]), rel=1e-12)
    back = results_from_report((run / "report.html").read_text(), "tiny")
    assert len(back["rows"]) == len(document["rows"])
    for a, b in zip(document["rows"], back["rows"], strict=True):
        assert (a["kind"], a["metric"], a["group"], a["n"]) == (
            b["kind"], b["metric"], b["group"], b["n"]
        )  # fmt: skip
        assert a["mean"] == b["mean"]  # the exact repr of the data attribute
        assert {k.rsplit(".", 1)[-1]: v for k, v in a["grid"].items()} == {
            k.rsplit(".", 1)[-1]: v for k, v in b["grid"].items()
        }
        if a["std"] is not None:
            assert b["std"] == pytest.approx(a["std"], rel=1e-3)  # printed at 4 digits


def test_a_curve_records_its_ends_its_least_loss_point_and_its_midpoint_calibration(run):
    """The curve step's record (and so the results file) holds every metric at λ = 0, at
    λ = 1 and at the λ of least loss, and the ECE at ½ — checked by hand on a curve, and
    present in the tiny run's results file for every curve."""
    from lmckit.evaluate.interpolation import Curve
    from lmckit.experiments.steps import _curve_points

    curve = Curve(
        lambdas=[0.0, 0.25, 0.5, 0.75, 1.0],
        splits={"test": {"loss": [0.5, 0.3, 0.4, 0.6, 0.7], "accuracy": [0.8, 0.9, 0.85, 0.7, 0.75],
                         "ece": [0.1, 0.02, 0.05, 0.2, 0.3], "accuracy[part a]": [1, 2, 3, 4, 5]}},
    )  # fmt: skip
    points = _curve_points(curve, "test")
    assert points["test.least_loss.lambda"] == 0.25
    assert points["test.loss.start"] == 0.5 and points["test.loss.end"] == 0.7
    assert points["test.accuracy.least_loss"] == 0.9 and points["test.ece.least_loss"] == 0.02
    assert points["test.accuracy[part a].end"] == 5 and points["test.ece.midpoint"] == 0.05
    document = read_results(run / "results.json")
    curves = {
        json.dumps(r["group"], sort_keys=True) for r in document["rows"] if r["kind"] == "curve"
    }
    for metric in ("test.loss.start", "test.ece.end", "test.accuracy.least_loss"):
        found = {json.dumps(r["group"], sort_keys=True) for r in document["rows"]
                 if r["kind"] == "curve" and r["metric"] == metric}  # fmt: skip
        assert found == curves, metric


def _report_row(metric: str, mean: float, shown: str) -> str:
    group = "{&quot;method&quot;: &quot;none&quot;}"
    return (
        f"<tr data-kind='curve' data-metric='{metric}' data-group='{group}' "
        f"data-mean='{mean}' data-count='3'><td>curve</td><td>method=none</td><td>w=1</td>"
        f"<td>{metric}</td><td class='num'>{shown}</td><td class='num'>3</td><td></td></tr>"
    )


@pytest.mark.parametrize(
    "shown, std",
    [("0.1786 ± 0.1045", 0.1045), ("17.86 ± 10.45", 0.1045)],
    ids=["fractions", "percent"],
)
def test_a_report_s_accuracy_spreads_are_read_in_the_unit_it_printed(shown, std):
    """Earlier reports printed accuracies as fractions (0.1786 ± 0.1045), later ones in %
    (17.86 ± 10.45): the spread read back is the same fraction either way, the unit told
    by the printed mean against the exact data mean (the fraction reports' spreads were
    divided by 100 before). A report printing both ways is refused."""
    rows = _report_row("test.accuracy.barrier", 0.178625, shown) + _report_row(
        "test.loss.barrier", 0.5, "0.5 ± 0.25"
    )
    back = results_from_report(f"<table>{rows}</table>", "old")
    by_metric = {r["metric"]: r["std"] for r in back["rows"]}
    assert by_metric["test.accuracy.barrier"] == pytest.approx(std)
    assert by_metric["test.loss.barrier"] == 0.25
    mixed = rows + _report_row("test.accuracy.midpoint", 0.6716, "67.16 ± 10.27" if
                               shown.startswith("0.") else "0.6716 ± 0.1027")  # fmt: skip
    with pytest.raises(ResultsError, match="both as fractions and in %"):
        results_from_report(f"<table>{mixed}</table>", "mixed")


def _doc():
    rows = [
        {"kind": "curve", "metric": "test.loss.barrier.rebasin", "group": {"method": m},
         "grid": {"model.width_multiplier": w}, "mean": mean, "std": std, "n": 3}
        for m, w, mean, std in [
            ("wm", 0.25, 0.19504, 0.0585), ("wm", 1, 0.0207, 0.0054), ("none", 1, -1.2547, None)
        ]
    ]  # fmt: skip
    return {"rows": rows}


def test_a_selector_names_one_row_or_fails_naming_the_candidates():
    doc = _doc()
    row = select_row(doc, "curve", "test.loss.barrier.rebasin", {"method": "wm",
                     "width_multiplier": "0.25"}, "t")  # fmt: skip
    assert row["mean"] == 0.19504
    with pytest.raises(ResultsError, match="2 rows match"):
        select_row(doc, "curve", "test.loss.barrier.rebasin", {"method": "wm"}, "t")
    with pytest.raises(ResultsError, match="no row match"):
        select_row(doc, "curve", "test.loss.barrier.rebasin", {"method": "ste"}, "t")
    with pytest.raises(ResultsError, match="no 'curve' row has the metric"):
        select_row(doc, "curve", "test.loss.midpoint", {}, "t")


def test_numbers_are_formatted_as_the_spec_says():
    assert format_number(0.19504, 0.0585, 3, ".3f ±", "t") == "0.195 ± 0.059"
    assert format_number(0.8925, 0.003, 3, ".1f ×100 ±", "t") == "89.2 ± 0.3"
    assert format_number(-1.2547, None, 3, ".2f", "t") == "\u22121.25"
    assert format_number(-0.0001, None, 3, ".3f", "t") == "0.000"  # no "−0.000"
    assert format_number(0.5, None, 7, "n", "t") == "7"
    assert format_number(2015.0, None, 1, ",.0f", "t") == "2,015"
    with pytest.raises(ResultsError, match="single value"):
        format_number(0.5, None, 1, ".3f ±", "t")
    with pytest.raises(ResultsError, match="not a format"):
        format_number(0.5, None, 1, "3 digits", "t")


def _tree(tmp_path, doc):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "w.json").write_text(json.dumps(doc))
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "w.toml").write_text(
        '[[paper]]\nstep = "curve"\nmetric = "m"\nvalue = 0.5\nstd = 0.1\nsource = "Fig. 4"\n'
    )
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "b.json").write_text(
        json.dumps({"a": {"speedup": 1.786, "t": {"mean": 0.27, "std": 0.06, "runs": [1, 2]}}})
    )
    return tmp_path


def test_a_page_renders_from_its_files_and_a_changed_file_changes_the_page(tmp_path):
    root = _tree(tmp_path, _doc())
    page = (
        "| x | ours |\n|---|---|\n"
        "| a | {{ w: curve test.loss.barrier.rebasin method=wm width_multiplier=1 ; .3f }} "
        "vs {{ paper w: curve m source=Fig ; .2f ± }}, {{ bench b: a.speedup ; .2f }}× "
        "({{ bench b: a.t ; .2f ± }}) |\n"
    )
    text, used = render_placeholders(page, root, "p")
    assert "| a | 0.021 vs 0.50 ± 0.10, 1.79× (0.27 ± 0.06) |" in text
    assert len(used) == 3
    doc = _doc()
    doc["rows"][1]["mean"] = 0.0333
    (root / "docs" / "results" / "w.json").write_text(json.dumps(doc))
    assert "| a | 0.033 vs" in render_placeholders(page, root, "p")[0]
    with pytest.raises(ResultsError, match=r"p:3 .*no row match"):
        render_placeholders(page.replace("method=wm", "method=ste"), root, "p")
    with pytest.raises(ResultsError, match="does not exist"):
        render_placeholders("{{ gone: curve m ; .3f }}", root, "p")


def test_a_ratio_of_two_runs_renders_from_their_means_and_a_relative_change(tmp_path):
    """``A / B``: the ratio of two rows' means (0.0207 / 0.19504 here), with ``change``
    its relative change (``×100``: in %), as the pages' "L2 −15 %" — computed by hand."""
    root = _tree(tmp_path, _doc())
    a = "curve test.loss.barrier.rebasin method=wm width_multiplier=1"
    b = "curve test.loss.barrier.rebasin method=wm width_multiplier=0.25"
    ratio = 0.0207 / 0.19504
    assert render_placeholders(f"{{{{ w: {a} / {b} ; .4f }}}}", root, "p")[0] == f"{ratio:.4f}"
    change = render_placeholders(f"{{{{ w: {a} / {b} ; +.1f ×100 change }}}}", root, "p")[0]
    assert change == f"{100 * (ratio - 1):+.1f}".replace("-", "\u2212")
    with pytest.raises(ResultsError, match="no spread"):
        render_placeholders(f"{{{{ w: {a} / {b} ; .3f ± }}}}", root, "p")
    with pytest.raises(ResultsError, match="for a ratio"):
        render_placeholders(f"{{{{ w: {a} ; .3f change }}}}", root, "p")
    with pytest.raises(ResultsError, match="each side"):
        render_placeholders(f"{{{{ w: {a} / curve ; .3f }}}}", root, "p")


def test_a_number_typed_in_a_result_column_is_found():
    page = (
        "| figure | paper | ours | our setting |\n|---|---|---|---|\n"
        "| Fig. 4 | 0.5 | {{ w: curve m ; .3f }}, R(γ = 0.3), 3×512, `0.1` | 5 epochs, 0.3 lr |\n"
        "| Fig. 5 | 0.5 | 0.123 and 15 % and 1.8× |\n"
        f"| Fig. 6 | 0.5 | 0.456 {TYPED_MARK} |\n"
    )
    found = typed_numbers(page)
    assert [(n, lit) for n, _, lit in found] == [(4, "0.123"), (4, "15 %"), (4, "1.8×")]


def test_every_reproduction_page_renders_and_types_no_number_outside_marked_rows():
    """The site's hook does the same at build time; here every placeholder of the pages
    resolves against the files in the repository, and no row is marked as typed by hand
    (``<!-- typed -->``, the hook's escape for a row not generated yet: the last 31 were
    converted on 2026-12-07)."""
    pages = [ROOT / "docs/reproductions.md", *sorted((ROOT / "docs/reproductions").glob("*.md"))]
    placeholders = 0
    for page in pages:
        text = page.read_text()
        assert typed_numbers(text) == [], page
        assert TYPED_MARK not in text, f"{page}: a row typed by hand"
        rendered, _ = render_placeholders(text, ROOT, str(page))
        assert "{{" not in rendered
        placeholders += len(re.findall(r"\{\{", text))
    assert placeholders >= 10


def test_editing_a_generated_number_by_hand_fails():
    lines = (ROOT / "docs" / "reproductions.md").read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if "{{ width-fmnist:" in x)
    top = at
    while not lines[top - 1].startswith("|---"):  # the row's own table header
        top -= 1
    header = "\n".join(lines[top - 2 : top]) + "\n"
    rendered, _ = render_placeholders(lines[at], ROOT, "reproductions.md")
    assert typed_numbers(header + rendered)  # the rendered row, pasted back, is caught


def test_a_metric_with_a_space_is_written_with_an_underscore(tmp_path):
    """``accuracy[part a]`` (a split's class group) cannot sit in a placeholder's words:
    it is written ``accuracy[part_a]`` and selects the same row."""
    doc = {"rows": [{"kind": "curve", "metric": "test.accuracy[part a].start", "group": {},
                     "grid": {}, "mean": 0.9283, "std": 0.0044, "n": 3}]}  # fmt: skip
    root = _tree(tmp_path, doc)
    text = "{{ w: curve test.accuracy[part_a].start ; .1f ×100 ± }}"
    assert render_placeholders(text, root, "p")[0] == "92.8 ± 0.4"


def test_the_results_file_lists_the_run_s_jobs_with_their_seconds(run):
    """Every finished job of the ledger, with its seconds, in the file and read back alike
    from the report's job table (printed at 4 significant digits)."""
    from lmckit.experiments.ledger import Ledger

    with Ledger(run / "ledger.sqlite", create=False) as ledger:
        done = {j["name"]: j["seconds"] for j in ledger.jobs() if j["status"] == "done"}
    document = read_results(run / "results.json")
    assert {j["name"]: j["seconds"] for j in document["jobs"]} == done
    back = jobs_from_report((run / "report.html").read_text())
    assert [j["name"] for j in back] == [j["name"] for j in document["jobs"]]
    for a, b in zip(document["jobs"], back, strict=True):
        assert b["seconds"] == pytest.approx(a["seconds"], rel=1e-3)
        assert (a["kind"], a["reused"]) == (b["kind"], b["reused"])


def test_an_older_report_s_job_table_is_read_by_its_header():
    """Reports before the "result" column: the seconds are the fifth cell, not the seventh;
    a job that is not done is left out."""
    text = (
        "<table class='jobs'><thead><tr><th>job</th><th>step</th><th>status</th>"
        "<th>attempts</th><th>seconds</th><th>host</th></tr></thead><tbody>"
        "<tr><td>train/c0/seed0</td><td>train</td><td class='done'>done</td>"
        "<td class='num'>2</td><td class='num'>172.5</td><td>vm</td></tr>"
        "<tr><td>train/c0/seed1</td><td>train</td><td class='failed'>failed</td>"
        "<td class='num'>1</td><td class='num'>3.1</td><td>vm</td></tr></tbody></table>"
    )
    assert jobs_from_report(text) == [
        {"name": "train/c0/seed0", "kind": "train", "seconds": 172.5, "reused": False}
    ]


def test_job_seconds_render_one_job_or_a_pattern_s_range(tmp_path):
    """``job seconds name=…``: one job's seconds, or over a pattern's jobs their mean, min,
    max, sum and count — checked against the numbers by hand."""
    doc = _doc()
    doc["jobs"] = [
        {"name": "merge/b0/c0/ste-mm/n2", "kind": "merge", "seconds": 735.6, "reused": False},
        {"name": "merge/b0/c0/ste-mm/n2/s1", "kind": "merge", "seconds": 919.6, "reused": False},
        {"name": "merge/b1/c0/ste-mm/n2", "kind": "merge", "seconds": 134.2, "reused": False},
        {"name": "train/c0/seed0", "kind": "train", "seconds": 172.0, "reused": False},
    ]
    root = _tree(tmp_path, doc)

    def show(body: str) -> str:
        return render_placeholders("{{ w: " + body + " }}", root, "p")[0]

    assert show("job seconds name=merge/b0/c0/ste-mm/n2 ; .0f") == "736"  # exact name first
    assert show("job seconds name=merge/b0/* ; .0f") == f"{(735.6 + 919.6) / 2:.0f}"
    assert show("job seconds name=merge/* ; .1f min") == "134.2"
    assert show("job seconds name=merge/* ; .1f max") == "919.6"
    assert show("job seconds name=merge/* ; .1f sum") == f"{735.6 + 919.6 + 134.2:.1f}"
    assert show("job seconds name=merge/* ; n") == "3"
    with pytest.raises(ResultsError, match="no finished job is named"):
        show("job seconds name=curve/* ; .0f")
    with pytest.raises(ResultsError, match="job seconds name=PATTERN"):
        show("job minutes name=merge/* ; .0f")
    with pytest.raises(ResultsError, match="more than one number"):
        show("job seconds name=merge/* ; .0f min max")
    del doc["jobs"]
    (root / "docs" / "results" / "w.json").write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="no job list"):
        show("job seconds name=merge/* ; .0f")


def test_min_and_max_need_the_values_behind_a_mean(tmp_path):
    doc = _doc()
    doc["rows"][0]["values"] = [0.12, 0.25, 0.21542]
    root = _tree(tmp_path, doc)
    row = "curve test.loss.barrier.rebasin method=wm width_multiplier=0.25"
    shown = render_placeholders(f"{{{{ w: {row} ; .3f min }}}}–{{{{ w: {row} ; .3f max }}}}",
                                root, "p")[0]  # fmt: skip
    assert shown == "0.120–0.250"
    other = "curve test.loss.barrier.rebasin method=wm width_multiplier=1"
    with pytest.raises(ResultsError, match="holds only the mean"):
        render_placeholders(f"{{{{ w: {other} ; .3f max }}}}", root, "p")


def test_a_placeholder_marked_with_a_bang_is_shown_not_evaluated(tmp_path):
    """Documentation of the grammar shows placeholders: ``{{! … }}`` renders as ``{{ … }}``
    and names no file, while the same text without the mark must name a real one."""
    root = _tree(tmp_path, _doc())
    shown = "write `{{! NAME: merge merged_loss n=5 ; .3f ± }}` on a page"
    assert render_placeholders(shown, root, "p")[0] == (
        "write `{{ NAME: merge merged_loss n=5 ; .3f ± }}` on a page"
    )
    with pytest.raises(ResultsError, match="does not exist"):
        render_placeholders(shown.replace("{{!", "{{"), root, "p")
