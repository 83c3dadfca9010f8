"""The HTML report, loaded in a real headless browser (Debian's chromium via Playwright)."""

import html
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from lmckit.experiments.ledger import Ledger
from lmckit.experiments.report import _unit, write_report
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.experiments.conftest import TINY

CHROMIUM = shutil.which("chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run_experiment(load_experiment(TINY), out, log=lambda _: None)
    return out


def test_the_report_is_written_from_the_ledger(run):
    path = write_report(run)
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>") and "data:image/png;base64," in text
    assert "http://" not in text and "https://" not in text  # self-contained
    assert html.escape(TINY.read_text()) in text  # the experiment file is embedded


def test_the_job_counts_read_as_english(run, tmp_path):
    """A run with one job still going read "1 jobs running"."""
    import sqlite3

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    with sqlite3.connect(copy / "ledger.sqlite") as db:
        total = db.execute("select count(*) from jobs").fetchone()[0]
        db.execute(
            "update jobs set status = 'running', finished = null "
            "where rowid = (select min(rowid) from jobs)"
        )
    text = write_report(copy).read_text()
    assert f"{total - 1} jobs done" in text and "1 job running" in text


def test_a_curve_changed_in_the_store_fails_the_report_instead_of_being_drawn(
    run, tmp_path, capsys
):
    """The report draws the curves from their stored files: one edited after it was stored
    (a plausible number, valid JSON) was drawn as if computed, and one cut short stopped the
    report with an internal error."""
    from lmckit.cli import main
    from lmckit.store import StoreError

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    curve = next((copy / "store" / "curve").rglob("curve.json"))
    data = json.loads(curve.read_text())
    metric = next(iter(data["splits"]["test"]))
    data["splits"]["test"][metric] = [0.5 for _ in data["splits"]["test"][metric]]
    curve.write_text(json.dumps(data))
    with pytest.raises(StoreError, match=r"curve\.json is missing or damaged"):
        write_report(copy)
    curve.write_text("cut sh")
    assert main(["report", str(copy)]) == 1
    err = capsys.readouterr().err
    assert "curve.json is missing or damaged" in err and "internal error" not in err


def test_the_report_reads_the_file_as_run_from_the_ledger_and_names_removed_results(run, tmp_path):
    import sqlite3

    from lmckit.experiments.ledger import LedgerError

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "report.html").unlink(missing_ok=True)
    (copy / "experiment.toml").write_text("not = [toml\n")  # edited after the run
    removed = sorted(p.parent.name for p in (copy / "store" / "curve").rglob("meta.json"))[:2]
    for key in removed:
        shutil.rmtree(copy / "store" / "curve" / key[:2] / key)
    text = write_report(copy).read_text()
    assert html.escape(TINY.read_text()) in text  # the file as run, not the edited copy
    ledger = Ledger(copy / "ledger.sqlite", create=False)
    names = sorted(j["name"] for j in ledger.jobs() if j["key"] in removed)
    ledger.close()
    assert len(names) >= 2
    warning = text.split("<p class='warn'>")[1].split("</p>")[0]
    assert warning.startswith(f"{len(names)} finished job(s) have no result in")
    assert warning.endswith(", ".join(names))
    db = sqlite3.connect(copy / "ledger.sqlite")
    db.execute("UPDATE runs SET experiment = 'name = [unclosed'")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=r"ledger\.sqlite records is not valid TOML"):
        write_report(copy)


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/install-browser.sh)"
)
def test_the_report_renders_in_chromium_with_the_ledgers_numbers(run, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    path = write_report(run)
    ledger = Ledger(run / "ledger.sqlite")
    jobs = {j["key"]: j for j in ledger.jobs()}
    metrics = ledger.metrics()
    ledger.close()
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(Path(path).resolve().as_uri())
        images = page.evaluate(
            "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
        )
        rows = page.evaluate(
            "Array.from(document.querySelectorAll('table.metrics tbody tr')).map(r => ({"
            "kind: r.dataset.kind, metric: r.dataset.metric, group: r.dataset.group, "
            "mean: Number(r.dataset.mean), count: Number(r.dataset.count), "
            "shown: r.children[4].textContent}))"
        )
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        captions = page.evaluate(
            "Array.from(document.querySelectorAll('figcaption')).map(c => c.textContent)"
        )
        page.screenshot(path=str(tmp_path / "report.png"))
        browser.close()
    assert overflow <= 0  # no horizontal scrolling at 1400 px
    assert captions and not [c for c in captions if "—" in c]  # no placeholder cells
    assert problems == []
    assert len(images) >= 4 and all(ok and w > 0 and h > 0 for ok, w, h in images)
    # every (group, metric) the page shows is the mean of the ledger's values for it
    values = {}
    for m in metrics:
        labels = jobs[m["job"]]["settings"]["labels"]
        if m["kind"] == "curve":
            group = {k: labels[k] for k in ("block", "cell", "method")}
            values.setdefault((m["metric"], json.dumps(group, sort_keys=True)), []).append(
                m["value"]
            )
    checked = 0
    for row in rows:
        if row["kind"] != "curve":
            continue
        expected = values[(row["metric"], row["group"])]
        assert row["count"] == len(expected) == 3
        assert row["mean"] == pytest.approx(statistics.fmean(expected), rel=1e-12)
        scale, _ = _unit(row["metric"])  # accuracies in % or points, as the figures
        assert row["shown"].startswith(f"{scale * statistics.fmean(expected):.4g} ± ")
        checked += 1
    assert checked == len(values) > 0
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_one_colour_per_method_and_one_unit_per_quantity():
    from lmckit.experiments.report import NAIVE_COLOUR, method_colours

    rows = [{"group": {"method": m}} for m in ("wm-fast", "none", "ste", "am", "ste")]
    colours = method_colours(rows)
    assert colours["none"] == NAIVE_COLOUR
    assert len({colours[m] for m in ("wm-fast", "ste", "am", "none")}) == 4
    assert method_colours(rows[::-1]) == colours  # the same whatever order rows come in
    assert _unit("test.accuracy.midpoint") == (100.0, " %")
    assert _unit("test.accuracy.barrier.rebasin") == (100.0, " pp")
    assert _unit("test.loss.barrier.rebasin") == (1.0, "")


def test_a_paper_number_with_a_block_sits_beside_that_blocks_row_only():
    """Two compare blocks run the same method with different options (the paper's variant
    and lmckit's): the published number belongs to one of them."""
    from lmckit.experiments.report import _paper_cell

    paper = [{"step": "curve", "method": "sinkhorn", "metric": "m", "value": 0.5, "source": "T1",
              "block": 0}]  # fmt: skip
    row = {"kind": "curve", "metric": "m", "group": {"block": 0, "method": "sinkhorn"}}
    other = {**row, "group": {"block": 1, "method": "sinkhorn"}}
    assert "0.5 (T1)" in _paper_cell(row, paper)
    assert _paper_cell(other, paper) == ""
    unblocked = [{k: v for k, v in paper[0].items() if k != "block"}]
    assert _paper_cell(other, unblocked) == _paper_cell(row, unblocked) != ""


def test_a_paper_number_for_n_models_sits_beside_that_merge_size_only():
    """Table 2's merge of five: its number beside the n = 5 merge, not the n = 32 one."""
    from lmckit.experiments.report import _paper_cell

    paper = [{"step": "merge", "method": "merge-many", "metric": "merged_loss", "n": 5,
              "value": 0.0727, "source": "Table 2"}]  # fmt: skip
    five = {"kind": "merge", "metric": "merged_loss",
            "group": {"block": 0, "method": "merge-many", "n": 5}}  # fmt: skip
    many = {**five, "group": {**five["group"], "n": 32}}
    assert "0.0727 (Table 2)" in _paper_cell(five, paper)
    assert _paper_cell(many, paper) == ""


def test_a_two_key_grid_is_drawn_against_one_key_with_a_line_per_value_of_the_other():
    """Grid values in numeric order (10 after 9, which text order reverses), each line's
    points the rows of its own value of the other key; one varying key draws nothing."""
    from lmckit.plots.report import axis_lines, grid_axes

    def row(width, decay, mean, cell=0):
        grid = {"model.width": width, "train.weight_decay": decay, "data.name": "x"}
        return {"grid": grid, "mean": mean, "std": 0.1, "group": {"cell": cell}}

    rows = [row(w, d, 10 * w + d) for w in (2, 1) for d in (10, 9, 0.5)]
    assert grid_axes(rows) == ("train.weight_decay", ["model.width"])  # 3 values beat 2
    assert grid_axes([r for r in rows if r["grid"]["model.width"] == 1]) is None
    xs, lines = axis_lines(rows, "train.weight_decay", ["model.width"])
    assert xs == [0.5, 9, 10]
    assert list(lines) == ["width=1", "width=2"]
    for label, points in lines.items():
        width = int(label.split("=")[1])
        assert [(i, r["mean"]) for i, r in points] == [(0, 10 * width + 0.5), (1, 10 * width + 9),
                                                       (2, 10 * width + 10)]  # fmt: skip
    tie = [row(w, d, 0.0) for w in (1, 2) for d in (3, 4)]
    assert grid_axes(tie) == ("train.weight_decay", ["model.width"])  # the later key on a tie
    # names (variants) keep the file's order: that of the first cell holding each
    named = [row(w, name, 0.0, cell) for cell, (name, w) in enumerate(
        [("plain", 1), ("BatchNorm", 1), ("plain", 2), ("skip", 2), ("BatchNorm", 2)])]  # fmt: skip
    assert axis_lines(named, "train.weight_decay", ["model.width"])[0] == [
        "plain", "BatchNorm", "skip"]  # fmt: skip


def test_the_report_of_a_two_key_grid_plots_the_ledgers_means_against_the_longer_key(
    tmp_path, monkeypatch
):
    """An experiment over width × weight decay (the width study's F.9): its report holds a
    figure of the barriers against the weight decay, one line per width, whose points are
    the ledger's per-cell means over pairs in the decay's numeric order."""
    from lmckit.experiments import report

    out = _run_digits(
        tmp_path,
        2,
        '[grid]\n"model.hidden" = [[8, 8], [16, 16]]\n'
        '"train.weight_decay" = [0.01, 0.0, 0.001]\n'
        '[[compare]]\npairs = "all"\nmethods = ["none"]\nlambdas = 3\n',
    )
    figures = _drawn_figures(out, monkeypatch)
    caption = "barriers against weight_decay, one line per hidden: compare block 0, naive"
    fig = next(f for c, f in figures.items() if c.startswith(caption))
    panel = next(ax for ax in fig.axes if ax.get_title() == "test loss barrier")
    assert [t.get_text() for t in panel.get_xticklabels()] == ["0", "0.001", "0.01"]
    ledger = Ledger(out / "ledger.sqlite", create=False)
    try:
        rows = report.metric_groups(ledger.jobs(), ledger.metrics())
    finally:
        ledger.close()
    expected = {}
    for r in rows:
        if r["kind"] == "curve" and r["metric"] == "test.loss.barrier.rebasin":
            grid = r["grid"]
            expected.setdefault(f"hidden={grid['model.hidden']}", {})[
                grid["train.weight_decay"]
            ] = r["mean"]
    assert len(expected) == 2
    lines = {bars.get_label(): bars.lines[0] for bars in panel.containers}
    assert set(lines) == set(expected)
    for label, line in lines.items():
        assert list(line.get_xdata()) == [0, 1, 2]
        want = [expected[label][d] for d in (0.0, 0.001, 0.01)]
        assert line.get_ydata().tolist() == pytest.approx(want, rel=1e-12)


def _run_digits(tmp_path, seeds: int, rest: str):
    """Run a small MLP experiment on digits (one epoch, ``seeds`` seeds) whose grid and
    blocks are ``rest``; returns its folder."""
    spec = tmp_path / "e.toml"
    spec.write_text(
        f'name = "e"\nseeds = {list(range(seeds))}\nthreads = 1\n[data]\ndataset = "digits"\n'
        '[model]\nname = "mlp"\n[train]\nepochs = 1\nbatch_size = 64\n' + rest
    )
    out = tmp_path / "out"
    run_experiment(load_experiment(spec), out, log=lambda _: None)
    return out


def _drawn_figures(out, monkeypatch) -> dict:
    """``write_report(out)``'s figures by caption, as matplotlib figures (not yet encoded)."""
    import matplotlib.pyplot as plt

    from lmckit.plots import report as report_figures

    drawn = []

    def keep(fig):
        drawn.append(fig)
        return ""

    monkeypatch.setattr(report_figures, "png", keep)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    text = write_report(out).read_text()
    captions = [html.unescape(c) for c in re.findall(r"<figcaption>(.*?)</figcaption>", text)]
    assert len(captions) == len(drawn)
    return dict(zip(captions, drawn, strict=True))


def _merge_means(out, metric) -> dict:
    """The ledger's merge rows of ``metric``: mean over seed sets by (method, cell, n)."""
    from lmckit.experiments.report import metric_groups

    ledger = Ledger(out / "ledger.sqlite", create=False)
    try:
        rows = metric_groups(ledger.jobs(), ledger.metrics())
    finally:
        ledger.close()
    return {
        (r["group"]["method"], r["group"]["cell"], r["group"]["n"]): r["mean"]
        for r in rows
        if r["kind"] == "merge" and r["metric"] == metric
    }


def test_the_merge_figure_draws_accuracy_loss_gap_and_pairwise_gap_against_n(run, monkeypatch):
    """STE-MM Figs. 3a, 3b and 4: one panel each, every line a method in a cell, its points
    the ledger's means at each n."""
    figures = _drawn_figures(run, monkeypatch)
    fig = next(f for c, f in figures.items() if c.startswith("merging, block 0"))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == "merged test accuracy (%)" and titles[1].startswith("loss gap")
    assert titles[2].startswith("pairwise gap")
    for ax, (metric, scale) in zip(
        fig.axes, (("merged_accuracy", 100), ("loss_gap", 1), ("pairwise_gap", 1)), strict=True
    ):
        means = _merge_means(run, metric)
        lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}
        assert len(lines) == len({(m, c) for m, c, _ in means}) == 4  # 2 methods × 2 cells
        for (method, cell, n), mean in means.items():
            label = next(k for k in lines if k.startswith(method) and f"[{16 * (cell + 1)}," in k)
            xs = list(lines[label].get_xdata())
            assert lines[label].get_ydata()[xs.index(n)] == pytest.approx(scale * mean)


def test_a_merge_of_one_n_over_a_one_key_grid_is_drawn_against_that_key(tmp_path, monkeypatch):
    """STE-MM Fig. 5: the gap of the merge of n models against the width, one line per
    method, in the width's order."""
    out = _run_digits(
        tmp_path,
        3,
        '[grid]\n"model.width_multiplier" = [0.5, 0.125, 0.25]\n'
        '[[merge]]\nmethods = ["star-wm", "merge-many"]\nn = [3]\n',
    )
    figures = _drawn_figures(out, monkeypatch)
    fig = next(f for c, f in figures.items() if c.startswith("merging, block 0"))
    widths = [0.125, 0.25, 0.5]  # cells 1, 2, 0
    for ax, metric in zip(fig.axes, ("merged_accuracy", "loss_gap", "pairwise_gap"), strict=True):
        assert ax.get_xlabel() == "width_multiplier (n = 3)"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.125", "0.25", "0.5"]
        means = _merge_means(out, metric)
        scale = 100 if metric == "merged_accuracy" else 1
        lines = {bars.get_label(): bars.lines[0] for bars in ax.containers}
        assert set(lines) == {"star-wm", "merge-many"}
        for method, line in lines.items():
            cells = [[0.5, 0.125, 0.25].index(w) for w in widths]
            want = [scale * means[(method, c, 3)] for c in cells]
            assert list(line.get_xdata()) == [0, 1, 2]
            assert line.get_ydata().tolist() == pytest.approx(want)


def test_a_merge_of_one_n_over_a_two_key_grid_has_a_line_per_method_and_other_value(
    monkeypatch,
):
    """Fig. 5 over width × weight decay: against the key with more values, one line per
    method and value of the other, each point its row's mean."""
    import matplotlib.pyplot as plt

    from lmckit.plots import report as report_figures
    from lmckit.plots.report import merge_figures

    figures = []
    monkeypatch.setattr(report_figures, "png", lambda fig: figures.append(fig) or "")
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    rows, cell = [], 0
    for decay in (0.0, 0.01):
        for width in (2, 0.5, 1):
            for method in ("star-wm", "ste-mm"):
                mean = width + 10 * decay + (0.5 if method == "ste-mm" else 0.0)
                rows.append({"kind": "merge", "metric": "loss_gap", "mean": mean, "std": None,
                             "group": {"block": 0, "cell": cell, "method": method, "n": 10},
                             "grid": {"model.width_multiplier": width,
                                      "train.weight_decay": decay}})  # fmt: skip
            cell += 1
    [(caption, _)] = merge_figures(rows, {})
    assert "Figs. 3a, 3b, 4, 5" in caption
    [ax] = figures[0].axes
    assert ax.get_xlabel() == "width_multiplier (n = 10)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1", "2"]
    lines = {bars.get_label(): bars.lines[0].get_ydata().tolist() for bars in ax.containers}
    assert lines == {
        f"{method}, weight_decay={decay}": [w + 10 * decay + extra for w in (0.5, 1, 2)]
        for method, extra in (("star-wm", 0.0), ("ste-mm", 0.5))
        for decay in (0.0, 0.01)
    }


def test_the_figures_key_of_a_variant_is_the_schemas():
    """The report's figures spell the schema's label key for a grid variant again (they sit
    below the engine): the two must stay one key."""
    from lmckit.experiments.schema import VARIANT_KEY
    from lmckit.plots import report as report_figures

    assert report_figures.VARIANT_KEY == VARIANT_KEY


def test_two_jobs_sharing_a_result_key_keep_their_own_methods():
    """Git Re-Basin's Alg. 2 STE can return weight matching's permutation, and then its
    curve has WM's result key: each curve's metrics stay with the job that recorded them
    (they were filed under one method by key — WM with four values, STE with two)."""
    from lmckit.experiments.report import metric_groups

    def job(name, key, method):
        labels = {"block": 0, "cell": 0, "method": method, "pair": name[-1]}
        return {"name": name, "key": key, "kind": "curve", "status": "done",
                "settings": {"labels": labels}}  # fmt: skip

    jobs = [job("curve/wm/0", "k0", "wm-fast"), job("curve/ste/0", "k0", "ste"),
            job("curve/wm/1", "k1", "wm-fast"), job("curve/ste/1", "k2", "ste")]  # fmt: skip
    metrics = [
        {"job": j["key"], "name": j["name"], "kind": "curve", "metric": "m", "value": v}
        for j, v in zip(jobs, (1.0, 1.0, 2.0, 4.0), strict=True)
    ]
    rows = {r["group"]["method"]: r for r in metric_groups(jobs, metrics)}
    assert rows["wm-fast"]["values"] == [1.0, 2.0] and rows["ste"]["values"] == [1.0, 4.0]
