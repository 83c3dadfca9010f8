"""Running experiments: reuse, executors that agree bit for bit, SIGKILL and resume,
failures recorded and retried."""

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

import lmckit.experiments.steps as steps
from lmckit.errors import OutputPathError
from lmckit.experiments.ledger import Ledger
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.experiments.conftest import TINY

QUIET = {"log": lambda _: None}


def contents(out):
    """The ledger's jobs (key, kind, status) and metrics by job name — what a run produced,
    without when, where or in how many attempts."""
    ledger = Ledger(out / "ledger.sqlite")
    try:
        jobs = {j["name"]: (j["key"], j["kind"], j["status"]) for j in ledger.jobs()}
        metrics = {(m["name"], m["metric"]): m["value"] for m in ledger.metrics()}
        return jobs, metrics
    finally:
        ledger.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run in this process."""
    out = tmp_path_factory.mktemp("reference")
    summary = run_experiment(load_experiment(TINY), out, **QUIET)
    assert summary.complete and len(summary.done) == 44 and not summary.reused
    return out


def test_a_rerun_reuses_every_stored_result(reference):
    before = contents(reference)
    summary = run_experiment(load_experiment(TINY), reference, **QUIET)
    assert len(summary.reused) == 44 and not summary.done
    assert contents(reference) == before
    jobs, metrics = before
    assert {kind for _, kind, _ in jobs.values()} == {"train", "match", "curve", "merge"}
    assert all(status == "done" for _, _, status in jobs.values())
    assert 0 < metrics[("train/c1/seed0", "test_accuracy")] <= 1
    naive = metrics[("curve/b0/c1/0-1/none", "test.loss.barrier.rebasin")]
    matched = metrics[("curve/b0/c1/0-1/wm-fast", "test.loss.barrier.rebasin")]
    assert matched < naive


def test_worker_processes_give_the_same_ledger_bit_for_bit(reference, tmp_path):
    run_experiment(load_experiment(TINY), tmp_path, jobs=2, **QUIET)
    assert contents(tmp_path) == contents(reference)


def test_ray_gives_the_same_ledger_bit_for_bit(reference, tmp_path):
    pytest.importorskip("ray", reason="the CI installs lmckit[ray]")
    import ray

    try:
        run_experiment(load_experiment(TINY), tmp_path, executor="ray", jobs=2, **QUIET)
    finally:
        ray.shutdown()
    assert contents(tmp_path) == contents(reference)


def test_sigkill_mid_run_then_rerun_gives_the_uninterrupted_ledger(reference, tmp_path):
    command = [sys.executable, "-m", "lmckit.cli", "run", str(TINY), "--out", str(tmp_path), "-q"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and run.poll() is None:
            if (tmp_path / "ledger.sqlite").exists():
                ledger = Ledger(tmp_path / "ledger.sqlite")
                done = ledger.summary().get("train", {}).get("done", 0)
                ledger.close()
                if done >= 2:  # killed with work finished and work running
                    break
            time.sleep(0.02)
        assert run.poll() is None, "the run finished before it could be killed"
        run.send_signal(signal.SIGKILL)
    finally:
        run.wait()
    partial, _ = contents(tmp_path)
    assert any(status != "done" for _, _, status in partial.values()) or len(partial) < 44
    summary = run_experiment(load_experiment(TINY), tmp_path, **QUIET)
    assert summary.complete and summary.reused  # finished work was kept
    assert contents(tmp_path) == contents(reference)


def _fail_am_matches(monkeypatch):
    """Make every AM match job fail ("planted failure"); returns the real match step."""
    original = steps.STEPS["match"]

    def broken(payload, progress):
        if payload["settings"]["method"] == "am":
            raise RuntimeError("planted failure")
        return original.run(payload, progress)

    monkeypatch.setitem(steps.STEPS, "match", steps.StepKind("match", original.key, broken))
    return original


def test_failures_are_recorded_and_retried_only_when_asked(tmp_path, monkeypatch, capsys):
    from lmckit.cli import main

    original = _fail_am_matches(monkeypatch)
    summary = run_experiment(load_experiment(TINY), tmp_path, **QUIET)
    assert len(summary.failed) == 6 and len(summary.waiting) == 6  # 6 AM matches, 6 curves
    ledger = Ledger(tmp_path / "ledger.sqlite")
    failed = [j for j in ledger.jobs() if j["status"] == "failed"]
    assert len(failed) == 6 and "RuntimeError: planted failure" in failed[0]["error"]
    assert "Traceback" in failed[0]["error"]
    ledger.close()
    monkeypatch.setitem(steps.STEPS, "match", original)
    again = run_experiment(load_experiment(TINY), tmp_path, **QUIET)
    assert len(again.failed) == 6 and not again.done  # not retried unasked
    capsys.readouterr()
    assert main(["run", str(TINY), "--out", str(tmp_path), "--dry-run"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "failed in run 2 (not run again without --retry-failed" in lines["match/c0/0-1/am"]
    assert "waits: it needs match/c0/0-1/am, which will not run" in lines["curve/b0/c0/0-1/am"]
    assert "finished in run" in lines["match/c0/0-1/wm-fast"]
    assert "6 failed before, 6 waiting, 0 resumable, 0 to run" in lines["dry"]
    assert main(["run", str(TINY), "--out", str(tmp_path), "--dry-run", "--retry-failed"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["match/c0/0-1/am"].endswith("to run (failed in run 2)")
    assert lines["curve/b0/c0/0-1/am"].endswith("to run")
    assert "0 failed before, 0 waiting, 0 resumable, 12 to run" in lines["dry"]
    retried = run_experiment(load_experiment(TINY), tmp_path, retry_failed=True, **QUIET)
    assert retried.complete and len(retried.done) == 12
    jobs, _ = contents(tmp_path)
    assert all(status == "done" for _, _, status in jobs.values())
    attempts = {j["name"]: j["attempts"] for j in Ledger(tmp_path / "ledger.sqlite").jobs()}
    assert attempts["match/c0/0-1/am"] == 2


def test_a_second_run_into_the_folder_is_refused(tmp_path):
    from lmckit.files import locked_output

    with locked_output(tmp_path):  # held by this process; a second process is refused
        result = subprocess.run(
            [sys.executable, "-m", "lmckit.cli", "run", str(TINY), "--out", str(tmp_path), "-q"],
            capture_output=True,
            text=True,
        )
    assert result.returncode == 2
    assert "being written by another lmckit run" in result.stderr


def test_status_summarises_and_exports_the_ledger(reference, tmp_path, capsys):
    from lmckit.cli import main

    assert main(["status", str(reference), "--csv", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "curve" in printed
    jobs = (tmp_path / "jobs.csv").read_text().splitlines()
    metrics = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(jobs) == 1 + 44 and metrics[0] == "job,name,kind,metric,value"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert main(["status", str(reference), "--parquet", str(tmp_path)]) == 2
        captured = capsys.readouterr()
        assert "needs pyarrow" in captured.err and not captured.out  # refused before printing
    else:
        import pyarrow.parquet as pq

        assert main(["status", str(reference), "--parquet", str(tmp_path)]) == 0
        table = pq.read_table(tmp_path / "metrics.parquet")
        assert table.num_rows == len(metrics) - 1  # the CSV's rows without its header
        assert table.column_names == metrics[0].split(",")
    assert main(["status", str(tmp_path)]) == 2
    assert "holds no experiment ledger" in capsys.readouterr().err
    # a user's own jobs.csv in the export folder is never replaced
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "jobs.csv").write_text("mine\n")
    assert main(["status", str(reference), "--csv", str(theirs)]) == 2
    assert "jobs.csv already exists and was not written by lmckit" in capsys.readouterr().err
    assert (theirs / "jobs.csv").read_text() == "mine\n"


def test_run_command_runs_and_resumes(tmp_path, capsys):
    from lmckit.cli import main

    args = ["run", str(TINY), "--out", str(tmp_path), "-q", "--set", "train.epochs=2"]
    assert main(args) == 0
    assert "jobs run, 0 reused" in capsys.readouterr().out
    assert main(args) == 0
    assert "0 jobs run" in capsys.readouterr().out
    # the experiment as it ran: the override applied and named, in the file and the ledger
    ran = (tmp_path / "experiment.toml").read_text()
    assert ran.startswith("# lmckit ran this experiment file with these overrides (--set):")
    assert tomllib.loads(ran)["train"]["epochs"] == 2
    assert tomllib.loads(TINY.read_text())["train"]["epochs"] != 2
    ledger = Ledger(tmp_path / "ledger.sqlite")
    runs = ledger.runs()
    ledger.close()
    assert [r["overrides"] for r in runs] == [{"train.epochs": 2}] * 2
    assert all(r["experiment"] == ran for r in runs)
    assert main(["run", str(TINY), "--out", str(tmp_path), "--set", "seeds=[0, 0]"]) == 2
    assert "seeds must be distinct" in capsys.readouterr().err
    # the file as it ran is an input now: a run of it into the same folder must not replace it
    assert main(["run", str(tmp_path / "experiment.toml"), "--out", str(tmp_path), "-q"]) == 2
    assert "which is one of the inputs" in capsys.readouterr().err
    assert (tmp_path / "experiment.toml").read_text() == ran


def test_default_threads_follow_the_cpu_affinity_not_the_machine(monkeypatch):
    from lmckit.experiments import executors

    if hasattr(os, "sched_setaffinity"):
        # A process pinned to one core (taskset, a batch scheduler) must not start a
        # thread per core of the machine: they would all share that one core.
        script = (
            "import os; from lmckit.experiments.executors import usable_cores; "
            "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "print(usable_cores())"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "1"
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert executors.usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert executors.usable_cores() == 1


def test_default_threads_are_capped_by_omp_num_threads(tmp_path, monkeypatch):
    """``OMP_NUM_THREADS=1`` is how a user runs several experiments side by side; the
    runner used to override it with cores / jobs, and each run's second OpenMP thread spun
    in barriers on cores the other runs needed. The run records what its jobs used."""
    from lmckit.experiments import executors

    monkeypatch.setattr(executors, "usable_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert executors.default_threads(1) == 4 and executors.default_threads(3) == 1
    for value, expected in [("1", 1), ("2", 2), ("8", 4), ("3,1", 3), ("0", 4), ("many", 4)]:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert executors.default_threads(1) == expected, value
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = []
    set_threads = torch.set_num_threads

    def spy(n):
        seen.append(n)
        set_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    experiment = tmp_path / "e.toml"
    experiment.write_text(
        'name = "t"\nseeds = [0]\n[data]\ndataset = "digits"\n[model]\nname = "mlp"\n'
        '"hidden" = [8]\n[train]\nepochs = 1\n'
    )
    run_experiment(load_experiment(experiment), tmp_path / "out", **QUIET)
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    try:
        assert ledger.runs()[-1]["environment"]["threads_per_job"] == 1
    finally:
        ledger.close()
    assert seen[0] == 1  # set for the job (and the caller's count restored after it)


class KilledInTraining(torch.nn.Module):
    """A user's MLP whose worker dies (SIGKILL, as the kernel's OOM killer does) when it
    trains while the file ``$LMCKIT_TEST_KILL`` exists; tracing and evaluation survive."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 8)
        self.out = torch.nn.Linear(8, 10)

    def forward(self, x):
        marker = os.environ.get("LMCKIT_TEST_KILL")
        if self.training and torch.is_grad_enabled() and marker and os.path.exists(marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return self.out(torch.relu(self.fc(x.flatten(1))))


def test_a_killed_worker_interrupts_the_run_cleanly_and_a_rerun_finishes(tmp_path, monkeypatch):
    """Killing one of ``--jobs 2``'s workers used to end the driver in "internal error
    (BrokenProcessPool)": now the run stops with a clear error, the jobs in flight are
    recorded as interrupted, finished results stay, and the same command finishes."""
    from lmckit.errors import LmcError

    marker = tmp_path / "kill"
    marker.write_text("")
    monkeypatch.setenv("LMCKIT_TEST_KILL", str(marker))
    (tmp_path / "e.toml").write_text(
        'name = "killed"\nseeds = [0, 1]\nthreads = 1\n'
        '[data]\ndataset = "digits"\n[model]\nname = "custom"\n'
        'class = "tests.experiments.test_runner:KilledInTraining"\n[train]\nepochs = 1\n'
        '[[compare]]\nmethods = ["none"]\nlambdas = 3\n'
    )
    experiment = load_experiment(tmp_path / "e.toml")
    out = tmp_path / "run"
    with pytest.raises(LmcError, match=r"a worker process died .* rerun the same command"):
        run_experiment(experiment, out, jobs=2, **QUIET)
    ledger = Ledger(out / "ledger.sqlite")
    statuses = {j["name"]: j["status"] for j in ledger.jobs()}
    ledger.close()
    assert "interrupted" in statuses.values() and "failed" not in statuses.values()
    marker.unlink()
    summary = run_experiment(experiment, out, jobs=2, **QUIET)
    assert summary.complete and len(summary.done) + len(summary.reused) == 3


def _files(folder):
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _renamed(tmp_path, name):
    """TINY under another experiment name: the same jobs and store keys."""
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.read_text().replace('name = "tiny"', f'name = "{name}"', 1))
    return path


def test_a_run_of_another_experiment_into_a_run_folder_is_refused(reference, tmp_path, capsys):
    from lmckit.cli import main
    from lmckit.experiments.runner import RunFolderError, earlier_experiment

    other = _renamed(tmp_path, "tiny-other")
    before = _files(reference)
    with pytest.raises(RunFolderError, match="holds a run of experiment 'tiny', not 'tiny-other'"):
        run_experiment(load_experiment(other), reference, **QUIET)
    assert main(["run", str(other), "--out", str(reference), "-q"]) == 2
    assert f"--reuse-from {reference}" in capsys.readouterr().err
    assert _files(reference) == before  # no file of the earlier run touched
    assert earlier_experiment(reference) == "tiny"
    assert earlier_experiment(tmp_path) is None
    # the experiment file gone, the ledger still names the experiment
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "ledger.sqlite").write_bytes((reference / "ledger.sqlite").read_bytes())
    assert earlier_experiment(copy) == "tiny"
    (copy / "experiment.toml").write_text("not = [toml")
    with pytest.raises(RunFolderError, match="is not an experiment file"):
        earlier_experiment(copy)


def test_reuse_from_copies_another_runs_results_and_only_reads_it(reference, tmp_path, capsys):
    from lmckit.cli import main
    from lmckit.experiments.runner import RunFolderError

    other = _renamed(tmp_path, "tiny-other")
    before = _files(reference)
    out = tmp_path / "new"
    summary = run_experiment(load_experiment(other), out, reuse_from=[reference], **QUIET)
    assert len(summary.reused) == 44 and not summary.done and summary.complete
    assert contents(out) == contents(reference)  # the same keys, statuses and metrics
    assert _files(reference) == before

    def stored(folder):
        return {p.relative_to(folder) for p in (folder / "store").rglob("meta.json")}

    assert stored(out) == stored(reference)
    # the copies stand alone: a rerun without --reuse-from reuses them from this store
    assert len(run_experiment(load_experiment(other), out, **QUIET).reused) == 44
    ledger = Ledger(out / "ledger.sqlite")
    assert ledger.runs()[0]["environment"]["reuse_from"] == [str(reference)]
    ledger.close()
    # the command line
    out2 = tmp_path / "new2"
    assert main(["run", str(other), "--out", str(out2), "-q", "--reuse-from", str(reference)]) == 0
    assert "0 jobs run, 44 reused" in capsys.readouterr().out
    stored = sorted(p.name for p in (out / "store").iterdir())
    for inside in (out / "store", out / "store" / "checkpoint" / "x"):
        with pytest.raises(OutputPathError, match="inside the result store of the run in"):
            run_experiment(load_experiment(other), inside, **QUIET)
    assert not (out / "store" / "checkpoint" / "x").exists()
    assert main(["status", str(out), "--csv", str(out / "store")]) == 2
    assert "--csv" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "store").iterdir()) == stored
    with pytest.raises(RunFolderError, match="holds no run"):
        run_experiment(load_experiment(other), tmp_path / "x", reuse_from=[tmp_path], **QUIET)
    with pytest.raises(RunFolderError, match="is --out itself"):
        run_experiment(load_experiment(other), out, reuse_from=[out], **QUIET)


def test_a_damaged_artifact_in_a_reused_run_is_an_error_not_a_result(reference, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(reference, old)
    weights = sorted((old / "store" / "checkpoint").rglob("model.safetensors"))
    for path in weights:  # every model damaged: whichever a job reads first is caught
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    out = tmp_path / "new"
    summary = run_experiment(load_experiment(TINY), out, reuse_from=[old], **QUIET)
    assert summary.failed and not summary.reused
    ledger = Ledger(out / "ledger.sqlite")
    errors = {j["name"]: j["error"] for j in ledger.jobs()}
    ledger.close()
    assert all("missing or damaged" in errors[name] for name in summary.failed)
    assert not list((out / "store").rglob("model.safetensors"))  # nothing damaged copied


def _stat(pid):
    """``/proc/PID/stat``'s fields after the command name (state, parent, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid):
    """The process ids whose parent is ``pid`` (Linux ``/proc``)."""
    return {
        int(p) for p in os.listdir("/proc") if p.isdigit() and (_stat(p) or [0, 0])[1] == str(pid)
    }


def _alive(pids):
    """Those of ``pids`` that still run (zombies count as gone)."""
    return {pid for pid in pids if (_stat(pid) or ["Z"])[0] != "Z"}


def _assert_gone(workers):
    """Every one of ``workers`` ends within 20 s; any left (a failing run) is killed so
    that it does not compute on for the rest of the suite."""
    deadline = time.time() + 20
    while _alive(workers) and time.time() < deadline:
        time.sleep(0.1)
    left = _alive(workers)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"worker processes {sorted(left)} outlived their run"


def _start_long_run(out, jobs):
    """``lmckit run`` of TINY with training jobs that would take many minutes, returned
    once ``jobs`` of them are running."""
    command = [sys.executable, "-m", "lmckit.cli", "run", str(TINY), "--out", str(out), "-q"]
    command += ["--jobs", str(jobs), "--set", "train.epochs=20000"]
    # stderr to a file: a pipe would block its reader while an orphaned worker holds it
    with open(out.parent / "stderr.txt", "wb") as stderr:
        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.time() + 120
    while time.time() < deadline and run.poll() is None:
        if (out / "ledger.sqlite").exists():
            ledger = Ledger(out / "ledger.sqlite")
            running = ledger.summary().get("train", {}).get("running", 0)
            ledger.close()
            if running >= jobs and len(_children(run.pid)) >= (jobs + 1 if jobs > 1 else 0):
                time.sleep(1.0)  # the jobs under way in their workers
                return run
        time.sleep(0.05)
    run.kill()
    raise AssertionError(f"the run did not start its jobs: {_stderr(out)[-2000:]}")


def _stderr(out):
    return (out.parent / "stderr.txt").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("jobs", [1, 2])
def test_sigterm_stops_the_run_and_its_workers_at_once(tmp_path, jobs):
    """SIGTERM (a scheduler's limit, ``kill``, ``timeout``) used to kill the driver alone:
    its workers went on computing, orphaned, and the ledger said "running" forever."""
    out = tmp_path / "run"
    run = _start_long_run(out, jobs)
    workers = _children(run.pid)
    run.send_signal(signal.SIGTERM)
    try:
        returncode = run.wait(timeout=60)  # not the hours the training jobs would take
    finally:
        run.kill()
    _assert_gone(workers)
    assert returncode == 143, _stderr(out)[-2000:]
    assert "interrupted; finished results are kept" in _stderr(out)
    ledger = Ledger(out / "ledger.sqlite")
    jobs_now = ledger.jobs()
    ledger.close()
    stopped = [j for j in jobs_now if j["status"] == "interrupted"]
    assert len(stopped) == jobs and not [j for j in jobs_now if j["status"] == "running"]
    assert all("stopped (SIGTERM)" in j["error"] for j in stopped)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_a_driver_killed_by_sigkill(tmp_path, capsys):
    from lmckit.cli import main

    out = tmp_path / "run"
    run = _start_long_run(out, 2)
    workers = _children(run.pid)
    assert len(workers) >= 3  # two workers and the progress queue's manager
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "no lmckit run holds" not in shown  # it is running
    assert shown.count("running: train/") == 2, shown
    run.kill()
    run.wait()
    _assert_gone(workers)
    # the ledger still says "running" (nobody could write otherwise); status says why not
    assert main(["status", str(out)]) == 0
    assert "its 2 job(s) marked running stopped with their run" in capsys.readouterr().out


def test_status_says_how_long_each_running_job_has_run_beside_its_steps_finished_jobs():
    from lmckit.experiments.status import running_lines

    def job(name, kind, status, started=None, seconds=None, reused=False):
        return {"name": name, "kind": kind, "status": status, "started": started,
                "seconds": seconds, "reused": reused}  # fmt: skip

    now = 10_000.0
    jobs = [
        job("train/0", "train", "done", 0.0, 600.0),
        job("train/1", "train", "done", 0.0, 9000.0, reused=True),  # computed by a run before
        job("train/2", "train", "running", now - 300),
        job("match/0", "match", "running", now - 3600),
        job("match/1", "match", "failed", 0.0, 60.0),
        job("curve/0", "curve", "pending"),
        job("curve/1", "curve", "done", 0.0, 23.4),
        job("curve/2", "curve", "running", now - 42),
    ]
    assert running_lines(jobs, now) == [
        "running: train/2 for 5 min (its step's 2 finished job(s) took 10 min to 2.5 h)",
        "running: match/0 for 60 min",
        "running: curve/2 for 42 s (its step's 1 finished job(s) took 23 s)",
    ]


def test_status_says_where_a_running_job_is_and_how_long_it_has_left_at_its_pace():
    from lmckit.experiments.status import running_lines

    now = 10_000.0
    jobs = [
        {"name": "train/0", "kind": "train", "status": "running", "started": now - 3600,
         "seconds": None, "reused": False},
        {"name": "match/0", "kind": "match", "status": "running", "started": now - 900,
         "seconds": None, "reused": False},
        {"name": "curve/0", "kind": "curve", "status": "running", "started": now - 42,
         "seconds": None, "reused": False},
    ]  # fmt: skip
    progress = {
        # resumed at step 100 (its first event in this run) 600 s before its latest, step
        # 160: 10 s a step, 200 steps left
        "train/0": {"step": 160, "total": 360, "metrics": {"epoch": 2, "loss": 0.3},
                    "first_step": 100, "first_time": now - 605, "updated": now - 5},
        # a total unknown in advance; last heard of 7 minutes ago
        "match/0": {"step": 12, "total": None, "metrics": {}, "first_step": 1,
                    "first_time": now - 900, "updated": now - 420},
        # one event so far: no pace yet
        "curve/0": {"step": 1, "total": 11, "metrics": {}, "first_step": 1,
                    "first_time": now - 2, "updated": now - 2},
    }  # fmt: skip
    assert running_lines(jobs, now, progress) == [
        "running: train/0 for 60 min; at step 160 of 360 (epoch 2), about 33 min more at "
        "this run's pace",
        "running: match/0 for 15 min; at step 12 (last report 7 min ago)",
        "running: curve/0 for 42 s; at step 1 of 11",
    ]


def test_the_ledger_keeps_each_jobs_latest_progress_and_starts_its_pace_anew_per_phase(
    tmp_path,
):
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.start_run("name = 'x'", {}, {}, {"train": 1})
        ledger.progress("train/0", 5, 100, {"epoch": 1, "loss": float("nan"), "ok": True}, now=1.0)
        ledger.progress("train/0", 9, 100, {"epoch": 1, "loss": 0.5}, now=3.0)
        assert ledger.progress_rows()["train/0"] == {
            "step": 9, "total": 100, "metrics": {"epoch": 1, "loss": 0.5},
            "first_step": 5, "first_time": 1.0, "updated": 3.0,
        }  # fmt: skip
        ledger.progress("train/0", 2, 7, {}, now=4.0)  # another phase: another total
        assert ledger.progress_rows()["train/0"]["first_step"] == 2
        ledger.progress("train/0", 1, 7, {}, now=5.0)  # the step went back: anew too
        assert ledger.progress_rows()["train/0"]["first_time"] == 5.0
        ledger.start_run("name = 'x'", {}, {}, {"train": 1})
        assert ledger.progress_rows() == {}  # per run
        assert ledger.progress_rows(1)["train/0"]["step"] == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("jobs", [1, 2])
def test_status_shows_the_step_each_job_of_a_live_run_is_at(tmp_path, capsys, jobs):
    from lmckit.cli import main

    out = tmp_path / "run"
    run = _start_long_run(out, jobs)
    workers = _children(run.pid)
    try:
        deadline, rows = time.time() + 60, {}
        while time.time() < deadline and len(rows) < jobs:
            with Ledger(out / "ledger.sqlite", create=False) as ledger:
                rows = {n: r for n, r in ledger.progress_rows().items() if n.startswith("train/")}
            time.sleep(0.2)
        assert len(rows) == jobs, _stderr(out)[-2000:]
        assert main(["status", str(out)]) == 0
        shown = [line for line in capsys.readouterr().out.splitlines() if "running: " in line]
    finally:
        run.kill()
        run.wait()
        _assert_gone(workers)
    assert len(shown) == jobs, shown
    for line in shown:
        name = line.split()[1]
        step, total = rows[name]["step"], rows[name]["total"]
        # TINY's models train 20,000 epochs here: steps are known in advance, and the
        # status line is at least as far as the row read before it
        assert total is not None and 1 <= step < total
        shown_step = int(line.split("; at step ")[1].split()[0])
        assert step <= shown_step < total and f" of {total} (epoch " in line, line


def test_a_run_records_the_commit_of_the_lmckit_it_ran(tmp_path):
    """The ledger names the git commit of a checkout's source, marked when a tracked file
    under it was changed; nothing outside a work tree (an installed lmckit) or without git."""
    import shutil

    from lmckit.experiments.runner import environment, source_revision

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "checkout"
    package = repo / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "code.py").write_text("x = 1\n")
    (repo / "README").write_text("r\n")

    def git(*args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env |= {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
        command = ["git", "-c", "commit.gpgsign=false", "-C", str(repo), *args]  # a user's config
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    commit = git("rev-parse", "HEAD")
    assert len(commit) == 40
    assert source_revision(package) == commit
    (repo / "README").write_text("changed outside the package\n")
    (package / "new.py").write_text("untracked\n")
    assert source_revision(package) == commit  # only tracked files under the package count
    (package / "code.py").write_text("x = 2\n")
    assert source_revision(package) == f"{commit} (modified)"
    outside = tmp_path / "installed"
    outside.mkdir()
    assert source_revision(outside) is None
    here = Path(__file__).resolve().parents[2] / "src" / "lmckit"
    assert environment().get("lmckit_source") == source_revision(here)


def test_status_counts_the_planned_jobs_that_have_not_entered_the_ledger(
    tmp_path, monkeypatch, capsys
):
    """A job enters the ledger only once its inputs are done: the run records its plan, so
    status shows the jobs still waiting — here the six curves whose AM matches failed."""
    from lmckit.cli import main
    from lmckit.experiments.dag import build_jobs
    from lmckit.experiments.schema import model_configs
    from lmckit.experiments.status import waiting_counts

    _fail_am_matches(monkeypatch)
    experiment = load_experiment(TINY)
    run_experiment(experiment, tmp_path, **QUIET)
    ledger = Ledger(tmp_path / "ledger.sqlite", create=False)
    try:
        planned, summary = ledger.planned(), ledger.summary()
    finally:
        ledger.close()

    def data_for(model_name):
        return steps.dataset_for(model_name, experiment.dataset, None, False)

    plan = build_jobs(experiment, model_configs(experiment, data_for))
    expected = {}
    for job in plan:
        expected[job.kind] = expected.get(job.kind, 0) + 1
    assert planned == expected
    assert waiting_counts(summary, planned) == {k: 6 if k == "curve" else 0 for k in expected}
    capsys.readouterr()
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()[1:]
    assert header.split()[:3] == ["step", "waiting", "pending"]
    curve = next(r for r in rows if r.startswith("curve ")).split()
    assert curve[1] == "6" and curve[4] == str(summary["curve"]["done"])
    assert "6 job(s) never started: the run stopped first, or their inputs failed" in out
    from lmckit.experiments.report import write_report

    assert ", 6 more of the run's plan not started" in write_report(tmp_path).read_text()


def test_more_jobs_than_cores_runs_with_a_note(tmp_path, monkeypatch, capsys):
    """``--jobs`` above the usable cores is allowed (the jobs share them) but named on
    stderr before the run starts; at or below it, nothing is said."""
    import lmckit.experiments.executors as executors
    import lmckit.experiments.runner as runner
    from lmckit.cli import main
    from lmckit.errors import UsageError

    def started(*args, **kwargs):  # the run itself is not what this test is about
        raise UsageError(f"run started with jobs={kwargs['jobs']}")

    monkeypatch.setattr(executors, "usable_cores", lambda: 1)
    monkeypatch.setattr(runner, "run_experiment", started)
    for jobs, noted in ((2, True), (1, False)):
        capsys.readouterr()
        assert main(["run", str(TINY), "--out", str(tmp_path), "--jobs", str(jobs), "-q"]) == 2
        err = capsys.readouterr().err
        assert f"run started with jobs={jobs}" in err
        note = f"note: --jobs {jobs} is more than this machine's 1 usable CPU core(s)"
        assert (note in err) == noted


def test_a_resumable_job_line_estimates_the_time_left_from_its_own_pace():
    """Kept time per finished epoch × epochs left, only for a file saved at an epoch's end."""
    from lmckit.experiments.status import resumable_line

    def progress(epoch, step, seconds, epochs=10):
        return {"epoch": epoch, "epochs": epochs, "step_in_epoch": step, "seconds": seconds}

    assert resumable_line("merge/x", progress(3, 0, 540)) == (
        "resumable: merge/x saved after epoch 3 of 10 (9 min of work kept; about 21 min "
        "more at its pace)"
    )
    assert resumable_line("t", progress(4, 0, 4 * 3600, epochs=6)).endswith(
        "(240 min of work kept; about 2.0 h more at its pace)"
    )
    within = resumable_line("t", progress(3, 7, 600))
    assert within == "resumable: t saved at step 7 of epoch 4 of 10 (10 min of work kept)"
    known = {**progress(3, 50, 700), "steps_per_epoch": 100}  # 3.5 epochs in 700 s
    assert resumable_line("m", known) == (
        "resumable: m saved at step 50 of 100 of epoch 4 of 10 (12 min of work kept; about "
        "22 min more at its pace)"
    )
    assert "more at its pace" not in resumable_line("t", progress(0, 0, 0))
    assert "more at its pace" not in resumable_line("t", progress(10, 0, 60))


def test_the_time_left_follows_the_pace_of_the_process_that_saved_the_file():
    """A job whose first process crawled (a busy or stopped machine: 1 h for one epoch) and
    whose second, resumed after epoch 1, did three epochs in 30 min has 6 epochs left at
    10 min each — not at the whole run's 22.5 min per epoch."""
    from lmckit.experiments.status import resumable_line

    began = {"epoch": 1, "step_in_epoch": 0, "seconds": 3600}
    saved = {"epoch": 4, "epochs": 10, "step_in_epoch": 0, "seconds": 5400}
    assert resumable_line("t", {**saved, "resumed_from": began}).endswith(
        "(90 min of work kept; about 60 min more at its pace)"
    )
    assert resumable_line("t", saved).endswith("about 2.2 h more at its pace)")  # older files
    # within epochs: from step 50 of 100 in epoch 2 (1.5 epochs, 1 h) to step 50 of epoch 4
    # (3.5 epochs) in 20 min: 10 min per epoch, 6.5 epochs left
    began = {"epoch": 1, "step_in_epoch": 50, "seconds": 3600}
    saved = {"epoch": 3, "epochs": 10, "step_in_epoch": 50, "steps_per_epoch": 100}
    assert resumable_line("m", {**saved, "seconds": 4800, "resumed_from": began}).endswith(
        "(80 min of work kept; about 65 min more at its pace)"
    )
    fresh = {"epoch": 0, "step_in_epoch": 0, "seconds": 0}  # a run never interrupted
    assert resumable_line("m", {**saved, "seconds": 700, "resumed_from": fresh}).endswith(
        "about 22 min more at its pace)"
    )


def test_an_evaluation_subset_larger_than_its_split_is_said(tmp_path, capsys):
    """`splits = { train = 5000 }` on digits (1,437 training images) evaluated on all of
    them with only the curve's record saying so (the demo's fallback to digits does this);
    the dry run says it too."""
    import tomli_w

    from lmckit.cli import main
    from lmckit.experiments.schema import parse_experiment

    raw = tomllib.loads(TINY.read_text())
    raw.pop("grid"), raw.pop("merge")
    raw.update(seeds=[0, 1], model={"name": "mlp", "hidden": [8]}, train={"epochs": 1})
    splits = {"train": 5000, "test": 100}
    raw["compare"] = [{"pairs": "first", "methods": ["none"], "lambdas": 3, "splits": splits}]
    said = []
    run_experiment(parse_experiment(raw), tmp_path / "run", log=said.append)
    note = "note: compare[0].splits.train asks 5,000 examples; digits has 1,437 train examples"
    assert [line for line in said if line.startswith("note:")] == [f"{note}, all used"]
    (tmp_path / "e.toml").write_text(tomli_w.dumps(raw))
    assert main(["run", str(tmp_path / "e.toml"), "--out", str(tmp_path / "dry"), "--dry-run"]) == 0
    assert f"{note}, all used" in capsys.readouterr().out.splitlines()


def test_every_block_kind_with_evaluation_subsets_says_when_a_subset_is_the_whole_split():
    """Compare and triplet blocks alike, each split of each block: one note per subset
    larger than its split, none for a subset that fits or for "all"."""
    from types import SimpleNamespace

    from lmckit.experiments.runner import short_splits

    data = SimpleNamespace(train_x=[0] * 100, test_x=[0] * 20)
    block = SimpleNamespace
    experiment = SimpleNamespace(
        dataset="tiny",
        compare=[block(splits={"train": 50, "test": 30}), block(splits={"train": "all"})],
        triplets=[block(splits={"train": 100}), block(splits={"train": 101, "test": 21})],
    )
    assert short_splits(experiment, data) == [
        "note: compare[0].splits.test asks 30 examples; tiny has 20 test examples, all used",
        "note: triplets[1].splits.train asks 101 examples; tiny has 100 train examples, all used",
        "note: triplets[1].splits.test asks 21 examples; tiny has 20 test examples, all used",
    ]


def test_the_job_of_the_most_epochs_is_estimated_before_the_run(digits, monkeypatch):
    """A matching or merging job's epochs × its examples × one timed forward pass per
    example, against the budget: 10⁸ STE epochs are refused up front (the demo with
    --ste-epochs 100000000 ran until killed), a small one passes, the heaviest job is named,
    and a server subset counts its own examples. The forward pass is timed at 0.1 ms per
    example here (a real timing of this tiny MLP can be far below it, and the bounds below
    would then depend on the machine)."""
    import lmckit.budget
    from lmckit.budget import Budget, ResourceError

    monkeypatch.setattr(lmckit.budget, "forward_seconds", lambda *a, **k: (0.0256, 256))
    from lmckit.experiments.runner import _check_epoch_jobs
    from lmckit.experiments.steps import Job

    common = {"model_name": "mlp", "model_config": {"in_dim": 64, "hidden": [8], "out_dim": 10}}

    def job(name, epochs, **extra):
        options = {"epochs": epochs} if epochs is not None else {}
        return Job(name, "match", {**common, "method": "ste", "options": options, **extra})

    def data_for(_name):
        return digits

    budget = Budget(seconds=3600)
    _check_epoch_jobs([job("small", 2), job("wm", None)], data_for, budget)
    with pytest.raises(ResourceError, match=r"match job huge \(ste\) for 100000000 epoch"):
        _check_epoch_jobs([job("small", 2), job("huge", 10**8)], data_for, budget)
    # 10⁵ epochs over the 1,437 training images exceed an hour (14,370 s); over 2 server
    # examples not (20 s)
    _check_epoch_jobs([job("server", 10**5, server_examples=2)], data_for, budget)
    with pytest.raises(ResourceError, match="over 1437 examples"):
        _check_epoch_jobs([job("all", 10**5)], data_for, budget)


def test_a_run_with_a_job_of_impossible_epochs_is_refused_before_it_starts(tmp_path):
    """The check runs inside the run's own checks: a dry run (and so the run) of a compare
    block asking 10¹² STE epochs is refused with the estimate; nothing is written."""
    from lmckit.budget import ResourceError
    from lmckit.experiments.runner import plan_run
    from lmckit.experiments.schema import parse_experiment

    raw = tomllib.loads(TINY.read_text())
    raw.pop("grid"), raw.pop("merge")
    raw.update(seeds=[0, 1], model={"name": "mlp", "hidden": [8]}, train={"epochs": 1})
    raw["compare"] = [{"pairs": "first", "methods": ["ste"], "lambdas": 3,
                       "options": {"ste": {"epochs": 10**12}}}]  # fmt: skip
    with pytest.raises(ResourceError, match=r"match job .*ste.* for 1000000000000 epoch"):
        plan_run(parse_experiment(raw), tmp_path / "run")
    assert not (tmp_path / "run").exists()
