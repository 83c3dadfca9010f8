"""The commands' inputs from their arguments: :mod:`lmckit.workflows.inputs` called with
the options a command line gives (``--device``, ``--model-class`` …), folder loads reported
on stderr unless ``-q``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lmckit.workflows import inputs


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _options(args: argparse.Namespace) -> dict:
    return {
        "device": args.device,
        "model_class": getattr(args, "model_class", None),
        "model_args": getattr(args, "model_args", None),
        "input_shape": getattr(args, "input_shape", None),
        "tokens": getattr(args, "tokens", None),
        "max_memory": getattr(args, "max_memory", None),
        "log": None if getattr(args, "quiet", False) else _stderr,
        "warn": _stderr,
    }


def checkpoints(paths: Sequence[Path], args: argparse.Namespace) -> list:
    """:func:`lmckit.workflows.inputs.load_inputs` of ``paths`` with ``args``' options."""
    return inputs.load_inputs(paths, **_options(args))


def pair(args: argparse.Namespace) -> list:
    """Checkpoints A and B (``args.a``, ``args.b``): two different models
    (:func:`lmckit.workflows.inputs.load_pair`)."""
    return inputs.load_pair(args.a, args.b, **_options(args))


def data(ckpt, args: argparse.Namespace):
    """The dataset ``ckpt`` is evaluated on (:func:`lmckit.workflows.inputs.data_for`)."""
    return inputs.data_for(
        ckpt,
        dataset=args.dataset,
        data_dir=args.data_dir,
        download=not args.no_download,
        input_shape=getattr(args, "input_shape", None),
    )


def shape_from_sidecar(path: Path, args: argparse.Namespace) -> None:
    """Set ``args.input_shape`` (and ``args.tokens`` for a language model) from the dataset
    an lmckit checkpoint's sidecar records, saying so; unchanged when it records none."""
    found = inputs.input_from_sidecar(path)
    if found is None:
        return
    shape, tokens, dataset = found
    args.input_shape = shape
    if args.tokens is None:
        args.tokens = tokens
    said = f"token ids below {args.tokens}" if args.tokens is not None else "Gaussian inputs"
    print(f"example input: {' '.join(map(str, shape))} ({said}), from the checkpoint's dataset "
          f"{dataset} (--input-shape sets another)")  # fmt: skip


def example(args: argparse.Namespace):
    """An example batch of ``args.input_shape`` (``args.tokens``, ``args.batch``)."""
    return inputs.example_input(args.input_shape, args.tokens, getattr(args, "batch", 4))
