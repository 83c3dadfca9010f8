"""``--only``: a slice of an experiment — the matching jobs and what they need, nothing
else — whose results are those of the whole run, bit for bit, and which a later whole run
reuses."""

import pytest

from lmckit.cli import main
from lmckit.experiments.dag import select_jobs
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import ExperimentError, load_experiment
from lmckit.experiments.steps import Job
from tests.experiments.conftest import TINY, read_ledger

QUIET = {"log": lambda _: None}


def _dag() -> list[Job]:
    """Two models per cell of two cells, a match of them and a curve of the match per cell
    (needing the models only through the match), one merge of cell 1's models."""
    jobs = [Job(f"train/c{c}/seed{s}", "train", {}) for c in (0, 1) for s in (0, 1)]
    for c in (0, 1):
        models = (f"train/c{c}/seed0", f"train/c{c}/seed1")
        jobs.append(Job(f"match/c{c}/0-1/wm", "match", {}, models))
        jobs.append(Job(f"curve/b0/c{c}/0-1/wm", "curve", {}, (f"match/c{c}/0-1/wm",)))
    jobs.append(Job("merge/b0/c1/star-wm/n2", "merge", {}, ("train/c1/seed0", "train/c1/seed1")))
    return jobs


def test_a_slice_is_the_matching_jobs_and_everything_they_need_in_the_plans_order():
    jobs = _dag()
    names = [j.name for j in select_jobs(jobs, ["curve/*/c1/*"])]
    assert names == ["train/c1/seed0", "train/c1/seed1", "match/c1/0-1/wm", "curve/b0/c1/0-1/wm"]
    # a job's inputs' inputs too (the curve needs the match, which needs the models)
    names = [j.name for j in select_jobs(list(reversed(jobs)), ["curve/b0/c0/0-1/wm"])]
    assert names == ["curve/b0/c0/0-1/wm", "match/c0/0-1/wm", "train/c0/seed1", "train/c0/seed0"]
    # several patterns: the union; `*` crosses `/`
    names = {j.name for j in select_jobs(jobs, ["merge*", "train/c0/seed0"])}
    assert names == {"merge/b0/c1/star-wm/n2", "train/c1/seed0", "train/c1/seed1", "train/c0/seed0"}
    assert select_jobs(jobs, ["*"]) == jobs


def test_a_pattern_that_matches_nothing_names_the_jobs_there_are():
    with pytest.raises(ExperimentError) as error:
        select_jobs(_dag(), ["merge/b1/*"])
    message = str(error.value)
    assert "'merge/b1/*' matches none of the 9 jobs" in message
    for example in ("train/c0/seed0", "match/c0/0-1/wm", "curve/b0/c0/0-1/wm"):
        assert example in message


def test_a_slice_runs_only_its_jobs_with_the_whole_runs_results_and_a_whole_run_reuses_them(
    tmp_path, capsys
):
    whole = tmp_path / "whole"
    run_experiment(load_experiment(TINY), whole, **QUIET)
    everything_jobs, everything = read_ledger(whole)

    out = tmp_path / "slice"
    only = ["curve/b0/c1/0-1/wm-fast"]
    summary = run_experiment(load_experiment(TINY), out, only=only, **QUIET)
    jobs, metrics = read_ledger(out)
    assert summary.complete and len(summary.done) == 4
    assert sorted(jobs) == [
        "curve/b0/c1/0-1/wm-fast", "match/c1/0-1/wm-fast", "train/c1/seed0", "train/c1/seed1",
    ]  # fmt: skip
    assert metrics == {k: v for k, v in everything.items() if k[0] in jobs}
    assert {n: j["key"] for n, j in jobs.items()} == {n: everything_jobs[n]["key"] for n in jobs}
    _the_dry_run_of_two_slices_lists_the_first_as_finished_and_writes_nothing(out, tmp_path, capsys)
    elsewhere = out / "store" / "partial" / ("0" * 64 + ".resume")  # a job outside, half done
    elsewhere.parent.mkdir(exist_ok=True)
    elsewhere.write_bytes(b"kept for the run that does this job")
    summary = run_experiment(load_experiment(TINY), out, only=only, **QUIET)
    assert summary.complete and len(summary.reused) == 4
    assert elsewhere.exists()  # a slice cannot tell it from a job of the file's it did not run

    ledger = Ledger(out / "ledger.sqlite")
    try:
        assert ledger.runs()[-1]["environment"]["only"] == ["curve/b0/c1/0-1/wm-fast"]
        assert ledger.planned() == {"train": 2, "match": 1, "curve": 1}
    finally:
        ledger.close()
    assert main(["status", str(out)]) == 0
    assert ", only curve/b0/c1/0-1/wm-fast and their inputs" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "a slice: only the jobs matching curve/b0/c1/0-1/wm-fast and their inputs" in page
    assert "finished by earlier runs" not in page  # the earlier run was this same slice

    # another slice: its report says the first slice's jobs are not in it; a run with both
    # patterns reuses all eight and reports them together
    other = ["curve/b0/c0/0-1/wm-fast"]
    assert len(run_experiment(load_experiment(TINY), out, only=other, **QUIET).done) == 4
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "(4 job(s) finished by earlier runs are not in it: to report slices" in page
    both = run_experiment(load_experiment(TINY), out, only=only + other, **QUIET)
    assert len(both.reused) == 8 and not both.done
    capsys.readouterr()
    assert main(["run", str(TINY), "--out", str(out), "--dry-run", "--only", only[0]]) == 0
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    # each job's row of the latest run that has it
    assert len(planned) == 4 and all("finished in run 4 (reused" in line for line in planned)
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "8 jobs done (8 of them reused from the store)" in page
    assert "finished by earlier runs" not in page

    # the whole file into the same folder: the slices' eight jobs are reused, not rerun
    summary = run_experiment(load_experiment(TINY), out, **QUIET)
    assert sorted(summary.reused) == sorted(both.reused) and len(summary.done) == 36
    assert set(jobs) < set(summary.reused)
    assert read_ledger(out)[1] == everything
    assert not elsewhere.exists()  # a whole run that finished removes what no job needs


def _snapshot(folder):
    return {str(f.relative_to(folder)): f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def _the_dry_run_of_two_slices_lists_the_first_as_finished_and_writes_nothing(
    out, tmp_path, capsys
):
    """``lmckit run --dry-run`` after the slice of c1's curve, with c0's curve added: c1's
    four jobs are finished (run 1), c0's four are to run; the two curves are the named
    jobs; the folder is byte for byte as it was, and a fresh folder is not created."""
    before = _snapshot(out)
    capsys.readouterr()
    patterns = ["--only", "curve/b0/c1/0-1/wm-fast", "--only", "curve/b0/c0/0-1/wm-fast"]
    assert main(["run", str(TINY), "--out", str(out), "--dry-run", *patterns]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    for cell, state in ((1, "finished in run 1 (reused if"), (0, "to run")):
        for name in (f"train/c{cell}/seed0", f"train/c{cell}/seed1", f"match/c{cell}/0-1/wm-fast"):
            assert state in lines[name] and lines[name].endswith("(needed)"), lines[name]
        curve = lines[f"curve/b0/c{cell}/0-1/wm-fast"]
        assert state in curve and not curve.endswith("(needed)")
    assert lines["dry"] == (
        "dry run: 8 jobs (2 named by --only, 6 they need): 4 finished before, 0 failed before, "
        "0 waiting, 0 resumable, 4 to run; nothing was run or written"
    )
    assert _snapshot(out) == before
    fresh = tmp_path / "fresh"
    assert main(["run", str(TINY), "--out", str(fresh), "--dry-run", "-q"]) == 0
    tally = "0 finished before, 0 failed before, 0 waiting, 0 resumable, 44 to run"
    assert f"dry run: 44 jobs (all): {tally}" in capsys.readouterr().out
    assert not fresh.exists()
    # what the run refuses, the dry run refuses: --out onto the folder of the file itself
    (fresh / "experiment.toml").parent.mkdir()
    (fresh / "experiment.toml").write_text(TINY.read_text())
    code = main(["run", str(fresh / "experiment.toml"), "--out", str(fresh), "--dry-run", "-q"])
    assert code == 2 and "which is one of the inputs" in capsys.readouterr().err


def test_the_run_command_refuses_a_pattern_that_matches_no_job(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", str(TINY), "--out", str(out), "-q", "--only", "merge/b7/*"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--only 'merge/b7/*' matches none of the 44 jobs" in err
    assert not (out / "ledger.sqlite").exists()
