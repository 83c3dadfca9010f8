"""Every architecture the tracer verifies, from a Hugging Face model folder to an aligned and
a merged model folder and back: the folder written holds exactly the source folder's
tensor names, shapes and dtypes (``transformers`` loads some architectures under other
names — a ViT folder's ``…attention.attention.key.weight`` is the model's
``…attention.k_proj.weight`` — and writes them back under the folder's), and reloaded it
computes what the permutation computes in memory. Small configs, random weights, written
here with ``save_pretrained``."""

from __future__ import annotations

import pytest
import torch

from lmckit.match import weight_matching
from lmckit.model_folder import (
    example_inputs,
    load_model_folder,
    load_model_folders,
    read_layout,
    write_model_folder,
)
from lmckit.params import average_params

T = pytest.importorskip("transformers", reason="a dev dependency: pip install -e '.[dev]'")

ARCHITECTURES = {
    "vit": lambda: T.ViTForImageClassification(T.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
        image_size=16, patch_size=8, num_labels=5)),
    "bert": lambda: T.BertForSequenceClassification(T.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=24, max_position_embeddings=16, num_labels=3)),
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=1, num_heads=4,
        decoder_start_token_id=0)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=2, n_head=4, n_positions=16)),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)),
    # one key/value head; query, key and value fused per head; a fused projection sliced
    "llama-multi-query": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=16)),
    "gpt-neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=16, rotary_pct=0.5)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
        pad_token_id=0)),
    "convnext": lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5,
        image_size=32)),
    "mobilenet": lambda: T.MobileNetV2ForImageClassification(T.MobileNetV2Config(
        image_size=32, depth_multiplier=0.35, num_labels=5)),
}  # fmt: skip


def _outputs(model, args, kwargs, params=None):
    with torch.no_grad():
        out = (
            model(*args, **kwargs)
            if params is None
            else torch.func.functional_call(model, params, args, kwargs, tie_weights=False)
        )
    return out.logits


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_an_aligned_and_a_merged_folder_keep_the_folders_own_tensor_names(name, tmp_path):
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = ARCHITECTURES[name]()
        model.save_pretrained(tmp_path / f"{name}{seed}")
        folders.append(tmp_path / f"{name}{seed}")
    a, b = load_model_folders(folders)
    source = read_layout(folders[1])
    perm = weight_matching(a.spec, a.params, b.params).perm
    assert not perm.is_identity()
    write_model_folder(tmp_path / "aligned", b, perm=perm)
    written = read_layout(tmp_path / "aligned")
    assert {n: (e.shape, e.dtype) for n, e in written.tensors.items()} == {
        n: (e.shape, e.dtype) for n, e in source.tensors.items()
    }
    # reloaded by transformers, the aligned folder computes B's function (a symmetry) and
    # what the permutation applied in memory computes: bit for bit with two threads; with
    # one (OMP_NUM_THREADS=1) PyTorch's CPU convolution rounds MobileNet's float32 outputs
    # of the two copies of the same weights differently, by 1.6e-6 relative (measured)
    args, kwargs = example_inputs(b.model, source.config)
    aligned = type(b.model).from_pretrained(tmp_path / "aligned").eval()
    moved = _outputs(b.model, args, kwargs, perm.apply(b.params))
    got = _outputs(aligned, args, kwargs)
    torch.testing.assert_close(got, moved, rtol=1e-5, atol=1e-6 * float(moved.abs().max()))
    torch.testing.assert_close(got, _outputs(b.model, args, kwargs), rtol=1e-4, atol=1e-5)
    # a merge: the average of A and aligned B, written in B's layout and read back
    merged = average_params([a.params, perm.apply(b.params)])
    write_model_folder(tmp_path / "merged", b, params=merged)
    back = load_model_folder(tmp_path / "merged", spec=a.spec)
    assert all(torch.equal(back.params[k], merged[k].to(back.params[k].dtype)) for k in merged)


def test_a_folder_whose_tensors_are_converted_on_load_is_refused_before_any_work(
    tmp_path, monkeypatch
):
    """Mixtral's experts are fused into one tensor per layer as transformers loads them: no
    folder tensor is one model tensor renamed, so the model cannot be written back in the
    folder's layout — said by check_writable (which match --aligned and merge call before
    their work) and by write_model_folder, and nothing is written."""
    from lmckit.errors import CheckpointError
    from lmckit.model_folder import check_writable

    torch.manual_seed(0)
    T.MixtralForCausalLM(T.MixtralConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=16,
    )).save_pretrained(tmp_path / "mixtral")  # fmt: skip
    ckpt = load_model_folder(tmp_path / "mixtral", trace=False)
    torch.manual_seed(1)
    T.MixtralForCausalLM(ckpt.model.config).save_pretrained(tmp_path / "mixtral1")
    other = load_model_folder(tmp_path / "mixtral1", trace=False)
    assert "experts" in "".join(read_layout(tmp_path / "mixtral").tensors)
    with pytest.raises(CheckpointError, match=r"cannot be written back.*converts its tensors"):
        check_writable(ckpt)
    with pytest.raises(CheckpointError, match="cannot be written back"):
        write_model_folder(tmp_path / "out", ckpt, params=ckpt.params)
    assert not (tmp_path / "out").exists()
    # merge refuses before it merges
    import lmckit.workflows.merging as merging
    from lmckit.workflows.merging import run_merge_folders

    def merged_first(*args, **kwargs):
        raise AssertionError("the merge ran before the folder was refused")

    monkeypatch.setattr(merging, "merge_checkpoints", merged_first)

    with pytest.raises(CheckpointError, match="cannot be written back"):
        run_merge_folders([other, ckpt], "average", tmp_path / "merged", log=lambda _: None)
    assert not (tmp_path / "merged" / "merged").exists()


def test_vit_folders_align_and_merge_from_the_command_line(tmp_path, capsys):
    from lmckit.cli import main

    for seed in (0, 1):
        torch.manual_seed(seed)
        ARCHITECTURES["vit"]().save_pretrained(tmp_path / f"vit{seed}")
    a, b = str(tmp_path / "vit0"), str(tmp_path / "vit1")
    aligned, merged = tmp_path / "aligned", tmp_path / "merged"
    (tmp_path / "vit1" / "notes.txt").write_text("the user's notes")
    (tmp_path / "vit1" / "LICENSE").write_text("the model's licence")
    (tmp_path / "vit1" / "preprocessor_config.json").write_text("{}")
    inside = tmp_path / "vit1" / "aligned"
    argv = ["match", a, b, "--out", str(tmp_path / "q.json"), "--aligned", str(inside)]
    assert main(argv) == 2
    assert "lies inside B's model folder" in capsys.readouterr().err and not inside.exists()
    assert (
        main(["match", a, b, "--out", str(tmp_path / "p.json"), "--aligned", str(aligned), "-q"])
        == 0
    )
    assert main(["merge", a, b, "--out", str(merged), "-q"]) == 0
    capsys.readouterr()
    names = set(read_layout(b).tensors)
    copied = sorted(p.name for p in aligned.iterdir())
    assert "notes.txt" not in copied and {"LICENSE", "preprocessor_config.json"} <= set(copied)
    assert set(read_layout(aligned).tensors) == names
    assert set(read_layout(merged / "merged").tensors) == names


def test_a_model_folder_of_integer_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from lmckit.errors import CheckpointError

    torch.manual_seed(0)
    ARCHITECTURES["gpt2"]().save_pretrained(tmp_path / "gpt2")
    tensors = load_file(tmp_path / "gpt2" / "model.safetensors")
    name = next(k for k in sorted(tensors) if k.endswith("attn.c_attn.weight"))
    tensors[name] = tensors[name].to(torch.int64)
    save_file(tensors, tmp_path / "gpt2" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"another kind.*{name} \(torch.int64"):
        load_model_folder(tmp_path / "gpt2", trace=False)


def test_a_permutation_of_another_spec_is_refused_before_writing(tmp_path):
    from lmckit.errors import ParamsError
    from lmckit.models import build_model, permutation_spec
    from lmckit.perm import Permutation

    torch.manual_seed(0)
    ARCHITECTURES["gpt2"]().save_pretrained(tmp_path / "gpt2")
    ckpt = load_model_folder(tmp_path / "gpt2")
    other = Permutation.random(permutation_spec(build_model("mlp", in_dim=4, hidden=[3])), 0)
    with pytest.raises(ParamsError, match="the permutation is of another spec"):
        write_model_folder(tmp_path / "out", ckpt, perm=other)
    with pytest.raises(ParamsError, match=r"perm= .* or params= .*, not both"):
        write_model_folder(tmp_path / "out", ckpt, perm=Permutation.identity(ckpt.spec),
                           params=ckpt.params)  # fmt: skip
    assert not (tmp_path / "out").exists()
