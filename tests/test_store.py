"""The result store: keys of everything that determines a result, exact reuse, atomic and
verified artifacts."""

import json

import pytest

import lmckit.store as store_module
from lmckit.store import Store, StoreError, canonical_json, make_key


def writer(value, calls):
    def write(folder):
        calls.append(value)
        (folder / "value.json").write_text(json.dumps(value))
        return f"content-{value}", {"value": value}

    return write


def test_every_part_of_the_key_matters(monkeypatch):
    base = make_key("curve", {"lambdas": 5}, {"a": "1", "b": "2"}, "data")[0]
    assert make_key("curve", {"lambdas": 5}, {"b": "2", "a": "1"}, "data")[0] == base
    assert make_key("curve", {"lambdas": 6}, {"a": "1", "b": "2"}, "data")[0] != base
    assert make_key("curve", {"lambdas": 5}, {"a": "1", "b": "3"}, "data")[0] != base
    assert make_key("curve", {"lambdas": 5}, {"a": "1", "b": "2"}, "other")[0] != base
    assert make_key("permutation", {"lambdas": 5}, {"a": "1", "b": "2"}, "data")[0] != base
    monkeypatch.setattr(store_module, "__version__", "9.9.9")
    assert make_key("curve", {"lambdas": 5}, {"a": "1", "b": "2"}, "data")[0] != base
    assert canonical_json({"b": 1, "a": (1, 2)}) == '{"a":[1,2],"b":1}'


def test_reuse_only_on_an_exact_key(tmp_path):
    store, calls = Store(tmp_path), []
    first, reused = store.get_or_compute("x", {"s": 1}, writer(1, calls), inputs={"a": "h"})
    assert not reused and first.content == "content-1" and first.record == {"value": 1}
    again, reused = store.get_or_compute("x", {"s": 1}, writer(2, calls), inputs={"a": "h"})
    assert reused and again.key == first.key and calls == [1]
    other, reused = store.get_or_compute("x", {"s": 2}, writer(3, calls), inputs={"a": "h"})
    assert not reused and other.key != first.key and calls == [1, 3]
    meta = json.loads((first.folder / "meta.json").read_text())
    assert meta["document"]["settings"] == {"s": 1} and meta["document"]["inputs"] == {"a": "h"}


def test_damaged_artifacts_are_errors_and_failed_writes_leave_nothing(tmp_path):
    store, calls = Store(tmp_path), []
    artifact, _ = store.get_or_compute("x", {"s": 1}, writer(1, calls))
    artifact.file("value.json").write_text("tampered")
    with pytest.raises(StoreError, match=r"value.json is missing or damaged"):
        store.get_or_compute("x", {"s": 1}, writer(1, calls))

    def fails(folder):
        (folder / "half.json").write_text("{")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        store.get_or_compute("x", {"s": 2}, fails)
    key = make_key("x", {"s": 2})[0]
    assert store.get("x", key) is None
    leftovers = [p for p in store.folder("x", key).parent.iterdir() if p.name != artifact.key]
    assert leftovers == []  # no scratch folder, no half-written artifact


def test_a_resume_file_of_another_store_is_copied_once_and_only_if_readable(tmp_path):
    import torch

    from lmckit.resume import load_resume_state, save_resume_state

    old, key, damaged = tmp_path / "old", "a" * 64, "b" * 64
    (old / "partial").mkdir(parents=True)
    save_resume_state(old / "partial" / f"{key}.resume", {"w": torch.ones(3)}, {"epoch": 2}, {})
    (old / "partial" / f"{damaged}.resume").write_bytes(b"cut short")
    kept = (old / "partial" / f"{key}.resume").read_bytes()

    assert not Store(tmp_path / "alone").resume_file(key).exists()
    store = Store(tmp_path / "new", reuse_from=[old])
    path = store.resume_file(key)
    assert path == tmp_path / "new" / "partial" / f"{key}.resume"
    tensors, info = load_resume_state(path, {})
    assert torch.equal(tensors["w"], torch.ones(3)) and info == {"epoch": 2}
    # the job's own saves go to its copy; the other store's file stays as it was
    save_resume_state(path, {"w": torch.zeros(3)}, {"epoch": 3}, {})
    assert load_resume_state(store.resume_file(key), {})[1] == {"epoch": 3}
    assert (old / "partial" / f"{key}.resume").read_bytes() == kept
    # a file that cannot be read is not copied: deleting the copy would bring it back
    assert not store.resume_file(damaged).exists()
