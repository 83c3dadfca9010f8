"""Hugging Face model folders in and out (lmckit.model_folder, `lmckit match|merge|spec` on
folders): small configs, random weights, written here with save_pretrained — no downloads."""

import hashlib
import json
import shutil

import pytest
import torch
from safetensors import safe_open

from lmckit.budget import ResourceError
from lmckit.cli import main
from lmckit.errors import CheckpointError
from lmckit.match import weight_matching
from lmckit.match.weight_matcher import MemoryNeed
from lmckit.model_folder import (
    is_model_folder,
    load_model_folder,
    output_names,
    read_layout,
    write_model_folder,
)
from lmckit.perm import Permutation

T = pytest.importorskip("transformers", reason="a dev dependency: pip install -e '.[dev]'")


def llama_config(**changes):
    base = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=50, max_position_embeddings=16,
    )  # fmt: skip
    return T.LlamaConfig(**{**base, **changes})


def gpt2_config():
    return T.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=16)


def save(folder, cls, config, seed, shard="20KB", dtype=None):
    torch.manual_seed(seed)
    model = cls(config)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(folder, max_shard_size=shard)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    out = {}
    for seed in (0, 1):
        out[f"llama{seed}"] = save(root / f"llama{seed}", T.LlamaForCausalLM, llama_config(), seed)
        out[f"gpt2{seed}"] = save(root / f"gpt2{seed}", T.GPT2LMHeadModel, gpt2_config(), seed)
    return out


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outputs64(folder_or_model, ids, params=None):
    model = folder_or_model
    if not isinstance(model, torch.nn.Module):
        model = type_of(folder_or_model).from_pretrained(folder_or_model, dtype=torch.float64)
    with torch.no_grad():
        if params is None:
            return model(ids).logits
        return torch.func.functional_call(model, params, (ids,), tie_weights=False).logits


def type_of(folder):
    name = json.loads((folder / "config.json").read_text())["architectures"][0]
    return getattr(T, name)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_planted_permutation_round_trips_through_folders(folders, tmp_path, name):
    """Acceptance: match → write → from_pretrained gives exactly the outputs of applying the
    permutation in memory (float64), for a sharded Llama and a GPT-2 with tied embeddings."""
    a = load_model_folder(folders[f"{name}0"])
    assert a.trace_report.permuted_fraction == 1.0
    planted = Permutation.random(a.spec, 7)
    write_model_folder(tmp_path / "b", a, perm=planted, about={"planted": True})
    b = load_model_folder(tmp_path / "b", spec=a.spec)
    result = weight_matching(a.spec, a.params, b.params)
    inverse = planted.inverse()
    assert all(torch.equal(result.perm[g], inverse[g]) for g in a.spec.groups)

    # B (seed 1) aligned onto A and written; reloaded, it computes what the permutation
    # applied in memory computes
    b = load_model_folder(folders[f"{name}1"], spec=a.spec)
    perm = weight_matching(a.spec, a.params, b.params).perm
    assert not perm.is_identity()
    write_model_folder(tmp_path / "aligned", b, perm=perm, about={"method": "wm"})
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(0))
    model64 = type_of(folders[f"{name}1"]).from_pretrained(folders[f"{name}1"], dtype=torch.float64)
    in_memory = perm.apply({k: v.double() for k, v in model64.state_dict().items()})
    expected = outputs64(model64, ids, in_memory)
    got = outputs64(tmp_path / "aligned", ids)
    assert torch.equal(got, expected)
    # ... and the permutation changed B's weights but not its function (RMSNorm rounds in
    # float32 whatever the weights' dtype: equal to float32 rounding)
    torch.testing.assert_close(got, outputs64(model64, ids), rtol=1e-5, atol=1e-5)


def test_written_folder_has_the_source_files_and_a_sidecar(folders, tmp_path):
    source = folders["llama1"]
    b = load_model_folder(source)
    layout = read_layout(source)
    assert len(layout.shards) > 2  # sharded, as the fixture asks
    perm = Permutation.random(b.spec, 3)
    written = write_model_folder(tmp_path / "out", b, perm=perm, about={"method": "test"})
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        output_names(layout)
    )
    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index == json.loads((source / "model.safetensors.index.json").read_text())
    sidecar = json.loads((out / "lmckit.json").read_text())
    assert sidecar["method"] == "test" and sidecar["format"] == "lmckit-model-folder"
    for name, digest in sidecar["files_sha256"].items():
        assert sha(out / name) == digest == written[name]
    # every tensor in the shard the index names, permuted as Permutation.apply permutes
    expected = perm.apply(b.params)
    for key, shard in index["weight_map"].items():
        with safe_open(out / shard, "pt") as fh:
            assert torch.equal(fh.get_tensor(key), expected[key]), key


def test_a_folder_written_again_keeps_none_of_the_earlier_models_files(folders, tmp_path):
    """Formerly a model folder written over a sharded one kept the old shards and an index
    naming them beside the new single file: two models' files in one folder (lmckit and
    transformers read the single file; anything that follows the index gets the old one)."""
    out = tmp_path / "out"
    sharded = load_model_folder(folders["llama0"])
    write_model_folder(out, sharded, perm=Permutation.random(sharded.spec, 3))
    assert (out / "model.safetensors.index.json").exists()
    (out / "notes.txt").write_text("the user's")
    single_dir = save(tmp_path / "single", T.LlamaForCausalLM, llama_config(), 2, shard="1GB")
    single = load_model_folder(single_dir)
    said = []
    write_model_folder(out, single, log=said.append)
    layout = read_layout(single_dir)
    assert layout.index is None  # one file: the index and every shard of the first must go
    found = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert found == sorted([*output_names(layout), "notes.txt"])
    assert "model.safetensors.index.json" in said[0]
    reloaded = load_model_folder(out)
    assert all(torch.equal(reloaded.params[k], v) for k, v in single.params.items())


def test_writing_over_the_source_is_refused(folders):
    from lmckit.errors import OutputPathError

    a = load_model_folder(folders["gpt20"])
    before = {p.name: sha(p) for p in folders["gpt20"].iterdir() if p.is_file()}
    with pytest.raises(OutputPathError, match="one of the inputs"):
        write_model_folder(folders["gpt20"], a, perm=Permutation.random(a.spec, 1))
    assert before == {p.name: sha(p) for p in folders["gpt20"].iterdir() if p.is_file()}


def test_stored_dtype_is_kept(tmp_path):
    """A bfloat16 folder is matched in float32 and written back in bfloat16, exactly (the
    streaming writer's bytes are what safetensors reads)."""
    src = save(tmp_path / "bf16", T.LlamaForCausalLM, llama_config(), 0, dtype=torch.bfloat16)
    a = load_model_folder(src)
    assert all(t.dtype == torch.float32 for t in a.params.values() if t.is_floating_point())
    perm = Permutation.random(a.spec, 1)
    write_model_folder(tmp_path / "out", a, perm=perm)
    source = {}
    for shard in read_layout(src).shards:
        with safe_open(src / shard, "pt") as fh:
            source.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
    expected = perm.apply(source)
    for shard in read_layout(tmp_path / "out").shards:
        with safe_open(tmp_path / "out" / shard, "pt") as fh:
            for k in fh.keys():  # noqa: SIM118
                t = fh.get_tensor(k)
                assert t.dtype == torch.bfloat16 and torch.equal(t, expected[k]), k


def broken(folders, tmp_path, what):
    folder = tmp_path / what
    shutil.copytree(folders["llama0"], folder)
    return folder


def test_bad_folders_are_one_clear_line(folders, tmp_path):
    no_config = broken(folders, tmp_path, "no-config")
    (no_config / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        load_model_folder(no_config)
    (tmp_path / "folders.txt").write_text("a file given where a folder belongs\n")
    with pytest.raises(CheckpointError, match=r"is a file, not a model folder"):
        read_layout(tmp_path / "folders.txt")
    with pytest.raises(CheckpointError, match=r"model folder .* not found"):
        read_layout(no_config / "absent")

    missing = broken(folders, tmp_path, "missing-shard")
    shard = sorted(read_layout(missing).shards)[1]
    (missing / shard).unlink()
    with pytest.raises(CheckpointError, match=f"shard {shard} named by .* is missing"):
        load_model_folder(missing)

    wrong_map = broken(folders, tmp_path, "wrong-map")
    index = json.loads((wrong_map / "model.safetensors.index.json").read_text())
    key = next(iter(index["weight_map"]))
    elsewhere = sorted(set(index["weight_map"].values()) - {index["weight_map"][key]})[0]
    index["weight_map"][key] = elsewhere
    (wrong_map / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"puts tensor '{key}'"):
        load_model_folder(wrong_map)

    dropped = broken(folders, tmp_path, "dropped-key")
    index = json.loads((dropped / "model.safetensors.index.json").read_text())
    del index["weight_map"][key]
    (dropped / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"not in model\.safetensors\.index\.json"):
        load_model_folder(dropped)

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(folders["llama0"] / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin, which are pickles"):
        load_model_folder(pickled)

    nan = tmp_path / "nan"
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(llama_config())
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(nan)
    with pytest.raises(CheckpointError, match=r"up_proj.weight' has 1 NaN"):
        load_model_folder(nan)

    other = save(tmp_path / "wider", T.LlamaForCausalLM, llama_config(intermediate_size=64), 0)
    (other / "config.json").write_text((folders["llama0"] / "config.json").read_text())
    with pytest.raises(CheckpointError, match="shapes do not fit"):
        load_model_folder(other)
    assert not is_model_folder(tmp_path / "nothing-here")


def test_max_memory_is_honoured_or_refused(folders):
    a = load_model_folder(folders["gpt20"])
    b = load_model_folder(folders["gpt21"], spec=a.spec)
    need = MemoryNeed.of(a.spec, a.params, b.params)
    sizes = [n for n in a.spec.groups.values()]
    assert need.kept_costs == sum(4 * n * n for n in sizes)  # one float32 matrix per group
    # GPT-2's head is its embedding: counted once per model
    tied = a.params["lm_head.weight"].numel() * 4
    assert need.models == 2 * (sum(t.numel() * 4 for t in a.params.values()) - tied)
    assert need.working == max(sizes) ** 2 * (4 + 8)  # a float32 matrix, float64 LAP costs
    free = weight_matching(a.spec, a.params, b.params)
    # between the two needs: every cost matrix formed anew, the same permutations
    tight = weight_matching(a.spec, a.params, b.params, max_memory=need.total - 1)
    assert all(torch.equal(free.perm[g], tight.perm[g]) for g in a.spec.groups)
    with pytest.raises(ResourceError, match="weight matching needs at least"):
        weight_matching(a.spec, a.params, b.params, max_memory=need.without_kept_costs - 1)


def run(argv, capsys):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_match_writes_an_aligned_folder(folders, tmp_path, capsys):
    code, out, _ = run(
        ["match", folders["gpt20"], folders["gpt21"], "--out", tmp_path / "p.json",
         "--aligned", tmp_path / "aligned", "-q"], capsys,
    )  # fmt: skip
    assert code == 0, out
    sidecar = json.loads((tmp_path / "aligned" / "lmckit.json").read_text())
    assert sidecar["inputs"]["b"]["path"] == str(folders["gpt21"])
    assert sidecar["inputs"]["a"]["files_sha256"]["config.json"] == sha(
        folders["gpt20"] / "config.json"
    )
    model = T.GPT2LMHeadModel.from_pretrained(tmp_path / "aligned")
    source = T.GPT2LMHeadModel.from_pretrained(folders["gpt21"])
    where = "_name_or_path"
    assert {**model.config.to_dict(), where: 0} == {**source.config.to_dict(), where: 0}


def test_cli_refuses_bad_requests_before_writing(folders, tmp_path, capsys):
    other = save(tmp_path / "llama-wide", T.LlamaForCausalLM, llama_config(hidden_size=64), 0)
    cases = [
        ([folders["llama0"], other], "different architectures: .* hidden_size 32 vs 64"),
        ([folders["llama0"], folders["gpt20"]], "different architectures"),
        ([folders["llama0"], folders["llama1"], "--max-memory", "1K"], "more than --max-memory"),
        ([folders["llama0"], tmp_path / "empty"], "no Hugging Face model folder"),
    ]
    (tmp_path / "empty").mkdir()
    capsys.readouterr()  # save_pretrained's progress bar
    for argv, message in cases:
        code, _, err = run(
            ["match", *argv, "--out", tmp_path / "out" / "p.json", "--aligned", tmp_path / "al"],
            capsys,
        )
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
        assert pytest.importorskip("re").search(message, err), err
        assert not (tmp_path / "out").exists() and not (tmp_path / "al").exists()
    code, _, err = run(
        ["match", folders["gpt20"], folders["gpt21"], "--out", tmp_path / "x", "--aligned",
         tmp_path / "x"], capsys,
    )  # fmt: skip
    assert code == 2 and "both name" in err and not (tmp_path / "x").exists()


def test_cli_merge_folders(folders, tmp_path, capsys):
    code, out, _ = run(
        ["merge", folders["llama0"], folders["llama1"], "--method", "average", "--out",
         tmp_path / "m", "-q"], capsys,
    )  # fmt: skip
    assert code == 0, out
    merged = T.LlamaForCausalLM.from_pretrained(tmp_path / "m" / "merged").state_dict()
    a = T.LlamaForCausalLM.from_pretrained(folders["llama0"]).state_dict()
    b = T.LlamaForCausalLM.from_pretrained(folders["llama1"]).state_dict()
    for k in a:
        torch.testing.assert_close(merged[k], (a[k] + b[k]) / 2, rtol=0, atol=1e-7)
    code, _, err = run(
        ["merge", folders["llama0"], folders["llama1"], "--method", "ste-mm", "--out",
         tmp_path / "m2"], capsys,
    )  # fmt: skip
    assert code == 2 and "needs data" in err and not (tmp_path / "m2").exists()
    inside = [p.name for p in folders["llama1"].iterdir()]
    for out in (folders["llama1"], folders["llama1"] / "merged"):
        code, _, err = run(
            ["merge", folders["llama0"], folders["llama1"], "--method", "average", "--out", out],
            capsys,
        )
        assert code == 2 and "inside the input model folder" in err
    assert [p.name for p in folders["llama1"].iterdir()] == inside


def test_cli_spec_of_a_folder(folders, capsys):
    code, out, _ = run(["spec", folders["llama0"]], capsys)
    assert code == 0
    assert "100.0% of the parameters in permuted tensors" in out


def test_frozen_tensors_are_named_before_the_match(tmp_path, capsys):
    """An encoder–decoder folder (example decoder ids made from its config) that the tracer
    cannot cover completely: the tensors that stay as they are, and why, come on stderr
    before the match."""
    config = T.BartConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=24,
        decoder_ffn_dim=24, max_position_embeddings=16,
    )  # fmt: skip
    for seed in (0, 1):
        save(tmp_path / f"bart{seed}", T.BartForConditionalGeneration, config, seed)
    capsys.readouterr()
    a = load_model_folder(tmp_path / "bart0")
    assert 0.99 < a.trace_report.permuted_fraction < 1.0
    stuck = [k for k, axes in a.spec.axes.items() if all(g is None for g in axes)]
    stuck = [k for k in stuck if k not in a.trace_report.aliases]
    code, _, err = run(
        ["match", tmp_path / "bart0", tmp_path / "bart1", "--out", tmp_path / "p.json", "-q"],
        capsys,
    )
    assert code == 0
    note = err.strip().splitlines()[0]
    assert note.startswith("note: ") and "stay as they are" in note
    assert all(k in note for k in stuck[:3]), (stuck, note)


def test_aligned_into_a_users_folder_is_refused_and_changes_nothing(folders, tmp_path, capsys):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "config.json").write_text("my own")
    code, _, err = run(
        ["match", folders["gpt20"], folders["gpt21"], "--out", tmp_path / "p.json",
         "--aligned", users, "-q"], capsys,
    )  # fmt: skip
    assert code == 2 and "was not written by lmckit" in err
    assert (users / "config.json").read_text() == "my own"
    # every output is checked before any is listed as lmckit's: no file list, no lock left
    assert sorted(p.name for p in users.iterdir()) == ["config.json"]


def test_cli_match_beyond_permutations_writes_b_in_the_original_layout(tmp_path, capsys):
    """``--symmetries orth --aligned``: B rotated (Llama's RMSNorm stream, gains folded) and
    written back with A's norm gains — a folder from_pretrained loads, computing B's function,
    whose gains are A's and whose weights are closer to A's than B's are."""
    sources = {}
    for seed in (0, 1):  # norm gains away from their initial ones, so that A's are A's
        torch.manual_seed(seed)
        model = T.LlamaForCausalLM(llama_config())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        model.save_pretrained(tmp_path / f"llama{seed}", max_shard_size="20KB")
        sources[seed] = tmp_path / f"llama{seed}"
    folders = {"llama0": sources[0], "llama1": sources[1]}
    code, out, err = run(
        ["match", folders["llama0"], folders["llama1"], "--symmetries", "orth", "--out",
         tmp_path / "t.json", "--aligned", tmp_path / "aligned", "-q"], capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "orthogonal" in out and "A's norm gains" in out
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    moved, b = outputs64(tmp_path / "aligned", ids), outputs64(folders["llama1"], ids)
    assert ((moved - b).abs().max() / b.abs().max()).item() < 1e-5
    a_model = T.LlamaForCausalLM.from_pretrained(folders["llama0"])
    b_model = T.LlamaForCausalLM.from_pretrained(folders["llama1"])
    aligned = T.LlamaForCausalLM.from_pretrained(tmp_path / "aligned")
    a_sd, b_sd, al_sd = (m.state_dict() for m in (a_model, b_model, aligned))
    gains = [k for k in a_sd if k.endswith("norm.weight")]
    assert gains and all(torch.equal(al_sd[k], a_sd[k]) for k in gains)
    assert not any(torch.equal(b_sd[k], a_sd[k]) for k in gains)

    def distance(x):
        return sum(float((x[k] - a_sd[k]).double().pow(2).sum()) for k in a_sd) ** 0.5

    assert distance(al_sd) < distance(b_sd)


def test_work_that_needs_data_refuses_folders_before_reading_them(folders, tmp_path, capsys):
    """Folders record no dataset: a data-driven match, an interpolation, an analysis on data
    and a data-driven merge are refused in one line before any folder is hashed, loaded
    and traced (they were refused only after that work)."""
    a, b = str(folders["gpt20"]), str(folders["gpt21"])
    for argv in (
        ["match", a, b, "--method", "am", "--out", str(tmp_path / "p.json")],
        ["match", a, b, "--method", "ste", "--out", str(tmp_path / "p.json")],
        ["interpolate", a, b, "--out", str(tmp_path / "i")],
        ["analyze", a, b, "--out", str(tmp_path / "a")],
        ["merge", a, b, "--method", "ste-mm", "--out", str(tmp_path / "m")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model folder" in err[0], (argv, err)
    assert not any(tmp_path.iterdir())
