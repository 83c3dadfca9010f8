"""The ledger says exactly what ran: one row per job even where two jobs share a stored
result, a reused result with its original timing and flagged as reused, and only the latest
run's configuration in what ``status`` and ``report`` read."""

import pytest

from lmckit.cli import main
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.report import write_report
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.experiments.conftest import TINY, read_ledger

SMALL = {
    "seeds": [0, 1],
    "grid.model.hidden": [[16, 16]],
    "train.epochs": 1,
    "compare.0.methods": ["none", "wm", "wm-fast"],
    "compare.0.pairs": "first",
    "merge.0.n": [2],
}


def _run(out, **overrides):
    return run_experiment(load_experiment(TINY, {**SMALL, **overrides}), out, log=lambda _m: None)


def test_jobs_whose_results_coincide_keep_a_row_each(tmp_path):
    """WM and its warm-started twin reach the same permutation, so their curves are one
    stored artifact — and still two jobs, two rows, each with its metrics."""
    summary = _run(tmp_path)
    assert summary.complete
    jobs, metrics = read_ledger(tmp_path)
    cold, warm = jobs["curve/b0/c0/0-1/wm"], jobs["curve/b0/c0/0-1/wm-fast"]
    assert cold["key"] == warm["key"] and cold["status"] == warm["status"] == "done"
    for name in ("curve/b0/c0/0-1/wm", "curve/b0/c0/0-1/wm-fast"):
        assert (name, "test.loss.barrier.rebasin") in metrics
    # the second of the two found the first one's result: reused, and says so
    assert sorted([cold["reused"], warm["reused"]]) == [False, True]
    report = write_report(tmp_path).read_text()
    assert report.count("curve/b0/c0/0-1/wm<") == 1 and "curve/b0/c0/0-1/wm-fast" in report


def test_a_reused_job_keeps_its_original_times_and_attempts(tmp_path):
    _run(tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    first = {j["name"]: j for j in ledger.jobs(1)}
    ledger.close()
    again = _run(tmp_path)
    assert not again.done and again.reused
    ledger = Ledger(tmp_path / "ledger.sqlite")
    second = {j["name"]: j for j in ledger.jobs(2)}
    ledger.close()
    for name, row in second.items():
        original = first[name]
        assert row["reused"] and row["status"] == "done", name
        assert row["attempts"] == original["attempts"] <= 1, name  # not run again
        assert row["seconds"] == pytest.approx(original["seconds"]), name
        # the store records when it was computed (to the second): the first run's time
        assert abs(row["finished"] - original["finished"]) < 1.5, name


def test_a_rerun_with_other_settings_replaces_what_status_and_report_read(tmp_path, capsys):
    _run(tmp_path)
    _run(tmp_path, **{"train.epochs": 2})
    fresh = tmp_path / "fresh"
    _run(fresh, **{"train.epochs": 2})
    jobs, metrics = read_ledger(tmp_path)
    fresh_jobs, fresh_metrics = read_ledger(fresh)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    rows, all_metrics = ledger.jobs(), ledger.metrics()
    ledger.close()
    assert len(rows) == len(fresh_jobs) and len(all_metrics) == len(fresh_metrics)
    assert {n: j["key"] for n, j in jobs.items()} == {n: j["key"] for n, j in fresh_jobs.items()}
    assert metrics.keys() == fresh_metrics.keys()
    assert all(metrics[k] == pytest.approx(fresh_metrics[k], rel=1e-9) for k in metrics)
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "run 2 of 2" in out and "train.epochs=2" in out
    header = next(line for line in out.splitlines() if line.startswith("step")).split()
    train = next(line for line in out.splitlines() if line.startswith("train")).split()
    counts = dict(zip(header[1:], train[1:], strict=True))
    assert counts == {"waiting": "0", "pending": "0", "running": "0", "done": "2",
                      "failed": "0", "interrupted": "0", "reused": "0"}  # fmt: skip
    # two models done, not four


@pytest.mark.parametrize(
    ("table", "column", "where", "bad", "named"),
    [
        ("info", "value", "name LIKE 'planned.%'", "{broken", "run 1's planned jobs"),
        ("info", "value", "name LIKE 'planned.%'", '{"train": -2}', "run 1's planned jobs"),
        ("runs", "environment", "id = 1", "[1, 2]", "run 1's environment"),
        ("runs", "overrides", "id = 1", "nonsense", "run 1's overrides"),
        ("jobs", "settings", "name = 'train/c0/seed0'", "", "job train/c0/seed0's settings"),
    ],
)
def test_a_damaged_ledger_field_is_one_line_naming_it(tmp_path, capsys, table, column, where,
                                                      bad, named):  # fmt: skip
    """A ledger edited or damaged by hand: status and report name the field, exit 1 —
    not an internal error (JSONDecodeError, AttributeError on a list)."""
    import sqlite3

    out = tmp_path / "run"
    out.mkdir()
    ledger = Ledger(out / "ledger.sqlite")
    ledger.start_run('name = "x"\n', {"lmckit": "0"}, {}, {"train": 1})
    ledger.add_job("train/c0/seed0", "k" * 64, "train", {"labels": {"cell": 0, "seed": 0}})
    ledger.close()
    db = sqlite3.connect(out / "ledger.sqlite")
    db.execute(f"UPDATE {table} SET {column} = ? WHERE {where}", (bad,))
    db.commit()
    db.close()
    for command in (["status", str(out)], ["report", str(out)]):
        capsys.readouterr()
        assert main(command) == 1
        err = capsys.readouterr().err
        assert f"cannot read {named}: not" in err and "internal error" not in err


def test_status_names_the_commit_the_run_ran(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    ledger = Ledger(out / "ledger.sqlite")
    commit = "0123456789abcdef0123456789abcdef01234567"
    ledger.start_run('name = "x"\n', {"lmckit_source": f"{commit} (modified)"}, {}, {})
    ledger.close()
    assert main(["status", str(out)]) == 0
    assert ", lmckit 0123456789ab (modified) (earlier runs" in capsys.readouterr().out
    ledger = Ledger(out / "ledger.sqlite")
    ledger.start_run('name = "x"\n', {"lmckit_source": commit}, {}, {})
    ledger.close()
    assert main(["status", str(out)]) == 0
    assert "run 2 of 2, started" in (text := capsys.readouterr().out)
    assert ", lmckit 0123456789ab (earlier runs" in text


def test_a_ledger_opened_to_read_is_never_written(tmp_path):
    """``lmckit status`` and ``lmckit report`` open the ledger with ``create=False``: an
    empty file is refused and stays empty (it was given the schema), a real ledger is read
    with neither its bytes nor its side files changed, and the connection cannot write."""
    import sqlite3

    from lmckit.cli import main
    from lmckit.experiments.ledger import Ledger, LedgerError

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "ledger.sqlite").write_bytes(b"")
    with pytest.raises(LedgerError, match="holds no experiment ledger"):
        Ledger(empty / "ledger.sqlite", create=False)
    assert main(["status", str(empty)]) != 0 and main(["report", str(empty)]) != 0
    assert sorted(p.name for p in empty.iterdir()) == ["ledger.sqlite"]
    assert (empty / "ledger.sqlite").read_bytes() == b""
    foreign = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE notes (x)")
    db.commit()
    db.close()
    before = foreign.read_bytes()
    with pytest.raises(LedgerError, match="holds no experiment ledger"):
        Ledger(foreign, create=False)
    assert foreign.read_bytes() == before

    run = tmp_path / "run"
    run.mkdir()
    with Ledger(run / "ledger.sqlite") as ledger:
        ledger.start_run("e", {"lmckit": "test"})
    before = (run / "ledger.sqlite").read_bytes()
    files = sorted(p.name for p in run.iterdir())
    with Ledger(run / "ledger.sqlite", create=False) as ledger:
        assert len(ledger.runs()) == 1
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ledger.db.execute("DELETE FROM jobs")
    assert (run / "ledger.sqlite").read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == files
