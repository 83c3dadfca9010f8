"""Merging checkpoints: the checks before the work, model-count ranges."""

import shutil

import pytest

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.errors import UsageError
from lmckit.models import build_model
from lmckit.workflows.merging import check_checkpoints, merge_checkpoints, parse_range


def test_a_checkpoint_given_twice_is_refused(tmp_path):
    for seed in (0, 1):
        save_checkpoint(tmp_path / f"m{seed}", build_model("mlp", in_dim=8, hidden=[4]))
    a, b = (load_checkpoint(tmp_path / f"m{s}") for s in (0, 1))
    check_checkpoints([a, b])
    with pytest.raises(UsageError, match="given twice"):
        check_checkpoints([a, b, load_checkpoint(tmp_path / "m0.json")])
    for suffix in (".safetensors", ".json"):
        shutil.copy(tmp_path / f"m1{suffix}", tmp_path / f"copy{suffix}")
    with pytest.raises(UsageError, match="identical weights"):
        check_checkpoints([a, b, load_checkpoint(tmp_path / "copy")])
    with pytest.raises(UsageError, match="at least two"):
        check_checkpoints([a])
    with pytest.raises(UsageError, match="unknown merging method"):
        merge_checkpoints([a, b], "mean-of-everything", None)


def test_model_count_ranges():
    assert parse_range("2..5") == [2, 3, 4, 5]
    assert parse_range("4") == [2, 3, 4]
    for bad in ("1..3", "5..2", "a", "2..x", "", "2...4"):
        with pytest.raises(UsageError):
            parse_range(bad)


def test_a_sweep_over_other_checkpoints_in_the_same_folder_recomputes(tmp_path, digits):
    """Formerly a file-existence cache: the second set of checkpoints got the first set's
    merged accuracy."""
    from lmckit.workflows.merging import sweep
    from tests.zoo import train_mlp

    paths = []
    for seed in range(4):
        save_checkpoint(
            tmp_path / f"m{seed}",
            train_mlp(digits, seed, hidden=(16,), epochs=2),
            {"dataset": "digits"},
        )
        paths.append(tmp_path / f"m{seed}")
    ckpts = [load_checkpoint(p) for p in paths]
    quiet = {"log": lambda _: None}
    first = sweep(ckpts[:2], ["star-wm"], [2], digits, tmp_path / "out", **quiet)
    second = sweep(ckpts[2:], ["star-wm"], [2], digits, tmp_path / "out", **quiet)
    fresh = sweep(ckpts[2:], ["star-wm"], [2], digits, tmp_path / "fresh", **quiet)
    drop = {"seconds"}

    def strip(result):
        return {k: v for k, v in result["star-wm"][2].items() if k not in drop}

    assert strip(second) == strip(fresh)
    assert strip(second) != strip(first)
    again = sweep(ckpts[2:], ["star-wm"], [2], digits, tmp_path / "out", **quiet)
    assert again == second  # the same inputs again: the stored result, seconds included


class Killed(Exception):
    """Stands for the process being killed in the middle of an epoch."""


def kill_in_epoch_2(event):
    if event.metrics["epoch"] == 2:
        raise Killed


STE_MM_OPTIONS = {"epochs": 3, "lr": 1e-2, "batch_size": 256}


@pytest.fixture(scope="module")
def three_checkpoints(digits, tmp_path_factory):
    """Three small MLPs trained 2 epochs on digits, saved and loaded as checkpoints."""
    from tests.zoo import train_mlp

    folder = tmp_path_factory.mktemp("three")
    for seed in range(3):
        save_checkpoint(folder / f"m{seed}", train_mlp(digits, seed, hidden=(16,), epochs=2),
                        {"dataset": "digits"})  # fmt: skip
    return [load_checkpoint(folder / f"m{seed}") for seed in range(3)]


def test_a_killed_ste_mm_merge_goes_on_from_its_store_resume_file(
    tmp_path, digits, monkeypatch, three_checkpoints
):
    """The store hands STE-MM a resume file under ``partial/`` keyed like the merge: killed
    in its second epoch and called again, the merge trains the remaining epochs only, ends
    with the metrics of a merge never interrupted, and the file is gone."""
    from lmckit.store import Store
    from lmckit.workflows.merging import stored_merge_metrics

    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")
    ckpts, options = three_checkpoints, STE_MM_OPTIONS
    store = Store(tmp_path / "store")
    with pytest.raises(Killed):
        stored_merge_metrics(store, ckpts, "ste-mm", digits, progress=kill_in_epoch_2, **options)
    [saved] = (tmp_path / "store" / "partial").glob("*.resume")
    epochs = []
    record = lambda event: epochs.append(event.metrics["epoch"])  # noqa: E731
    resumed, reused = stored_merge_metrics(store, ckpts, "ste-mm", digits, progress=record,
                                           **options)  # fmt: skip
    assert not reused and set(epochs) == {2, 3} and not saved.exists()
    fresh, _ = stored_merge_metrics(Store(tmp_path / "fresh"), ckpts, "ste-mm", digits, **options)
    drop = {"seconds"}
    assert {k: v for k, v in resumed.items() if k not in drop} == {
        k: v for k, v in fresh.items() if k not in drop
    }


def test_a_killed_merge_command_goes_on_from_its_resume_file(
    tmp_path, digits, monkeypatch, three_checkpoints
):
    """``lmckit merge --method ste-mm`` keeps its state in ``OUT/ste-mm.resume``: killed in
    its second epoch, the same call trains the rest and writes the merged checkpoint of an
    uninterrupted call, bit for bit; the file is gone afterwards."""
    from lmckit.workflows.merging import run_merge

    monkeypatch.setenv("LMCKIT_RESUME_EVERY", "0")
    ckpts, options = three_checkpoints, STE_MM_OPTIONS
    with pytest.raises(Killed):
        run_merge(ckpts, "ste-mm", digits, tmp_path / "out",
                  progress=lambda name: kill_in_epoch_2, **options)  # fmt: skip
    assert (tmp_path / "out" / "ste-mm.resume").exists()
    epochs = []
    record = lambda name: lambda event: epochs.append(event.metrics["epoch"])  # noqa: E731
    run_merge(ckpts, "ste-mm", digits, tmp_path / "out", progress=record, **options)
    assert set(epochs) == {2, 3}  # the first epoch was not trained again
    run_merge(ckpts, "ste-mm", digits, tmp_path / "fresh", **options)
    merged = (tmp_path / "out" / "merged.safetensors").read_bytes()
    assert merged == (tmp_path / "fresh" / "merged.safetensors").read_bytes()
    assert not (tmp_path / "out" / "ste-mm.resume").exists()
