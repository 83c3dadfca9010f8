"""An experiment run's state as text (`lmckit.experiments.status`), from Python: the
ledger's summary and the dry run's plan."""

from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import PlannedJob
from lmckit.experiments.status import plan_lines, status_lines


def test_status_lines_count_each_steps_jobs_and_name_each_failure(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.start_run("name = 'x'", {}, {"train.epochs": 2}, {"train": 3, "curve": 1})
    for name, key in (("train/c0/seed0", "k0"), ("train/c0/seed1", "k1")):
        ledger.add_job(name, key, "train", {})
        ledger.started(name)
    ledger.done("train/c0/seed0", {"test_accuracy": 0.9}, seconds=2.0, reused=False)
    ledger.failed("train/c0/seed1", "Traceback ...\nValueError: lr too high")
    ledger.close()
    reader = Ledger(tmp_path / "ledger.sqlite", create=False)
    try:
        lines = status_lines(tmp_path, reader)
    finally:
        reader.close()
    assert lines[0].startswith("run 1 of 1, started ") and "--set train.epochs=2" in lines[0]
    header = lines[1].split()
    train = dict(zip(header[1:], map(int, lines[3].split()[1:]), strict=True))
    assert lines[3].split()[0] == "train"
    assert train["waiting"] == 1 and train["done"] == 1 and train["failed"] == 1
    assert lines[2].split()[:2] == ["curve", "1"]  # planned, never entered the ledger
    assert "2 job(s) never started" in "\n".join(lines)
    assert "failed: train/c0/seed1 (1 attempt(s)): ValueError: lr too high" in lines


def test_plan_lines_say_what_the_run_would_do_with_each_job():
    planned = [
        PlannedJob("train/a", "train", True, earlier="done", run=1),
        PlannedJob("train/b", "train", True, earlier="failed", run=1),
        PlannedJob("curve/b", "curve", True, deps=("train/b",)),
        PlannedJob("curve/a", "curve", False, deps=("train/a",)),
    ]
    lines = plan_lines(planned, only=True)
    assert "finished in run 1" in lines[0] and "not run again without --retry-failed" in lines[1]
    assert "waits: it needs train/b" in lines[2] and lines[3].endswith("to run  (needed)")
    assert lines[-1] == (
        "dry run: 4 jobs (3 named by --only, 1 they need): 1 finished before, 1 failed before, "
        "1 waiting, 0 resumable, 1 to run; nothing was run or written"
    )
    retried = plan_lines(planned, retry_failed=True)
    assert "to run (failed in run 1)" in retried[1] and "to run" in retried[2]
