"""A training job killed half-way goes on from its last epoch save when the run is
started again (the store's resume files), and ends where an uninterrupted run ends."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmckit.cli import main
from lmckit.experiments.runner import run_experiment
from lmckit.experiments.schema import load_experiment
from tests.experiments.conftest import read_ledger

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"log": lambda _: None}
STEPS_PER_EPOCH = 1437 // 128  # digits' training set, full batches only


class CountedMLP(torch.nn.Module):
    """A user's MLP that appends a line to ``$LMCKIT_TEST_STEPS`` for every training step
    and kills its own process (SIGKILL: nothing gets to clean up) at the step numbered
    ``$LMCKIT_TEST_KILL_AT`` (counted in that file); likewise for eval-mode passes over the
    test set with ``$LMCKIT_TEST_EVALS`` and ``$LMCKIT_TEST_EVAL_KILL_AT``."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 32)
        self.out = torch.nn.Linear(32, 10)

    def forward(self, x):
        training = self.training and torch.is_grad_enabled()
        # evaluations are counted (and killed) apart: $LMCKIT_TEST_EVALS, ..._EVAL_KILL_AT
        suffix = "" if training else "_EVAL"
        log = os.environ.get("LMCKIT_TEST_STEPS" if training else "LMCKIT_TEST_EVALS")
        # evaluations: passes over digits' 360 test images in one batch (not the run's
        # timing passes of 256 examples or the checks' passes of two)
        if log and (training or (not self.training and len(x) == 360)):
            with open(log, "a") as fh:
                fh.write("step\n")
            kill_at = os.environ.get(f"LMCKIT_TEST{suffix}_KILL_AT")
            if kill_at and len(Path(log).read_text().splitlines()) == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
        return self.out(torch.relu(self.fc(x.flatten(1))))


EXPERIMENT = (
    'name = "counted"\nseeds = [0]\nthreads = 1\n'
    '[data]\ndataset = "digits"\n[model]\nname = "custom"\n'
    'class = "tests.experiments.test_resume_jobs:CountedMLP"\n'
    "[train]\nepochs = 4\nbatch_size = 128\n"
)


def steps_logged(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_killed(toml: Path, out: Path, **kill_at: int) -> list[Path]:
    """Run ``lmckit run TOML --out OUT`` in a process that CountedMLP kills where ``kill_at``
    (one environment variable) says; the one resume file it leaves, after ``lmckit status``
    (whose output the caller reads) ran on the folder."""
    env = {**os.environ, **{k: str(v) for k, v in kill_at.items()}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "lmckit.cli", "run", str(toml), "--out", str(out), "-q"]
    killed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    saved = list((out / "store" / "partial").glob("*.resume"))
    assert len(saved) == 1
    assert main(["status", str(out)]) == 0
    return saved


def test_a_killed_training_job_resumes_from_its_last_save(tmp_path, monkeypatch, capsys):
    (tmp_path / "e.toml").write_text(EXPERIMENT)
    experiment = load_experiment(tmp_path / "e.toml")
    log = tmp_path / "steps.log"
    monkeypatch.setenv("LMCKIT_TEST_STEPS", str(log))
    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")

    reference = tmp_path / "reference"
    run_experiment(experiment, reference, **QUIET)
    assert steps_logged(log) == 4 * STEPS_PER_EPOCH
    log.unlink()

    out = tmp_path / "run"
    # in the third epoch, after its second step was saved (every step: RESUME_EVERY=0)
    saved = run_killed(tmp_path / "e.toml", out, LMCKIT_TEST_KILL_AT=2 * STEPS_PER_EPOCH + 3)
    where = f"saved at step 2 of {STEPS_PER_EPOCH} of epoch 3 of 4"
    assert f"resumable: train/c0/seed0 {where}" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "e.toml"), "--out", str(out), "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert f"train/c0/seed0  running in run 1; resumes from its file, {where}" in (
        planned
    )  # SIGKILL left its row running
    assert "0 finished before, 0 failed before, 0 waiting, 1 resumable" in planned

    # a run in another folder taking this one's results (--reuse-from) goes on from its
    # resume file too, and leaves the file where it is
    log.unlink()
    kept = saved[0].read_bytes()
    moved = tmp_path / "moved"
    assert run_experiment(experiment, moved, reuse_from=[out], **QUIET).complete
    assert steps_logged(log) == 2 * STEPS_PER_EPOCH - 2
    assert saved[0].read_bytes() == kept
    assert not list((moved / "store" / "partial").glob("*.resume"))
    for metric in ("test_accuracy", "test_loss"):
        job = ("train/c0/seed0", metric)
        assert read_ledger(moved)[1][job] == read_ledger(reference)[1][job]

    log.unlink()
    summary = run_experiment(experiment, out, **QUIET)
    assert summary.complete
    assert steps_logged(log) == 2 * STEPS_PER_EPOCH - 2  # from step 3 of epoch 3 on
    assert not saved[0].exists()  # the resume file goes once the checkpoint is stored
    jobs, metrics = read_ledger(out)
    ref_jobs, ref_metrics = read_ledger(reference)
    job = "train/c0/seed0"
    assert jobs[job]["key"] == ref_jobs[job]["key"]
    assert metrics[(job, "test_accuracy")] == ref_metrics[(job, "test_accuracy")]
    assert metrics[(job, "test_loss")] == ref_metrics[(job, "test_loss")]
    key = jobs[job]["key"]
    weights = f"checkpoint/{key[:2]}/{key}/model.safetensors"
    assert (out / "store" / weights).read_bytes() == (reference / "store" / weights).read_bytes()
    # a resume file no job of the file owns (an edited file, a copied run folder) goes
    # once the run is complete
    stale = out / "store" / "partial" / ("0" * 64 + ".resume")
    stale.write_bytes(b"left over")
    assert run_experiment(experiment, out, **QUIET).complete and not stale.exists()


def test_a_bad_save_interval_fails_the_run_before_any_job(tmp_path, monkeypatch):
    from lmckit.resume import ResumeError

    (tmp_path / "e.toml").write_text(EXPERIMENT)
    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "often")
    with pytest.raises(ResumeError, match="LMCKIT_RESUME_EVERY must be a number"):
        run_experiment(load_experiment(tmp_path / "e.toml"), tmp_path / "run", **QUIET)
    assert not (tmp_path / "run" / "ledger.sqlite").exists()


CURVES = (
    EXPERIMENT.replace("seeds = [0]", "seeds = [0, 1]").replace("epochs = 4", "epochs = 1")
    + '[[compare]]\npairs = "all"\nmethods = ["none"]\nlambdas = 5\nsplits = { test = "all" }\n'
)


def test_a_killed_curve_job_goes_on_from_its_last_saved_point(tmp_path, monkeypatch, capsys):
    (tmp_path / "e.toml").write_text(CURVES)
    experiment = load_experiment(tmp_path / "e.toml")
    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")
    reference = tmp_path / "reference"
    assert run_experiment(experiment, reference, **QUIET).complete
    out = tmp_path / "run"
    assert run_experiment(experiment, out, only=["train/*"], **QUIET).complete
    # the curve's eval-mode forward passes per point, counted in a copy of the run
    evals = tmp_path / "evals.log"
    monkeypatch.setenv("LMCKIT_TEST_EVALS", str(evals))
    assert run_experiment(experiment, tmp_path / "counted", reuse_from=[out], **QUIET).complete
    per_point = steps_logged(evals) // 5
    assert per_point * 5 == steps_logged(evals) and per_point >= 1
    evals.unlink()

    # in the fourth point
    saved = run_killed(tmp_path / "e.toml", out, LMCKIT_TEST_EVAL_KILL_AT=3 * per_point + 1)
    assert "resumable: curve/b0/c0/0-1/none saved after point 3 of 5" in capsys.readouterr().out

    evals.unlink()
    # as a slice: a whole run that completes would remove any resume file left over
    assert run_experiment(experiment, out, only=["curve/*"], **QUIET).complete
    assert steps_logged(evals) == 2 * per_point  # points 4 and 5 only
    assert not saved[0].exists()  # the curve is stored: its file goes
    name = "curve/b0/c0/0-1/none"
    jobs, metrics = read_ledger(out)
    ref_jobs, ref_metrics = read_ledger(reference)
    assert jobs[name]["key"] == ref_jobs[name]["key"]
    curve = [m for m in metrics if m[0] == name]
    assert curve and all(metrics[m] == ref_metrics[m] for m in curve)
    key = jobs[name]["key"]
    stored = f"curve/{key[:2]}/{key}/curve.json"
    assert (out / "store" / stored).read_bytes() == (reference / "store" / stored).read_bytes()
