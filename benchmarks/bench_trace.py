"""Tracing a permutation spec: time and coverage per model, beside PyPI ``rebasin``.

For each model — the zoo (MLP, VGG-11, ResNet-20), an ``nn.TransformerEncoder`` classifier,
Hugging Face BERT, GPT-2 and ViT from small configs, and DistilBERT, RoBERTa, Llama,
Mistral, Qwen2, T5, BART, MobileNetV2, ResNet-50 and ConvNeXt-T (random weights) — it reports
:func:`lmckit.tracing.trace_report`'s wall-clock time (export + rules + verification; median of
``--repeats``), its groups and the fraction of parameters in permuted tensors.

When ``rebasin`` (0.0.47; it needs ``torchview``) is importable, its
``PermutationCoordinateDescent`` aligns a second random initialisation to the first and the
script reports, measured rather than read from its internals: the fraction of model B's
parameters whose tensors it changed (its coverage; BatchNorm running statistics are
randomised first, as after training), and how much model B's outputs moved
(a correct alignment leaves them unchanged: max |Δ logit| relative to max |logit|, eval
mode). Prints one JSON document.

    PYTHONPATH=/path/to/rebasin python benchmarks/bench_trace.py [--repeats 3] [--only hf]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch
from torch import nn

from _timing import machine  # benchmarks/_timing.py (scripts run from this folder)
from lmckit.models import build_model
from lmckit.tracing import trace_report


class EncoderClassifier(nn.Module):
    def __init__(self, d=64, heads=4, layers=2, classes=10):
        super().__init__()
        self.inp = nn.Linear(16, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.encoder(self.inp(x)).mean(1))


def models() -> dict:
    out = {
        "mlp 3x512": (lambda: build_model("mlp", in_dim=784), torch.randn(8, 1, 28, 28)),
        "vgg11 x1": (lambda: build_model("vgg11", in_channels=1), torch.randn(8, 1, 32, 32)),
        "resnet20 x1": (
            lambda: build_model("resnet20", in_channels=1),
            torch.randn(8, 1, 32, 32),
        ),
        "nn.TransformerEncoder d=64": (EncoderClassifier, torch.randn(8, 10, 16)),
    }
    try:
        import transformers as T
    except ImportError:
        return out
    small = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 128}
    out["hf BERT (4 layers, d=128)"] = (
        lambda: T.BertForSequenceClassification(
            T.BertConfig(vocab_size=1000, intermediate_size=512, num_labels=4, **small)
        ),
        torch.randint(0, 1000, (8, 16)),
    )
    out["hf GPT-2 (4 layers, d=128)"] = (
        lambda: T.GPT2LMHeadModel(
            T.GPT2Config(
                vocab_size=1000,
                n_embd=128,
                n_layer=4,
                n_head=4,
                use_cache=False,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        torch.randint(0, 1000, (8, 16)),
    )
    out["hf ViT (4 layers, d=128)"] = (
        lambda: T.ViTForImageClassification(
            T.ViTConfig(
                image_size=28,
                patch_size=7,
                num_channels=1,
                intermediate_size=512,
                num_labels=10,
                **small,
            )
        ),
        torch.randn(8, 1, 28, 28),
    )
    ids = torch.randint(0, 1000, (8, 16))
    decoder = {"vocab_size": 1000, "hidden_size": 128, "intermediate_size": 344,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip
    out["hf DistilBERT (4 layers, d=128)"] = (
        lambda: T.DistilBertForSequenceClassification(T.DistilBertConfig(
            vocab_size=1000, dim=128, n_layers=4, n_heads=4, hidden_dim=512, num_labels=4)),
        ids,
    )  # fmt: skip
    out["hf RoBERTa (4 layers, d=128)"] = (
        lambda: T.RobertaForSequenceClassification(T.RobertaConfig(
            vocab_size=1000, intermediate_size=512, num_labels=4, pad_token_id=1, **small)),
        ids + 2,
    )  # fmt: skip
    out["hf Llama (4 layers, d=128, GQA 4/2)"] = (
        lambda: T.LlamaForCausalLM(T.LlamaConfig(**decoder)), ids,
    )  # fmt: skip
    out["hf Mistral (4 layers, d=128, GQA 4/2)"] = (
        lambda: T.MistralForCausalLM(T.MistralConfig(**decoder)), ids,
    )  # fmt: skip
    out["hf Qwen2 (4 layers, d=128, GQA 4/2, tied)"] = (
        lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**decoder, tie_word_embeddings=True)), ids,
    )  # fmt: skip
    out["hf T5 (2+2 layers, d=128)"] = (
        lambda: T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4,
            decoder_start_token_id=0)),
        {"input_ids": ids, "decoder_input_ids": ids},
    )  # fmt: skip
    out["hf BART (2+2 layers, d=128)"] = (
        lambda: T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=512,
            decoder_ffn_dim=512)),
        ids,
    )  # fmt: skip
    images = torch.randn(8, 3, 64, 64)
    out["hf MobileNetV2 (depth 1.0, 64x64)"] = (
        lambda: T.MobileNetV2ForImageClassification(
            T.MobileNetV2Config(image_size=64, num_labels=10)),
        images,
    )  # fmt: skip
    out["hf ResNet-50 (bottleneck, 64x64)"] = (
        lambda: T.ResNetForImageClassification(T.ResNetConfig(num_labels=10)), images,
    )  # fmt: skip
    out["hf ConvNeXt-T (64x64)"] = (
        lambda: T.ConvNextForImageClassification(T.ConvNextConfig(num_labels=10)), images,
    )  # fmt: skip
    try:
        import diffusers
    except ImportError:
        return out
    out["diffusers UNet2DModel (small: 32/64 channels, 16x16)"] = (
        lambda: diffusers.UNet2DModel(
            sample_size=16,
            layers_per_block=1,
            block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=8,
        ),
        {"sample": torch.randn(2, 3, 16, 16), "timestep": torch.tensor([1, 10])},
    )
    out["diffusers UNet2DModel (default config, 32x32)"] = (
        lambda: diffusers.UNet2DModel(sample_size=32),
        {"sample": torch.randn(2, 3, 32, 32), "timestep": torch.tensor([1, 10])},
    )
    return out


def trained_like(model: nn.Module, seed: int) -> nn.Module:
    """Random BatchNorm running statistics (fresh ones are all 0 and 1, which hide a spec
    that forgets to permute them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def logits(model, x):
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, torch.Tensor) else out.logits


def with_rebasin(make, x) -> dict:
    try:
        from rebasin import PermutationCoordinateDescent
    except ImportError:
        return {"skipped": "rebasin is not importable"}
    torch.manual_seed(0)
    a, b = trained_like(make(), 1).eval(), trained_like(make(), 2).eval()
    before = {k: v.clone() for k, v in b.state_dict().items()}
    out_before = logits(b, x)
    start = time.perf_counter()
    try:
        pcd = PermutationCoordinateDescent(a, b, x)
        pcd.rebasin()
    except Exception as exc:  # report what it does on this model, whatever that is
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    seconds = time.perf_counter() - start
    after = b.state_dict()
    total = sum(v.numel() for v in before.values())
    changed = sum(v.numel() for k, v in before.items() if not torch.equal(v, after[k]))
    out_after = logits(b, x)
    return {
        "seconds": seconds,
        "permuted_fraction": changed / total,
        "output_change_relative": float(
            (out_after - out_before).abs().max() / out_before.abs().max()
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-rebasin", nargs="*", default=[], help="model names")
    parser.add_argument("--only", nargs="*", help="model names that start with these")
    args = parser.parse_args()
    rows = {}
    for name, (make, x) in models().items():
        if args.only and not name.startswith(tuple(args.only)):
            continue
        print(f"{name}: tracing", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        model = trained_like(make(), 0)
        times = []
        for _ in range(args.repeats):
            if isinstance(x, dict):  # keyword inputs (encoder-decoder models)
                report = trace_report(copy.deepcopy(model), (), example_kwargs=x)
            else:
                report = trace_report(copy.deepcopy(model), x)
            times.append(report.seconds)
        rows[name] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "trace_seconds": statistics.median(times),
            "groups": len(report.spec.groups),
            "permuted_fraction": report.permuted_fraction,
            "unknown_ops": list(report.unknown_ops),
            "checked_modes": list(report.checked_modes),
            "rebasin": with_rebasin(make, x) if name not in args.skip_rebasin else "skipped",
        }
    print(json.dumps({"benchmark": "trace", "machine": machine("cpu"), "models": rows}, indent=2))


if __name__ == "__main__":
    main()
