"""Integrity from what is read, never from what a file says about itself: checkpoints held to
every digest their sidecar records (any format version), keys from the bytes read, store
records authenticated, scratch of killed writers cleaned."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from lmckit.checkpoint import load_checkpoint, load_foreign, save_checkpoint
from lmckit.errors import CheckpointError
from lmckit.files import clean_stale, scratch_prefix
from lmckit.models import build_model, permutation_spec
from lmckit.store import Store, StoreError, make_key, meta_digest


def _checkpoint(tmp_path, name="m"):
    torch.manual_seed(0)
    save_checkpoint(tmp_path / name, build_model("mlp", in_dim=64, hidden=[16], out_dim=10))
    return tmp_path / f"{name}.safetensors", tmp_path / f"{name}.json"


def test_the_sidecars_whole_file_digest_must_match_the_weights(tmp_path):
    weights, sidecar = _checkpoint(tmp_path)
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "weights_sha256": "ab" * 32}))
    with pytest.raises(CheckpointError, match=r"m.safetensors has SHA-256 .* records abab"):
        load_checkpoint(weights)


def test_a_version_1_sidecar_is_held_to_the_digests_it_records(tmp_path):
    weights, sidecar = _checkpoint(tmp_path)
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "format_version": 1}))
    assert load_checkpoint(weights).weights_sha256 == meta["weights_sha256"]
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # one weight changed after the sidecar was written
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the SHA-256 digests"):
        load_checkpoint(weights)
    chunkless = {k: v for k, v in meta.items() if k != "weights_sha256_chunks"}
    sidecar.write_text(json.dumps({**chunkless, "format_version": 1}))
    with pytest.raises(CheckpointError, match="but its sidecar records"):
        load_checkpoint(weights)


def test_keys_come_from_the_bytes_read_not_from_the_sidecar(tmp_path):
    """A version-1 sidecar records no digest: the content hash results are keyed on is the
    SHA-256 of the weights as read — other weights, another key."""
    weights, sidecar = _checkpoint(tmp_path)
    meta = json.loads(sidecar.read_text())
    bare = {k: v for k, v in meta.items() if not k.startswith("weights_sha256")}
    sidecar.write_text(json.dumps({**bare, "format_version": 1}))
    first = load_checkpoint(weights).content_hash
    assert first == hashlib.sha256(weights.read_bytes()).hexdigest()
    torch.manual_seed(1)
    other = build_model("mlp", in_dim=64, hidden=[16], out_dim=10)
    save_checkpoint(tmp_path / "n", other)
    weights.write_bytes((tmp_path / "n.safetensors").read_bytes())  # same sidecar, new weights
    assert load_checkpoint(weights).content_hash != first


def test_a_foreign_file_is_hashed_and_parsed_from_the_same_bytes(tmp_path):
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=64, hidden=[16], out_dim=10)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    ckpt = load_foreign(tmp_path / "w.pt", model, permutation_spec(model), description={})
    assert ckpt.weights_sha256 == hashlib.sha256((tmp_path / "w.pt").read_bytes()).hexdigest()
    assert ckpt.files == (tmp_path / "w.pt",)  # what --out must never overwrite
    assert ckpt.content_hash != ckpt.weights_sha256  # a user's class: its code is keyed too


# -- the store: meta.json authenticated --------------------------------------------------------
def _stored(tmp_path):
    store = Store(tmp_path)

    def write(folder):
        (folder / "value.json").write_text("1")
        return "content", {"accuracy": 0.5}

    artifact, _ = store.get_or_compute("x", {"s": 1}, write)
    return store, artifact


def _edit(artifact, change, *, redigest=False):
    path = artifact.folder / "meta.json"
    meta = json.loads(path.read_text())
    change(meta)
    if redigest:
        meta["meta_sha256"] = meta_digest(meta)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("change", "redigest", "message"),
    [
        (lambda m: m["record"].update(accuracy=0.99), False, "does not match its own digest"),
        (lambda m: m.update(files={}), True, "holds files its meta.json does not list"),
        (lambda m: m["document"].update(settings={"s": 2}), True, "not the hash of the document"),
        (lambda m: m.update(content=3), True, "content hash is malformed"),
        (lambda m: m.pop("meta_sha256"), False, "does not match its own digest"),
    ],
)
def test_an_edited_store_record_is_an_error_not_a_result(tmp_path, change, redigest, message):
    store, artifact = _stored(tmp_path)
    _edit(artifact, change, redigest=redigest)
    with pytest.raises(StoreError, match=message):
        store.get("x", artifact.key)


def test_an_intact_record_is_reused_and_names_its_content(tmp_path):
    store, _ = _stored(tmp_path)
    again = store.get("x", make_key("x", {"s": 1})[0])
    assert again.record == {"accuracy": 0.5} and again.content == "content"


# -- scratch left by killed writers -----------------------------------------------------------
def test_scratch_of_dead_writers_is_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    mine = scratch_prefix("model.safetensors")
    theirs = mine.replace(f".{os.getpid()}.", f".{pid}.")
    (tmp_path / "store" / "x").mkdir(parents=True)
    keep = tmp_path / f"{mine}abc.part"
    stale_file = tmp_path / f"{theirs}abc.part"
    stale_dir = tmp_path / "store" / "x" / f"{theirs.replace('model.safetensors', 'k')}d.scratch"
    other_host = tmp_path / ".model.safetensors.elsewhere.1.abc.part"
    for path in (keep, stale_file, other_host):
        path.write_text("half")
    stale_dir.mkdir()
    (stale_dir / "half.json").write_text("{")
    removed = clean_stale(tmp_path)
    assert sorted(removed) == sorted([stale_file, stale_dir])
    assert keep.exists() and other_host.exists() and not stale_dir.exists()


def test_a_killed_run_leaves_no_scratch_after_the_next_one(tmp_path):
    """SIGKILL a training run mid-write (its atomic writes leave ``.part`` files): the next
    command holding the folder removes them."""
    from lmckit.files import locked_output

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / scratch_prefix("x.json").replace(
        f".{os.getpid()}.", f".{dead.stdout.strip()}."
    )
    stale = stale.with_name(stale.name + "q1.part")
    stale.write_text("half")
    with locked_output(tmp_path):
        pass
    assert not stale.exists()
