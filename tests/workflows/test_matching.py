"""Matching checkpoints by name, permutation files, and the checks before the work."""

import json

import pytest

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.data import load_dataset
from lmckit.errors import PermutationError, UsageError
from lmckit.models import build_model
from lmckit.workflows.matching import (
    check_data_fits,
    check_same_architecture,
    load_permutation,
    match_checkpoints,
    save_match,
)


@pytest.fixture
def pair(tmp_path):
    for seed in (0, 1):
        save_checkpoint(
            tmp_path / f"m{seed}", build_model("mlp", in_dim=64, hidden=[16], out_dim=10)
        )
    return [load_checkpoint(tmp_path / f"m{s}") for s in (0, 1)]


def test_options_reach_the_method_and_inapplicable_ones_are_refused(pair, digits):
    a, b = pair
    wm = match_checkpoints(a, b, "wm-fast", epochs=None, lr=None, restarts=2)
    assert wm.info["restart_objectives"] and wm.method == "weight_matching[warm]"
    ste = match_checkpoints(a, b, "ste", digits, epochs=1, lr=None, batch_size=512)
    assert ste.info["lr"] == 1e-3 and ste.iterations == 3
    with pytest.raises(UsageError, match=r"'wm-fast' takes no option\(s\) \['epochs', 'lr'\]"):
        match_checkpoints(a, b, "wm-fast", epochs=3, lr=0.5)
    with pytest.raises(UsageError, match=r"'ste' takes no option\(s\) \['restarts'\]"):
        match_checkpoints(a, b, "ste", digits, restarts=2)
    with pytest.raises(UsageError, match="epochs must be an integer ≥ 1, got True"):
        match_checkpoints(a, b, "ste", digits, epochs=True)
    with pytest.raises(UsageError, match="needs data"):
        match_checkpoints(a, b, "am")
    with pytest.raises(UsageError, match="unknown matching method"):
        match_checkpoints(a, b, "magic")


def test_permutation_files_round_trip_and_bad_ones_are_named(pair, tmp_path):
    a, b = pair
    result = match_checkpoints(a, b, "wm")
    save_match(tmp_path / "p.json", result)
    assert load_permutation(tmp_path / "p.json", a.spec) == result.perm
    (tmp_path / "bare.json").write_text(json.dumps(result.perm.to_dict()))
    assert load_permutation(tmp_path / "bare.json", a.spec) == result.perm
    cases = {
        "list.json": [1, 2],
        "strings.json": {"hidden0": "abc"},
        "floats.json": {"hidden0": [0.5] * 16},
        "nested.json": {"format": "lmckit-permutation", "perm": 3},
        "groups.json": {"format": "lmckit-permutation", "groups": {"x": 3}, "perm": {}},
        "short.json": {"hidden0": [0, 1]},
    }
    for name, content in cases.items():
        (tmp_path / name).write_text(json.dumps(content))
        with pytest.raises(PermutationError, match=name):
            load_permutation(tmp_path / name, a.spec)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(PermutationError, match="cannot read permutation file"):
        load_permutation(tmp_path / "junk.json", a.spec)


def test_data_and_architectures_that_do_not_fit_are_usage_errors(pair, tmp_path):
    a, _ = pair
    save_checkpoint(tmp_path / "other", build_model("mlp", in_dim=64, hidden=[8], out_dim=10))
    other = load_checkpoint(tmp_path / "other")
    with pytest.raises(UsageError, match="different architectures"):
        check_same_architecture(a, other)
    with pytest.raises(UsageError, match=r"dataset synthetic \(inputs \(32,\), 4 classes\)"):
        check_data_fits(a, load_dataset("synthetic"))
    save_checkpoint(tmp_path / "c3", build_model("mlp", in_dim=64, hidden=[8], out_dim=3))
    with pytest.raises(UsageError, match=r"the model has \(3,\) outputs"):
        check_data_fits(load_checkpoint(tmp_path / "c3"), load_dataset("digits"))


def test_a_changed_spec_is_another_permutation_key(pair, tmp_path):
    """A stored permutation is keyed on the spec it was found over: the same checkpoints
    under a spec that changed (here: heads as whole blocks instead of head-structured
    groups) must not reuse it."""
    import torch

    from lmckit.store import Store
    from lmckit.tracing import trace
    from lmckit.workflows.matching import match_key, spec_digest, stored_match

    torch.manual_seed(0)
    model = build_model("transformer", in_dim=8, length=8, dim=12, depth=1, heads=3)
    x = torch.randn(2, 8, 8)
    inner, whole = trace(model, x), trace(model, x, inside_blocks=False)
    assert spec_digest(inner) == spec_digest(trace(model, x)) != spec_digest(whole)
    keys = {match_key("wm-fast", 0, {}, "a", "b", None, spec_digest(s))[0] for s in (inner, whole)}
    assert len(keys) == 2
    a, b = pair
    _, stored, _ = stored_match(Store(tmp_path / "store"), a, b, "wm-fast")
    assert stored.meta["document"]["settings"]["spec"] == spec_digest(a.spec)


def test_a_permutation_file_of_another_pair_is_refused(pair, tmp_path, capsys):
    """The file names the pair it aligns by content hash: given with another A or B, it is
    refused naming which (it was applied without a word); a file without hashes (another
    tool's) is taken as it is."""
    from lmckit.cli import main
    from lmckit.workflows.matching import check_pair_record, pair_record

    a, b = pair
    save_checkpoint(tmp_path / "m2", build_model("mlp", in_dim=64, hidden=[16], out_dim=10))
    c = load_checkpoint(tmp_path / "m2")
    result = match_checkpoints(a, b, "wm", None)
    path = tmp_path / "ab.json"
    save_match(path, result, **pair_record(a, b))
    assert json.loads(path.read_text())["b_sha256"] == b.content_hash
    check_pair_record(path, a, b)
    with pytest.raises(UsageError, match=r"aligns another pair: its B \(recorded .*m1"):
        check_pair_record(path, a, c)
    with pytest.raises(UsageError, match=r"its A \(recorded .*m0.*\) and B"):
        check_pair_record(path, c, a)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"perm": result.perm.to_dict()}))
    check_pair_record(bare, a, c)
    out = tmp_path / "curves"
    argv = ["interpolate", str(a.path), str(c.path), "--perm", str(path), "--out", str(out)]
    assert main([*argv, "--dataset", "digits", "-q"]) == 2
    assert "aligns another pair" in capsys.readouterr().err and not out.exists()


def test_match_to_files_writes_what_match_checkpoints_finds_with_both_digests(pair, tmp_path):
    """``lmckit match``'s work from Python: the permutation file holds the permutation
    ``match_checkpoints`` returns for the same seed, and the two inputs' digests."""
    import hashlib

    from lmckit.workflows.matching import match_to_files

    a, b = pair
    out = tmp_path / "out" / "p.json"
    out.parent.mkdir()
    result = match_to_files(a, b, "wm-fast", None, out, seed=3)
    expected = match_checkpoints(a, b, "wm-fast", seed=3)
    stored = load_permutation(out, a.spec)
    assert stored == result.alignment == expected.alignment
    record = json.loads(out.read_text())
    assert record["a_sha256"] == hashlib.sha256(a.path.read_bytes()).hexdigest()
    assert record["b_sha256"] == hashlib.sha256(b.path.read_bytes()).hexdigest()
    from lmckit.files import folder_holder

    assert folder_holder(out.parent) is None  # the folder is let go


def test_match_to_files_never_writes_over_an_input_or_a_users_file(pair, tmp_path):
    """Called from Python (no command line checking first): ``out`` naming one of the
    inputs' files, or a file lmckit did not write, is refused before any work; both stay."""
    from lmckit.errors import OutputPathError
    from lmckit.workflows.matching import match_to_files

    a, b = pair
    sidecar = a.path.with_suffix(".json")
    before = sidecar.read_bytes()
    with pytest.raises(OutputPathError, match="one of the inputs"):
        match_to_files(a, b, "wm-fast", None, sidecar)
    assert sidecar.read_bytes() == before
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    with pytest.raises(OutputPathError, match="not a file lmckit wrote"):
        match_to_files(a, b, "wm-fast", None, notes)
    assert notes.read_text() == '{"mine": 1}'
    with pytest.raises(UsageError, match="B is not one"):
        match_to_files(a, b, "wm-fast", None, tmp_path / "p.json", aligned=tmp_path / "al")
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "al").exists()
