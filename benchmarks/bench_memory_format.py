"""Why lmckit trains convolutional networks NCHW on the CPU: channels-last is faster there
but, with this torch build's oneDNN, its float32 weight gradients can be wrong.

Each model is built twice from the same seed; one copy is converted with
``model.to(memory_format=torch.channels_last)`` and fed channels-last batches. A training
step is forward, cross-entropy, backward and an SGD step on one batch of the paper
recipe's size (random 32×32 images); an evaluation is one forward pass of 1,000 images
without gradients; the variants alternate within each round (median of ``--repeats``).
``logit_rel_diff``: max |Δ logits| / max |logits| between the two copies (eval mode).
``grad_error``: for each layout, the float32 gradient of one training-mode batch against
the float64 NCHW gradient of the same model and batch — the largest per-parameter
max |error| / max |true gradient|, and the whole gradient's relative L2 error — on the
timing batch and on a batch of 8×8 images (``torch.manual_seed(0)``'s first
``randn(128, 1, 8, 8)``), where channels-last ResNet-20 ×1 was measured 9 % off in its
first stage-2 convolution while NCHW was 1e-6 off with one torch thread (with two, both
1e-6; 2026-11-29, torch 2.13.0+cpu, AVX2). Measured at one thread and at ``--threads``.
Prints one JSON document.

    python benchmarks/bench_memory_format.py [--models resnet20 vgg11] [--widths 1]
                                             [--threads 2] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from _timing import add_device_argument, machine, timed  # benchmarks/_timing.py
from lmckit.train import TrainConfig, init_model

NUM_CLASSES = 10


def variant(name: str, width: float, channels_last: bool, device: str):
    config = {"in_channels": 1, "num_classes": NUM_CLASSES}
    if name == "resnet20":
        config["width_multiplier"] = width
    model = init_model(name, config, seed=0).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def measure(name: str, width: float, repeats: int, device: str) -> dict:
    batch = TrainConfig.paper_defaults(name, "fashion-mnist", epochs=1).batch_size
    gen = torch.Generator().manual_seed(0)
    x_train = torch.randn(batch, 1, 32, 32, generator=gen).to(device)
    y_train = torch.randint(0, NUM_CLASSES, (batch,), generator=gen).to(device)
    x_eval = torch.randn(1000, 1, 32, 32, generator=gen).to(device)
    formats = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
    models = {k: variant(name, width, k == "channels_last", device) for k in formats}
    inputs = {
        k: (x_train.contiguous(memory_format=f), x_eval.contiguous(memory_format=f))
        for k, f in formats.items()
    }

    with torch.no_grad():
        first = {k: models[k][0].eval()(inputs[k][1]) for k in formats}
    rel = (first["channels_last"] - first["contiguous"]).abs().max() / first[
        "contiguous"
    ].abs().max()

    def train_step(k: str):
        model, opt = models[k]
        model.train()
        loss = F.cross_entropy(model(inputs[k][0]), y_train)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def evaluate(k: str):
        model = models[k][0].eval()
        with torch.no_grad():
            model(inputs[k][1])

    errors = {}
    for threads in sorted({1, torch.get_num_threads()}):  # the error depends on it
        with torch_threads(threads):
            errors[f"threads_{threads}"] = {
                "timing_batch": gradient_error(name, width, x_train, y_train),
                # VGG-11's five poolings need 32×32
                "batch_8x8": gradient_error(name, width, *_small_batch())
                if name == "resnet20"
                else None,
            }
    train = timed({k: (lambda k=k: train_step(k)) for k in formats}, repeats)
    evals = timed({k: (lambda k=k: evaluate(k)) for k in formats}, repeats)
    return {
        "model": name,
        "width": width,
        "batch_size": batch,
        "train_step_seconds": train,
        "train_speedup": train["contiguous"] / train["channels_last"],
        "eval_1000_seconds": evals,
        "eval_speedup": evals["contiguous"] / evals["channels_last"],
        "logit_rel_diff": float(rel),
        "grad_error": errors,
    }


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _small_batch():
    torch.manual_seed(0)
    x = torch.randn(128, 1, 8, 8)
    return x, torch.randint(0, NUM_CLASSES, (128,))


def gradient_error(name: str, width: float, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Each layout's float32 gradient on ``(x, y)`` against the float64 NCHW one."""

    def grads(dtype, channels_last):
        model, _ = variant(name, width, channels_last, "cpu")
        model = model.to(dtype).train()
        xi = x.cpu().to(dtype)
        if channels_last:
            xi = xi.contiguous(memory_format=torch.channels_last)
        F.cross_entropy(model(xi), y.cpu()).backward()
        return {n: p.grad.double() for n, p in model.named_parameters()}

    truth = grads(torch.float64, False)
    out = {}
    for layout in ("contiguous", "channels_last"):
        g = grads(torch.float32, layout == "channels_last")
        worst = max(
            truth, key=lambda n: float((g[n] - truth[n]).abs().max() / truth[n].abs().max())
        )
        diff = sum(float(((g[n] - truth[n]) ** 2).sum()) for n in truth) ** 0.5
        norm = sum(float((truth[n] ** 2).sum()) for n in truth) ** 0.5
        out[layout] = {
            "worst_parameter": worst,
            "worst_max_rel_error": float(
                (g[worst] - truth[worst]).abs().max() / truth[worst].abs().max()
            ),
            "rel_l2_error": diff / norm,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["resnet20", "vgg11"])
    parser.add_argument(
        "--widths", nargs="+", type=float, default=[1.0], help="ResNet-20 width multipliers"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--repeats", type=int, default=3)
    add_device_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in args.models:
        for width in args.widths if name == "resnet20" else [1.0]:
            results.append(measure(name, width, args.repeats, args.device))
    print(
        json.dumps(
            {
                "benchmark": "conv_memory_format",
                "machine": machine(args.device),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
