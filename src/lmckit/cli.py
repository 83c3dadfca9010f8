"""The ``lmckit`` command line: parse and check the arguments, call one library function,
print what it returns.

Exit status: 0 on success; 2 for a command line that cannot be carried out (an argument out
of range, a path of the wrong kind, inputs that do not fit each other); 1 when a valid
command fails (an unreadable file, a diverged training run); 130 after Ctrl-C and 143 after
SIGTERM where a command handles it (``lmckit run``). Errors are one line on
stderr; ``lmckit --debug COMMAND ...`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from lmckit import __version__
from lmckit.errors import LmcError, ModelConfigError, ParamsError, UsageError

# Zoo entries shown by `lmckit info`: the papers' configurations.
INFO_MODELS: list[tuple[str, dict]] = [
    ("mlp", {"in_dim": 784, "hidden": [512, 512, 512], "out_dim": 10}),
    ("mlp", {"in_dim": 784, "hidden": [512, 512, 512], "out_dim": 10, "skip": True}),
    ("vgg", {"depth": 11, "width_multiplier": 1, "in_channels": 3}),
    ("vgg", {"depth": 16, "width_multiplier": 1, "in_channels": 3}),
    ("resnet20", {"width_multiplier": 1}),
    ("resnet20", {"width_multiplier": 16}),
    ("vit", {"image_size": 28, "patch_size": 7, "dim": 64, "depth": 4, "heads": 4}),
    ("transformer", {"in_dim": 28, "length": 28, "dim": 64, "depth": 2, "heads": 4}),
    ("gpt", {"vocab_size": 256, "context": 128, "dim": 128, "depth": 4, "heads": 4}),
]
MAX_SEED = 2**32 - 1


# -- argument types: each raises ArgumentTypeError with a message naming what is wrong ----
def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _int_at_least(low: int, *, zero_means_off: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if value < low and not (zero_means_off and value == 0):
            off = " (or 0 for off)" if zero_means_off else ""
            raise argparse.ArgumentTypeError(f"must be ≥ {low}{off}, got {value}")
        return value

    return parse


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    return parse


def _seed(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seeds are integers in [0, {MAX_SEED}], got {value}")
    return value


def _float_in(
    low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = True
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if not math.isfinite(value) or too_low or too_high:
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise argparse.ArgumentTypeError(f"must be in {lo}{low}, {high}{hi}, got {text}")
        return value

    return parse


_positive = _float_in(0.0, low_open=True)


def _device(text: str) -> str:
    from lmckit._checks import check_device

    try:
        return check_device(text)
    except ParamsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    """A memory size: bytes, or a number with K, M, G or T (binary units; "12G", "1.5GiB",
    "800MB")."""
    import re

    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 12G, 800M or 4096")
    value = float(found.group(1)) * _SIZE_UNITS[found.group(2)]
    if value < 1:
        raise argparse.ArgumentTypeError(f"the size must be at least one byte, got {text!r}")
    return int(value)


def _out_path(text: str) -> Path:
    """An output path: any path but the empty one (which would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty")
    return Path(text)


def _weights(text: str) -> Path:
    """A checkpoint's weights: an existing file, an lmckit checkpoint by stem, or a Hugging
    Face model folder."""
    from lmckit._io import special_kind
    from lmckit.checkpoint import checkpoint_paths
    from lmckit.model_folder import is_model_folder

    path = Path(text)
    if path.is_file():
        return path
    special = special_kind(path)
    if special is not None:
        raise argparse.ArgumentTypeError(
            f"{text} is {special}, not a checkpoint file or a model folder"
        )
    if path.is_dir():
        if is_model_folder(path):
            return path
        raise argparse.ArgumentTypeError(
            f"{text} is a folder, not a checkpoint, and no Hugging Face model folder (it holds "
            "no config.json, model.safetensors or shard index)"
        )
    try:
        weights, _ = checkpoint_paths(text)
    except LmcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if weights.is_file():
        return weights
    raise argparse.ArgumentTypeError(f"checkpoint {text}: {weights} not found")


def _existing(kind: str) -> Callable[[str], Path]:
    """An argument type for an existing ``"file"`` or ``"folder"``."""

    def parse(text: str) -> Path:
        from lmckit._io import describe_path

        path = Path(text)
        if not (path.is_file() if kind == "file" else path.is_dir()):
            found = describe_path(path)
            raise argparse.ArgumentTypeError(
                f"{text} does not exist"
                if found == "nothing"
                else f"{text} is {found}, not a {kind}"
            )
        return path

    return parse


_existing_file, _existing_dir = _existing("file"), _existing("folder")


def _dataset(text: str) -> str:
    from lmckit.data import DATASETS, canonical_name

    try:
        return canonical_name(text)
    except LmcError:
        raise argparse.ArgumentTypeError(
            f"unknown dataset {text!r}; choose from {', '.join(DATASETS)}"
        ) from None


def _model_name(text: str) -> str:
    from lmckit.workflows.training import model_name_key

    try:
        return model_name_key(text)
    except LmcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _range(text: str) -> list[int]:
    from lmckit.workflows.merging import parse_range

    try:
        return parse_range(text)
    except LmcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextlib.contextmanager
def _as_usage() -> Iterator[None]:
    """Library complaints about values taken from the command line are usage errors."""
    try:
        yield
    except UsageError:
        raise
    except LmcError as exc:
        raise UsageError(str(exc)) from None


# -- progress: one helper turns every Progress event stream into a bar --------------------
class ProgressBars:
    """``bars(label)`` returns a callback that drives a tqdm bar for ``label`` (created on
    the first event, total taken from the events, metrics in the postfix), or ``None`` when
    quiet. The commands' steps run one after another, so a new bar closes the previous
    ones (their times stay true); the context manager closes the last."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bars: list[Any] = []
        self.kept: list[Any] = []

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_finished()
        for bar in self.kept:
            bar.close()
        self.kept.clear()

    def close_finished(self) -> None:
        """Close the bars of steps that are over (all but the kept ones)."""
        for bar in self.bars:
            bar.close()
        self.bars.clear()

    def __call__(self, label: str, *, keep: bool = False, delay: float = 0.0):
        """A callback driving a bar for ``label``; ``keep``: an overall bar that later bars
        do not close; ``delay``: show the bar only once its work has lasted this long."""
        if not self.enabled:
            return None
        from tqdm.auto import tqdm

        state: dict[str, Any] = {}

        def callback(event) -> None:
            bar = state.get("bar")
            if bar is None:
                if not keep:
                    self.close_finished()
                bar = state["bar"] = tqdm(
                    total=event.total,
                    desc=label,
                    dynamic_ncols=True,
                    leave=keep or delay == 0,
                    delay=delay,
                    position=0 if keep else None,
                    mininterval=0.1 if sys.stderr.isatty() else 10.0,
                )
                (self.kept if keep else self.bars).append(bar)
            if event.total != bar.total:
                bar.total = event.total
            if event.step > bar.n:
                bar.update(event.step - bar.n)
            shown = {
                k: f"{v:.4g}" if isinstance(v, float) else v
                for k, v in event.metrics.items()
                if not isinstance(v, bool) and k not in ("seconds",)
            }
            if shown:
                bar.set_postfix(shown, refresh=False)

        return callback


# -- estimates before long work (lmckit.budget) --------------------------------------------
def _budget(args: argparse.Namespace):
    from lmckit.budget import Budget

    return Budget.hours(getattr(args, "max_hours", None))


# -- commands ------------------------------------------------------------------------------
MLP_SHAPE = ("in_dim", "out_dim", "hidden")


def _describe(name: str, config: dict) -> str:
    parts = [f"{k}={v}" for k, v in config.items() if not (name == "mlp" and k in MLP_SHAPE)]
    if name == "mlp":
        widths = [config["in_dim"], *config["hidden"], config["out_dim"]]
        parts.insert(0, "-".join(str(w) for w in widths))
    return f"{name}({', '.join(parts)})"


def cmd_info(args: argparse.Namespace) -> int:
    from lmckit.models import build_model, permutation_spec

    print(f"lmckit {__version__} — model zoo and permutation symmetries")
    header = (
        f"{'model':<62} {'params':>11} {'groups':>6} {'permuted units':>14} "
        f"{'log10 #symmetries':>18}"
    )
    print(header)
    print("-" * len(header))
    for name, config in INFO_MODELS:
        model = build_model(name, **config)
        spec = permutation_spec(model)
        n_params = sum(p.numel() for p in model.parameters())
        units = sum(spec.groups.values())
        print(
            f"{_describe(name, config):<62} {n_params:>11,} {len(spec.groups):>6} {units:>14,} "
            f"{spec.log10_num_symmetries():>18.2f}"
        )
        if args.verbose:
            for g, n in spec.groups.items():
                print(f"    {g:<24} {n:>6}  ({len(spec.group_axes(g))} tensor axes)")
    print("(Git Re-Basin Table 1 quotes 10^3498 for the 3×512 MLP: log10((512!)^3) = 3499.62.)")
    return 0


def _model_from_class_path(target: str, model_args: str | None):
    """Instantiate ``package.module:Class`` (the current folder is importable, as with
    ``python -m``) with the JSON object ``model_args`` as keyword arguments."""
    import json

    from lmckit.models.custom import import_model_class

    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise UsageError(f"{target!r} is neither a checkpoint nor MODULE:CLASS")
    try:
        cls = import_model_class(target)
    except ModelConfigError as exc:  # a bad argument of the command line: usage error
        raise UsageError(str(exc)) from None
    try:
        kwargs = json.loads(model_args) if model_args else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--model-args is not JSON: {exc}") from None
    if not isinstance(kwargs, dict):
        raise UsageError("--model-args must be a JSON object of keyword arguments")
    try:
        return cls(**kwargs)
    except Exception as exc:  # the user's constructor
        raise UsageError(f"{target}({kwargs}) failed: {type(exc).__name__}: {exc}") from None


SPEC_FORMAT = "lmckit-trace-report"


def cmd_spec(args: argparse.Namespace) -> int:
    import inspect

    from lmckit._io import atomic_write_json, check_output_file, prepare_output_file, special_kind
    from lmckit.spec import trace_report

    if args.out is not None:
        prepare_output_file(args.out, "--out", create=False)  # written once traced
    path = Path(args.target)
    special = special_kind(path)
    if special is not None:
        raise UsageError(f"{args.target} is {special}, not a checkpoint or a model folder")
    if path.is_dir():
        from lmckit.model_folder import is_model_folder, load_model_folder

        if not is_model_folder(path):
            raise UsageError(
                f"{args.target} is a folder, and no Hugging Face model folder (it holds no "
                "config.json, model.safetensors or shard index); spec takes a checkpoint, a "
                "model folder or MODULE:CLASS"
            )
        if args.out is not None:  # before the folder is read: it is checked again below
            check_output_file(args.out, "--out", inputs=[], file_format=SPEC_FORMAT)
        ckpt = load_model_folder(path)  # traced from its config's example input
        report, inputs = ckpt.trace_report, list(ckpt.files)
    else:
        checkpoint = ":" not in args.target or path.is_file()  # MODULE:CLASS has a colon
        if args.input_shape is None and checkpoint:
            _input_from_sidecar(path, args)
        if args.input_shape is None:
            raise UsageError("spec needs --input-shape (one example's shape) for this target")
        if checkpoint:
            lmckit_checkpoint = argparse.Namespace(model_class=None, device="cpu")
            ckpt = _load_user_checkpoints([path], lmckit_checkpoint)[0]
            model, inputs = ckpt.model, list(ckpt.files)
        else:
            model = _model_from_class_path(args.target, args.model_args)
            inputs = [inspect.getfile(type(model))] if _has_source(type(model)) else []
        if args.out is not None:
            check_output_file(args.out, "--out", inputs=inputs, file_format=SPEC_FORMAT)
        report = trace_report(model, _example_input(args), strict=args.strict)
    if args.out is not None:
        check_output_file(args.out, "--out", inputs=inputs, file_format=SPEC_FORMAT)
    print(report)
    if args.out is not None:
        atomic_write_json(args.out, {"format": SPEC_FORMAT, **report.to_dict()})
        print(f"spec and report -> {args.out}")
    return 0


def _has_source(cls: type) -> bool:
    import inspect

    try:
        inspect.getfile(cls)
    except (TypeError, OSError):
        return False
    return True


def _split_option(args: argparse.Namespace) -> dict | None:
    """``--split`` and its settings as a split table (None without ``--split``)."""
    if args.split is None:
        if args.part is not None:
            raise UsageError("--part needs --split")
        return None
    if args.part is None:
        raise UsageError(f"--split {args.split} needs --part")
    part: int | str = args.part
    if args.split != "class-imbalanced":
        try:
            part = int(args.part)
        except ValueError:
            raise UsageError(f"--part must be a client number, got {args.part!r}") from None
    from lmckit.data.splits import KIND_SETTINGS, Split
    from lmckit.errors import DataError

    settings = {"kind": args.split, "part": part, "seed": args.split_seed}
    for name in KIND_SETTINGS[args.split]:  # the kind's own settings, defaults included
        settings[name] = getattr(args, name)
    try:  # the split keeps the settings of its kind
        return Split.from_dict(settings).to_dict()
    except DataError as exc:
        raise UsageError(str(exc)) from None


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from lmckit._io import check_output_dir
    from lmckit.train import TrainConfig
    from lmckit.workflows.training import load_for_model, model_config_for, train_seeds

    check_output_dir(args.out, "--out")
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_for_model(args.model, args.dataset, args.data_dir, download=not args.no_download)
    what = (
        f"windows of {data.input_shape[0]} tokens, {data.num_classes} token ids"
        if data.next_token
        else f"input {data.input_shape}, {data.num_classes} classes"
    )
    print(
        f"dataset {data.name}: {len(data.train_x)} train / {len(data.test_x)} test, {what} "
        f"(from {data.source})"
    )
    options = {
        "epochs": args.epochs,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "batch_size": args.batch_size,
        "weight_decay": args.weight_decay,
        "schedule": args.schedule,
        "warmup_epochs": args.warmup_epochs,
        "momentum": args.momentum,
        "label_smoothing": args.label_smoothing,
        "augment": args.augment,
        "init_seed": args.init_seed,
        "split": _split_option(args),
    }
    with _as_usage():
        model_cfg = model_config_for(
            args.model,
            data,
            width_multiplier=args.width_multiplier,
            hidden=args.hidden,
            norm="default" if args.norm is None else (None if args.norm == "none" else args.norm),
            skip=True if args.skip else None,
        )
        config = TrainConfig.paper_defaults(
            args.model, data.name, **{k: v for k, v in options.items() if v is not None}
        )

    def report(outcome) -> None:
        m = outcome.metrics
        state = "exists, skipped" if outcome.skipped else f"trained in {outcome.seconds:.1f}s"
        if outcome.diverged:
            d = outcome.diverged
            state += (
                f"; DIVERGED in epoch {d['epoch']} (loss {d['loss']:.4g} from "
                f"{d['start_loss']:.4g}), kept as asked"
            )
        on = f" on {config.split.describe()}" if config.split is not None else ""
        print(
            f"seed {outcome.seed}{on}: train acc {m.get('train_accuracy', float('nan')):.4f}, "
            f"test acc {m.get('test_accuracy', float('nan')):.4f}, test loss "
            f"{m.get('test_loss', float('nan')):.4f} ({state}) -> {outcome.path}",
            flush=True,
        )

    with ProgressBars(not args.quiet) as bars:
        train_seeds(
            args.model,
            model_cfg,
            data,
            config,
            args.seeds,
            args.out,
            progress=lambda seed: bars(f"{args.model} seed {seed}"),
            on_seed_done=report,
            device=args.device,
            keep_diverged=args.keep_diverged,
            budget=_budget(args),
        )
    return 0


def _load_checkpoints(paths: Sequence[Path], device: str):
    from lmckit.checkpoint import load_checkpoint

    return [load_checkpoint(p, device=device) for p in paths]


def _input_from_sidecar(path: Path, args: argparse.Namespace) -> None:
    """Set ``args.input_shape`` (and ``args.tokens`` for a language model) from the
    dataset an lmckit checkpoint's sidecar records, saying so; unchanged when it records
    none that lmckit knows (a user's weight file, synthetic data of another size)."""
    from lmckit.checkpoint import read_meta
    from lmckit.data.datasets import INPUT_SHAPES

    try:
        meta = read_meta(path)
    except LmcError:
        return
    dataset, model = meta.get("dataset"), meta["model"]
    if dataset not in INPUT_SHAPES or dataset == "synthetic":
        return
    if dataset == "python-stdlib":
        context, vocab = model.get("context"), model.get("vocab_size")
        if not (isinstance(context, int) and isinstance(vocab, int)):
            return
        shape, tokens = (context,), vocab
    else:
        shape, tokens = INPUT_SHAPES[dataset], None
    args.input_shape = list(shape)
    if args.tokens is None:
        args.tokens = tokens
    said = f"token ids below {args.tokens}" if args.tokens is not None else "Gaussian inputs"
    print(f"example input: {' '.join(map(str, shape))} ({said}), from the checkpoint's dataset "
          f"{dataset} (--input-shape sets another)")  # fmt: skip


def _example_input(args: argparse.Namespace):
    from lmckit.budget import check_budget
    from lmckit.models.custom import example_batch

    batch = getattr(args, "batch", 4)
    check_budget(
        f"an example batch of shape {(batch, *args.input_shape)}",
        memory=8 * batch * math.prod(args.input_shape),
        detail="the tracer's example input",
    )
    return example_batch(args.input_shape, args.tokens, batch)


def _load_pair(args: argparse.Namespace):
    """Checkpoints A and B (see :func:`_load_user_checkpoints`): two different models."""
    from lmckit.workflows.matching import check_distinct

    pair = _load_user_checkpoints([args.a, args.b], args)
    check_distinct(pair)
    return pair


def _load_user_checkpoints(paths: Sequence[Path], args: argparse.Namespace):
    """lmckit checkpoints, or with ``--model-class`` a user's weight files loaded into that
    class, with the spec traced once for it."""
    from lmckit._io import special_kind
    from lmckit.checkpoint import checkpoint_paths, load_foreign
    from lmckit.spec import trace

    folders = [p for p in paths if Path(p).is_dir()]
    if folders:
        if len(folders) != len(paths):
            raise UsageError(
                f"{folders[0]} is a model folder and {next(p for p in paths if p not in folders)} "
                "is not: give model folders or checkpoints, not both"
            )
        if args.model_class is not None:
            raise UsageError(
                "--model-class is for plain state dicts; a model folder names its class in "
                "its config.json"
            )
        return _load_folders(paths, args)
    if args.model_class is None:
        for path in paths:
            weights, sidecar = checkpoint_paths(path)
            for part in (weights, sidecar):
                if special_kind(part) is not None:
                    raise UsageError(f"checkpoint {path}: {part} is {special_kind(part)}")
            missing = [str(p) for p in (weights, sidecar) if not p.is_file()]
            if missing:
                raise UsageError(
                    f"checkpoint {path}: {', '.join(missing)} not found (a plain state dict "
                    "needs --model-class and --input-shape)"
                )
        return _load_checkpoints(paths, args.device)
    if args.input_shape is None:
        raise UsageError("--model-class needs --input-shape (one example's shape)")
    description = {"name": "custom", "class": args.model_class, "args": args.model_args or ""}
    models = [_model_from_class_path(args.model_class, args.model_args) for _ in paths]
    spec = trace(models[0], _example_input(args))
    return [
        load_foreign(path, model, spec, description=description, device=args.device)
        for path, model in zip(paths, models, strict=True)
    ]


def _load_folders(paths: Sequence[Path], args: argparse.Namespace):
    """:func:`lmckit.model_folder.load_model_folders`, saying what it reads on stderr
    (unless ``-q``) and naming the tensors the trace leaves frozen before any long work."""
    from lmckit.model_folder import frozen_summary, load_model_folders

    def say(line: str) -> None:
        if not getattr(args, "quiet", False):
            print(line, file=sys.stderr, flush=True)

    ckpts = load_model_folders(
        paths, device=args.device, max_memory=getattr(args, "max_memory", None), progress=say
    )
    note = frozen_summary(ckpts[0])
    if note:
        print(f"note: {note}", file=sys.stderr)
    return ckpts


def _folder_without_data(path: object) -> UsageError:
    return UsageError(
        f"{path} is a model folder: lmckit aligns and merges model folders by their weights "
        "(wm, wm-fast, the weight-based merges, analyze --no-data); evaluating them on a "
        "dataset is not supported"
    )


def _refuse_folders_for_data(paths: Sequence[object]) -> None:
    """Before any folder is hashed, loaded and traced: work that needs data refuses model
    folders (they record no dataset)."""
    from lmckit.model_folder import is_model_folder

    folder = next((p for p in paths if p is not None and is_model_folder(p)), None)
    if folder is not None:
        raise _folder_without_data(folder)


def _data_for(ckpt, args: argparse.Namespace):
    from lmckit.data import load_dataset
    from lmckit.data.datasets import INPUT_SHAPES
    from lmckit.workflows.matching import check_data_fits
    from lmckit.workflows.training import load_for_model

    if ckpt.folder:
        raise _folder_without_data(ckpt.path)
    name = args.dataset or ckpt.meta.get("dataset")
    if not name:
        raise UsageError(f"{ckpt.path} does not record its dataset; pass --dataset")
    if ckpt.meta.get("foreign"):
        # pad smaller images to the --input-shape the model was traced with (28 → 32)
        shape = INPUT_SHAPES.get(name)
        wanted = tuple(args.input_shape)
        pad = wanted[-1] if shape and len(wanted) == 3 and wanted[-1] > shape[-1] else None
        data = load_dataset(name, args.data_dir, download=not args.no_download, pad_to=pad)
    else:
        data = load_for_model(
            ckpt.meta["model"]["name"], name, args.data_dir, download=not args.no_download
        )
    check_data_fits(ckpt, data)
    return data


def cmd_match(args: argparse.Namespace) -> int:
    from lmckit._io import (
        check_output_dir,
        check_output_file,
        check_outputs,
        locked_output,
        prepare_output_file,
    )
    from lmckit.match import METHODS, TRANSFORM_METHODS
    from lmckit.workflows.matching import (
        PERMUTATION_FORMAT,
        TRANSFORM_FORMAT,
        check_same_architecture,
        match_checkpoints,
        pair_record,
        save_match,
    )

    if args.symmetries != "perm" and args.method not in ("wm", "wm-fast", "am", "ste"):
        raise UsageError(
            f"--symmetries {args.symmetries} works with weight matching (--method wm or "
            f"wm-fast), activation matching (am) or the midpoint loss (ste), not {args.method!r}"
        )
    prepare_output_file(args.out, "--out", create=False)  # created once the work starts
    if args.aligned is not None:
        check_output_dir(args.aligned, "--aligned")
        if args.aligned.resolve() == args.out.resolve():
            raise UsageError(f"--aligned and --out both name {args.out}: a folder and a file")
        for role, given in (("A", args.a), ("B", args.b)):
            folder = Path(given).resolve()
            if folder.is_dir() and args.aligned.resolve().is_relative_to(folder):
                raise UsageError(
                    f"--aligned {args.aligned} lies inside {role}'s model folder {given}: a "
                    "model folder would hold another; choose a folder outside it"
                )
    start = {"wm": "wm", "wm-fast": "wm", "am": "am", "ste": "ste"}.get(args.method)
    planned = f"{start}-{args.symmetries}" if args.symmetries != "perm" else args.method
    if METHODS[planned].needs_data:
        _refuse_folders_for_data([args.a, args.b])
    a, b = _load_pair(args)
    check_output_file(
        args.out, "--out", inputs=[*a.files, *b.files],
        file_format=TRANSFORM_FORMAT
        if args.symmetries != "perm" or args.method in TRANSFORM_METHODS
        else PERMUTATION_FORMAT,
    )  # fmt: skip
    check_same_architecture(a, b)
    if args.aligned is not None and not b.folder:
        raise UsageError("--aligned writes a model folder; B is not one")
    if args.aligned is not None:
        from lmckit.model_folder import check_writable

        check_writable(b)  # before the match: its result is written in B's layout
    method = args.method
    if args.symmetries != "perm":
        start = {"wm": "wm", "wm-fast": "wm", "am": "am", "ste": "ste"}[args.method]
        method = f"{start}-{args.symmetries}"
    if method in TRANSFORM_METHODS and args.max_memory is not None:
        raise UsageError(
            f"--max-memory bounds permutation weight matching; {method} does not take it "
            "(its transforms are dense per group)"
        )
    data = _data_for(a, args) if METHODS[method].needs_data else None
    from lmckit.workflows.estimates import check_match

    check_match(
        a, b, args.method, data, restarts=args.restarts, epochs=args.epochs,
        batch_size=args.batch_size, budget=_budget(args),
    )  # fmt: skip
    if method in TRANSFORM_METHODS:
        return _match_with_rotations(args, method, a, b, data)
    folder = locked_output(args.out.parent, "--out's folder", guard=False)
    with contextlib.ExitStack() as stack:
        bars = stack.enter_context(ProgressBars(not args.quiet))
        stack.enter_context(folder)
        if args.aligned is not None:
            from lmckit._io import check_not_inputs
            from lmckit.model_folder import output_names

            outputs = [args.aligned / n for n in output_names(b.layout)]
            check_not_inputs(outputs, [*a.files, *b.files], "--aligned")  # before any lock file
            stack.enter_context(locked_output(args.aligned, "--aligned"))
            check_outputs(outputs, [*a.files, *b.files], "--aligned")
        result = match_checkpoints(
            a,
            b,
            args.method,
            data,
            seed=args.seed,
            progress=bars(f"match {args.method}"),
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            variant=args.variant,
            restarts=args.restarts,
            max_memory=args.max_memory,
        )
        save_match(args.out, result, **pair_record(a, b))
        if args.aligned is not None:
            from lmckit.model_folder import provenance, write_model_folder

            write_model_folder(
                args.aligned,
                b,
                perm=result.perm,
                about={
                    "method": result.method,
                    "inputs": provenance({"a": a, "b": b}),
                    "l2_distance": {
                        "before": result.distance_before,
                        "after": result.distance_after,
                    },
                },
                log=print,
            )
    objective = f"{result.history[-1]:.6g}" if result.history else "n/a"
    print(f"method        {result.method}")
    print(f"objective     {objective}   ({result.iterations} iterations)")
    print(f"L2 distance   {result.distance_before:.4f} -> {result.distance_after:.4f}")
    print(f"time          {result.seconds:.2f} s")
    print(f"permutation   -> {args.out}")
    if args.aligned is not None:
        print(f"B aligned     -> {args.aligned} (a model folder)")
    return 0


def _match_with_rotations(args: argparse.Namespace, method: str, a, b, data) -> int:
    """``lmckit match --symmetries orth|full`` (or a transform method): a transform file,
    and with ``--aligned`` B moved by it in the original layout (A's norm gains put back)."""
    from lmckit._io import locked_output
    from lmckit.workflows.matching import match_checkpoints, pair_record, save_transform

    example, example_kwargs = getattr(a.model, "example_input", None), {}
    if callable(example):
        example = example()
    elif a.folder:
        from lmckit.model_folder import example_inputs

        example, example_kwargs = example_inputs(a.model, a.layout.config)
    elif data is not None:
        example = data.train_x[:8]
    elif getattr(args, "input_shape", None) is not None:
        example = _example_input(args)
    else:
        from lmckit.data.datasets import INPUT_SHAPES

        shape = INPUT_SHAPES.get(a.meta.get("dataset", ""))
        if shape is None:
            raise UsageError(
                f"{a.path}: no example input to read the model's graph with; pass "
                "--input-shape (or --dataset)"
            )
        import torch

        example = torch.randn(4, *shape)
    with contextlib.ExitStack() as stack:
        stack.enter_context(locked_output(args.out.parent, "--out's folder", guard=False))
        if args.aligned is not None:
            from lmckit._io import check_not_inputs, check_outputs
            from lmckit.model_folder import output_names

            outputs = [args.aligned / n for n in output_names(b.layout)]
            check_not_inputs(outputs, [*a.files, *b.files], "--aligned")
            stack.enter_context(locked_output(args.aligned, "--aligned"))
            check_outputs(outputs, [*a.files, *b.files], "--aligned")
        with ProgressBars(not args.quiet) as bars:
            result = match_checkpoints(
                a, b, method, data, seed=args.seed, progress=bars(f"match {method}"),
                example_inputs=example, example_kwargs=example_kwargs, restarts=args.restarts,
                epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                variant=args.variant,
            )  # fmt: skip
        save_transform(args.out, result, **pair_record(a, b))
        if args.aligned is not None:
            from lmckit.model_folder import provenance, write_model_folder
            from lmckit.transform import align, unfold_norms

            spec = result.perm.spec
            gains = {k: a.params[k] for k in spec.folds}
            moved = unfold_norms(spec, align(result.perm, b.params), gains)
            write_model_folder(
                args.aligned,
                b,
                params=moved,
                about={
                    "method": method,
                    "inputs": provenance({"a": a, "b": b}),
                    "layout": "B moved by the transform, with A's norm gains (the same "
                    "function as B; interpolating it with A is the folded path)",
                },
                log=print,
            )
    spec = result.perm.spec
    counts = spec.kind_counts()
    path = " -> ".join(f"{s['distance']:.4f} ({s['method']})" for s in result.info["stages"])
    print(f"method        {method} ({' + '.join(s['method'] for s in result.info['stages'])})")
    print(f"groups        {', '.join(f'{n} {k}' for k, n in counts.items())}")
    print(f"folded norms  {len(spec.folds)} gains multiplied into their readers")
    print(f"L2 distance   {result.distance_before:.4f} -> {path}, folded weights")
    print(f"time          {result.seconds:.2f} s")
    print(f"transform     -> {args.out}")
    if args.aligned is not None:
        print(f"B aligned     -> {args.aligned} (a model folder, A's norm gains)")
    return 0


def cmd_interpolate(args: argparse.Namespace) -> int:
    from lmckit._io import check_output_dir
    from lmckit.params import has_batchnorm
    from lmckit.workflows.interpolation import run_interpolate

    check_output_dir(args.out, "--out")
    _refuse_folders_for_data([args.a, args.b])
    a, b = _load_pair(args)
    if "bn_batches" in args.given and not has_batchnorm(a.params):
        raise UsageError("--bn-batches does not apply here: the model has no BatchNorm")
    data = _data_for(a, args)
    from lmckit.workflows.estimates import check_curves

    paths = 1 if args.perm else len(args.method)
    check_curves(
        a, data, paths=paths, lambdas=args.lambdas, test_only=args.test_only,
        budget=_budget(args),
    )  # fmt: skip
    with ProgressBars(not args.quiet) as bars:
        summary = run_interpolate(
            a,
            b,
            data,
            args.out,
            methods=args.method,
            perm_file=args.perm,
            lambdas=args.lambdas,
            calibrated=args.calibrated,
            test_only=args.test_only,
            bn_batches=args.bn_batches,
            repair=args.repair,
            seed=args.seed,
            progress=bars,
        )
    extra = f" {'ppl(λ=½)':>9} {'ppl ends':>9}" if data.next_token else ""
    print(
        f"{'curve':<10} {'loss barrier':>13} {'convex':>9} {'acc barrier':>12} {'acc(λ=½)':>9}"
        + extra
    )
    for label, c in summary["curves"].items():
        t = c.barriers["test"]
        row = (
            f"{label:<10} {t['loss']['rebasin']:>13.4f} {t['loss']['convex']:>9.4f} "
            f"{100 * t['accuracy']['rebasin']:>11.2f}% "
            f"{100 * c.midpoint('test', 'accuracy'):>8.2f}%"
        )
        if data.next_token:  # per-token losses: perplexities too
            ppl = c.perplexities("test")
            row += f" {ppl['perplexity.midpoint']:>9.3f} {ppl['perplexity.endpoints']:>9.3f}"
        print(row)
    print(f"curves, barriers and plots -> {args.out}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from lmckit._io import check_output_dir
    from lmckit.workflows.analysis import run_analyze, run_counterexample

    check_output_dir(args.out, "--out")
    if args.counterexample:
        if args.a or args.b:
            raise UsageError("--counterexample takes no checkpoints")
        result = run_counterexample(args.out)["result"]
        print(f"{'permutation':<40} {'error barrier':>13}")
        for perm, barrier in zip(result.permutations, result.barriers, strict=True):
            print(f"{perm.to_dict()!s:<40} {100 * barrier:>12.2f}%")
        print(
            f"lowest barrier over all {len(result.barriers)} permutations: "
            f"{100 * min(result.barriers):.2f}% (both networks: 0 % error)"
        )
        print(f"figure and data -> {args.out}")
        return 0
    if args.a is None or args.b is None:
        raise UsageError("analyze needs two checkpoints A and B (or --counterexample)")
    if not args.no_data:
        _refuse_folders_for_data([args.a, args.b])
    a, b = _load_pair(args)
    data = None
    if not args.no_data:
        data = _data_for(a, args)
    with ProgressBars(not args.quiet) as bars:
        summary = run_analyze(
            a,
            b,
            data,
            args.out,
            methods=args.method,
            perm_file=args.perm,
            gammas=args.gamma,
            taylor=not args.no_taylor,
            layerwise=args.layerwise,
            seed=args.seed,
            progress=bars,
        )
    gammas = [f"{g:g}" for g in args.gamma]
    head = " ".join(f"{'R(γ=' + g + ')':>9}" for g in gammas)
    print(
        f"{'method':<10} {'L2 before':>10} {'L2 after':>10} {head} {'barrier½':>9} {'Taylor½':>9}"
    )
    for label, r in summary["results"].items():
        before, after = r["distances"]["parameters"]
        rs = " ".join(f"{r['R'][g]['total']:>9.4f}" for g in gammas)
        t = r.get("taylor")
        half = t["lambdas"].index(0.5) if t and 0.5 in t["lambdas"] else None
        actual = f"{t['actual'][half]:>9.4f}" if half is not None else f"{'—':>9}"
        taylor = f"{t['predicted'][half]:>9.4f}" if half is not None else f"{'—':>9}"
        print(f"{label:<10} {before:>10.3f} {after:>10.3f} {rs} {actual} {taylor}")
    if "layerwise" in summary:
        _print_layerwise(summary["layerwise"])
    print(f"analysis.json and figures -> {args.out}")
    return 0


def _print_layerwise(lw: dict) -> None:
    """The width study's per-layer diagnostics at λ=½, one block per method."""
    columns = (
        ("lewc", "LEWC"),
        ("weak_additivity", "ReLU add."),
        ("reciprocal_ab", "W_A z_B/W_A z_A"),
        ("commutativity", "commut."),
        ("norm_ratio", "‖f_C‖/‖f_A+f_B‖"),
        ("non_overlap", "non-overlap"),
    )
    head = " ".join(f"{title:>15}" for _, title in columns)
    for label, r in lw["methods"].items():
        print(f"\nlayerwise at λ=½, {label}:\n{'layer':<12} {head}")
        for row in r["layerwise"]["layers"]:
            cells = " ".join(
                f"{row[k]:>15.4f}" if row.get(k) is not None else f"{'—':>15}" for k, _ in columns
            )
            print(f"{row['name']:<12} {cells}")
    rp = lw["random_permutations"]
    print(f"\nmerges at λ=½ ({rp['rest']} test examples; temperature fitted on {rp['held']}):")
    print(
        f"{'merge':<10} {'accuracy':>9} {'acc. barrier':>13} {'cal. loss barrier':>18} {'temp.':>7}"
    )
    for label, m in rp["merges"].items():
        print(
            f"{label:<10} {100 * m['accuracy']:>8.2f}% {100 * m['accuracy_barrier']:>12.2f}% "
            f"{m['calibrated_loss_barrier']:>18.4f} {m['temperature']:>7.3f}"
        )
    f = lw["flatness"]
    print(
        f"flatness: θ_A moved d={f['distance']:.2f} at random: accuracy "
        + ", ".join(f"{100 * a:.1f}%" for a in f["accuracy"])
        + " at λ = "
        + ", ".join(f"{lam:g}" for lam in f["lambdas"])
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from lmckit._io import check_output_dir
    from lmckit.experiments.demo import DemoRow, format_table, run_demo

    check_output_dir(args.out, "--out")
    with ProgressBars(not args.quiet) as bars:
        summary = run_demo(
            args.out,
            dataset=args.dataset,
            epochs=args.epochs,
            ste_epochs=args.ste_epochs,
            progress=bars,
            budget=_budget(args),
        )
    rows = [DemoRow(**r) for r in summary["rows"]]
    ends = summary["endpoints"]
    print()
    print(
        f"MLP 3×512 on {summary['dataset']}, {summary['epochs']} epochs: test accuracy "
        f"A {100 * ends['A']['test_accuracy']:.2f} %, B {100 * ends['B']['test_accuracy']:.2f} %"
    )
    print(format_table(rows))
    print()
    print("pairwise test-loss barriers (naive -> weight matching):")
    for p in summary["pairwise_wm"]:
        print(
            f"  seeds {p['pair'][0]}–{p['pair'][1]}: {p['naive_loss_barrier']:.4f} -> "
            f"{p['wm_loss_barrier']:.4f}"
        )
    print(f"figures: {summary['figures']['interpolation']}, {summary['figures']['barriers']}")
    return 0


_DRAWLESS_MERGES = ("average", "fedavg")  # no group order, no batches, no probes of their own


def _check_merge_draws(args: argparse.Namespace) -> None:
    """``--seed`` on a merge that draws nothing: a plain average without sharpness probes
    (its BatchNorm reset, if any, combines the statistics of all the training examples
    exactly, whatever their order)."""
    methods = args.methods if args.sweep_n else [args.method]
    if (
        "seed" in args.given
        and all(m in _DRAWLESS_MERGES for m in methods)
        and not args.sharpness_probes
    ):
        raise UsageError(
            f"--seed does not apply here: {', '.join(methods)} draws nothing (no group order, "
            "no probes; a BatchNorm reset uses every training example whatever their order)"
        )


def cmd_merge(args: argparse.Namespace) -> int:
    from lmckit._io import check_output_dir
    from lmckit.model_folder import is_model_folder
    from lmckit.workflows.merging import (
        check_checkpoints,
        check_folder_merge_method,
        run_merge,
        sweep,
    )

    if args.methods and not args.sweep_n:
        raise UsageError("--methods is for --sweep-n; use --method for a single merge")
    check_output_dir(args.out, "--out")
    if is_model_folder(args.checkpoints[0]):  # before any folder is hashed and traced
        for method in args.methods if args.sweep_n else [args.method]:
            check_folder_merge_method(method)
    _check_merge_draws(args)  # before the checkpoints are read
    ckpts = _load_user_checkpoints(args.checkpoints, args)
    check_checkpoints(ckpts)
    if ckpts[0].folder:
        return _merge_folders(ckpts, args)
    data = _data_for(ckpts[0], args)
    from lmckit.workflows.estimates import check_merge

    check_merge(
        ckpts, args.method, data, landscape=args.landscape,
        sharpness_probes=args.sharpness_probes, epochs=args.epochs, budget=_budget(args),
    )  # fmt: skip
    options = {
        "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
        "variant": args.variant,
    }  # fmt: skip
    with ProgressBars(not args.quiet) as bars:
        if args.sweep_n:
            methods = args.methods or list(SWEEP_METHODS)
            results = sweep(
                ckpts,
                methods,
                args.sweep_n,
                data,
                args.out,
                seed=args.seed,
                progress=bars,
                **options,
            )
            print(f"{'n':>3} " + " ".join(f"{m:>12}" for m in methods) + "   (merged test acc %)")
            for n in args.sweep_n:
                accs = " ".join(f"{100 * results[m][n]['merged_accuracy']:>12.2f}" for m in methods)
                print(f"{n:>3} {accs}")
            print(f"sweep results and plot -> {args.out}")
            return 0
        report = run_merge(
            ckpts,
            args.method,
            data,
            args.out,
            seed=args.seed,
            sharpness_probes=args.sharpness_probes,
            landscape=args.landscape,
            progress=bars,
            **options,
        )
    print(f"method {report['method']}: {report['seconds']:.1f} s")
    print(
        f"merged test accuracy {100 * report['merged_accuracy']:.2f} % (models: mean "
        f"{100 * report['mean_accuracy']:.2f} %), loss {report['merged_loss']:.4f} "
        f"(gap {report['loss_gap']:+.4f}, pairwise gap {report['pairwise_gap']:+.4f})"
    )
    print(
        f"merged ECE {report['merged_ece']:.4f}; logit ensemble of the inputs: accuracy "
        f"{100 * report['ensemble_accuracy']:.2f} %, loss {report['ensemble_loss']:.4f}, "
        f"ECE {report['ensemble_ece']:.4f}"
    )
    if report["groups"]:
        groups = list(report["groups"])
        print("accuracy % on each part's majority classes (inputs trained on parts):")
        print(f"{'':>10} {'test':>7} " + " ".join(f"{g:>8}" for g in groups))
        for name, row in report["models"].items():
            cells = " ".join(
                f"{100 * v:8.2f}" if v is not None else f"{'-':>8}" for v in row["groups"].values()
            )
            print(f"{name:>10} {100 * row['accuracy']:7.2f} {cells}")
    if "sharpness_merged" in report:
        print(
            f"sharpness tr(H⊙θθᵀ): merged {report['sharpness_merged']['value']:.4g} ± "
            f"{report['sharpness_merged']['stderr']:.2g}, models' mean "
            f"{report['sharpness_models_mean']:.4g}"
        )
    print(f"merged checkpoint, permutations.json, metrics.json, plots -> {args.out}")
    return 0


def _merge_folders(ckpts, args: argparse.Namespace) -> int:
    """``lmckit merge`` of model folders: by their weights, written as a model folder."""
    from lmckit.workflows.merging import run_merge_folders

    if args.sweep_n or args.sharpness_probes or args.landscape:
        raise UsageError(
            "model folders are merged by their weights: --sweep-n, --sharpness-probes and "
            "--landscape evaluate on data, which model folders do not record"
        )
    out = Path(args.out).resolve()
    for c in ckpts:
        if out == c.path.resolve() or out.is_relative_to(c.path.resolve()):
            raise UsageError(
                f"--out {args.out} is inside the input model folder {c.path}; choose a folder "
                "of its own"
            )
    options = {
        "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
        "variant": args.variant,
    }  # fmt: skip
    with ProgressBars(not args.quiet) as bars:
        report = run_merge_folders(
            ckpts, args.method, args.out, seed=args.seed, progress=bars, **options
        )
    print(f"method {report['method']}: {report['seconds']:.1f} s")
    print(f"{'model':<40} {'L2 to merged':>13} {'aligned':>9}")
    for path, d in report["distance_to_merged"].items():
        print(f"{path:<40} {d['before_alignment']:>13.4f} {d['after_alignment']:>9.4f}")
    print(f"merged model folder, permutations.json, metrics.json -> {args.out}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lmckit._io import check_output_dir
    from lmckit.experiments.runner import run_experiment
    from lmckit.experiments.spec import load_experiment, parse_overrides

    experiment = load_experiment(args.experiment, parse_overrides(args.set or []))
    check_output_dir(args.out, "--out")
    print(f"experiment {experiment.name}: {experiment.description or '(no description)'}")
    if experiment.expected_runtime:
        print(f"expected run time: {experiment.expected_runtime}")
    if args.dry_run:
        return _print_plan(experiment, args)
    if args.executor == "local":
        from lmckit.experiments.executors import usable_cores

        cores = usable_cores()
        if args.jobs > cores:  # allowed (memory-bound jobs), but rarely what was meant
            print(
                f"note: --jobs {args.jobs} is more than this machine's {cores} usable CPU "
                f"core(s): the jobs will share them (--jobs {cores} is usually faster)",
                file=sys.stderr,
            )
    with ProgressBars(not args.quiet) as bars:
        overall = bars("jobs", keep=True)
        summary = run_experiment(
            experiment,
            args.out,
            executor=args.executor,
            jobs=args.jobs,
            address=args.address,
            retry_failed=args.retry_failed,
            data_dir=args.data_dir,
            download=not args.no_download,
            device=args.device,
            log=lambda message: print(message, flush=True),
            overall=overall,
            job_progress=None if args.jobs > 1 and args.executor == "ray" else _JobBars(bars),
            budget=_budget(args),
            reuse_from=args.reuse_from or (),
            only=args.only or (),
        )
    print(
        f"{len(summary.done)} jobs run, {len(summary.reused)} reused from the store, "
        f"{len(summary.failed)} failed, {len(summary.waiting)} waiting on failed jobs "
        f"({summary.seconds:.1f} s) -> {args.out}"
    )
    if summary.failed:
        print(f"see `lmckit status {args.out}` for the errors; rerun with --retry-failed")
    return 0 if summary.complete else 1


def _print_plan(experiment, args: argparse.Namespace) -> int:
    """``lmckit run --dry-run``: one line per job the run would take up, then the counts."""
    from lmckit.experiments.runner import plan_run

    planned = plan_run(
        experiment,
        args.out,
        data_dir=args.data_dir,
        download=not args.no_download,
        budget=_budget(args),
        reuse_from=args.reuse_from or (),
        only=args.only or (),
        log=print,
    )
    width = max(len(job.name) for job in planned)
    counts = {"finished before": 0, "failed before": 0, "waiting": 0, "resumable": 0, "to run": 0}
    stuck: set[str] = set()  # failed before and not retried, or waiting on such a job
    for job in planned:
        blocker = next((d for d in job.deps if d in stuck), None)
        if blocker is not None and job.earlier != "done":
            state = f"waits: it needs {blocker}, which will not run"
            counts["waiting"] += 1
            stuck.add(job.name)
        elif job.earlier == "done":
            state = f"finished in run {job.run} (reused if its inputs are unchanged)"
            counts["finished before"] += 1
        elif job.earlier == "failed" and not args.retry_failed:
            state = f"failed in run {job.run} (not run again without --retry-failed; "
            state += "the jobs that need it wait)"
            counts["failed before"] += 1
            stuck.add(job.name)
        elif job.resumable is not None:
            state = resumable_line(job.name, job.resumable).split(" saved ", 1)[1]
            state = f"{job.earlier} in run {job.run}; resumes from its file, saved {state}"
            counts["resumable"] += 1
        else:
            state = "to run" if job.earlier is None else f"to run ({job.earlier} in run {job.run})"
            counts["to run"] += 1
        needed = "" if job.named else "  (needed)"
        print(f"  {job.name:<{width}}  {state}{needed}")
    named = sum(job.named for job in planned)
    which = f"{named} named by --only, {len(planned) - named} they need" if args.only else "all"
    tally = ", ".join(f"{n} {what}" for what, n in counts.items())
    print(f"dry run: {len(planned)} jobs ({which}): {tally}; nothing was run or written")
    return 0


class _JobBars:
    """Per-job bars for ``lmckit run``, only for jobs that report progress."""

    def __init__(self, bars: ProgressBars) -> None:
        self.bars = bars

    def __call__(self, name: str):
        return self.bars(name, delay=1.0)  # short jobs come and go without a bar


def cmd_status(args: argparse.Namespace) -> int:
    import time
    from datetime import datetime

    from lmckit._io import check_output_dir, folder_holder, locked_output
    from lmckit.experiments.ledger import STATUSES, Ledger

    path = args.out / "ledger.sqlite"
    if not path.is_file():
        raise UsageError(f"{args.out} holds no experiment ledger (ledger.sqlite)")
    exports = [(f, o) for f, o in ((args.csv, "--csv"), (args.parquet, "--parquet")) if f]
    for folder, option in exports:  # before the table is printed, not after
        check_output_dir(folder, option)
    if args.parquet:
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:  # before any output, not after
            raise UsageError("--parquet needs pyarrow (pip install pyarrow); --csv does not")
    ledger = Ledger(path, create=False)
    try:
        runs = ledger.runs()
        if runs:
            last = runs[-1]
            when = datetime.fromtimestamp(last["started"]).strftime("%Y-%m-%d %H:%M")
            sets = ", ".join(f"{k}={v!r}" for k, v in last["overrides"].items())
            source = str(last["environment"].get("lmckit_source") or "")
            code = source[:12] + (" (modified)" if source.endswith("(modified)") else "")
            only = last["environment"].get("only") or []
            print(
                f"run {len(runs)} of {len(runs)}, started {when}"
                + (f", with --set {sets}" if sets else "")
                + (f", only {' '.join(only)} and their inputs" if only else "")
                + (f", lmckit {code}" if code else "")
                + " (earlier runs are kept in the ledger; this shows the latest)"
            )
        summary, jobs, planned = ledger.summary(), ledger.jobs(), ledger.planned()
        waiting = waiting_counts(summary, planned)
        columns = (*STATUSES, "reused")
        print(
            f"{'step':<8} "
            + (f"{'waiting':>11} " if planned is not None else "")
            + " ".join(f"{s:>11}" for s in columns)
        )
        empty = {**dict.fromkeys(STATUSES, 0), "reused": 0}
        for kind in sorted(set(summary) | set(waiting)):
            counts = summary.get(kind, empty)
            print(
                f"{kind:<8} "
                + (f"{waiting.get(kind, 0):>11} " if planned is not None else "")
                + " ".join(f"{counts[s]:>11}" for s in columns)
            )
        running = sum(counts["running"] for counts in summary.values())
        held = folder_holder(args.out) is not None
        if sum(waiting.values()) and not held:
            print(
                f"{sum(waiting.values())} job(s) never started: the run stopped first, or "
                "their inputs failed; the same lmckit run command goes on"
            )
        if running and not held:
            print(
                f"no lmckit run holds {args.out} now: its {running} job(s) marked running "
                "stopped with their run (killed); the same lmckit run command runs them again"
            )
        elif running:
            for line in running_lines(jobs, time.time(), ledger.progress_rows()):
                print(line)
        for job in jobs:
            if job["status"] in ("failed", "interrupted"):
                lines = (job["error"] or "").strip().splitlines()
                reason = lines[-1] if lines else ""
                # attempts count finished tries; an interrupted one never finished
                tries = f" ({job['attempts']} attempt(s))" if job["status"] == "failed" else ""
                print(f"{job['status']}: {job['name']}{tries}: {reason}")
        _print_resumable(args.out, jobs)
        # the tables go into folders lmckit guards: a user's own jobs.csv is never replaced
        for folder, option in exports:
            export = ledger.export_csv if option == "--csv" else ledger.export_parquet
            with locked_output(folder, option):
                for path in export(folder):
                    print(f"wrote {path}")
    finally:
        ledger.close()
    return 0


def waiting_counts(
    summary: dict[str, dict[str, int]], planned: dict[str, int] | None
) -> dict[str, int]:
    """Per step, the jobs of the run's plan not yet in its ledger — waiting for their
    inputs (a job enters the ledger once its inputs are done and its result key known)."""
    from lmckit.experiments.ledger import STATUSES

    if planned is None:
        return {}
    return {
        kind: max(0, count - sum(summary.get(kind, {}).get(s, 0) for s in STATUSES))
        for kind, count in planned.items()
    }


def _duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"2.5 h"``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def running_lines(
    jobs: list[dict[str, Any]],
    now: float,
    progress: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """One line per job running at ``now`` (seconds since the epoch): for how long, and
    how long the finished jobs of its step took to compute (shortest–longest; a reused
    job keeps its time), to judge what is left — and, where the ledger has the job's
    latest progress event (``progress``: :meth:`Ledger.progress_rows
    <lmckit.experiments.ledger.Ledger.progress_rows>`), where it is (:func:`progress_text`)."""
    took: dict[str, list[float]] = {}
    for job in jobs:
        if job["status"] == "done" and job["seconds"] is not None:
            took.setdefault(job["kind"], []).append(job["seconds"])
    lines = []
    for job in jobs:
        if job["status"] != "running" or job["started"] is None:
            continue
        line = f"running: {job['name']} for {_duration(now - job['started'])}"
        done = took.get(job["kind"])
        if done:
            span = _duration(min(done))
            if len(done) > 1:
                span += f" to {_duration(max(done))}"
            line += f" (its step's {len(done)} finished job(s) took {span})"
        row = (progress or {}).get(job["name"])
        if row is not None:
            line += "; " + progress_text(row, now)
        lines.append(line)
    return lines


def progress_text(row: dict[str, Any], now: float) -> str:
    """``at step S of T (epoch E), about D more at this run's pace`` for a job's latest
    progress event (a ledger progress row): the pace is the time per step since the first
    step this run saw of it (a resumed job's earlier steps are not in it); ``last report
    M min ago`` when the event is old — the job may be stuck in a long step or its
    worker gone."""
    from lmckit.experiments.ledger import PROGRESS_EVERY

    step, total = row["step"], row["total"]
    text = f"at step {step}" + (f" of {total}" if total is not None else "")
    epoch = row["metrics"].get("epoch")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool):
        text += f" (epoch {epoch:g})"
    ran, steps = row["updated"] - row["first_time"], step - row["first_step"]
    if total is not None and total > step and steps > 0 and ran > 0:
        text += f", about {_duration(ran / steps * (total - step))} more at this run's pace"
    if now - row["updated"] > 6 * PROGRESS_EVERY:
        text += f" (last report {_duration(now - row['updated'])} ago)"
    return text


def _print_resumable(out: Path, jobs: list[dict[str, Any]]) -> None:
    """One line per unfinished job whose state a resume file holds: how far it got."""
    from lmckit.resume import saved_progress
    from lmckit.store import Store

    store = Store(out / "store")
    if not store.resume_files():
        return

    for job in jobs:
        if job["status"] == "done" or not job["key"]:
            continue
        progress = saved_progress(store.resume_file(job["key"]))
        if progress is not None:
            print(resumable_line(job["name"], progress))


def resumable_line(name: str, progress: dict[str, Any]) -> str:
    """``resumable: NAME saved after epoch E of N (M min of work kept; about T more at its
    pace)`` (``point`` for an interpolation's λ points) for a job's resume file
    (:func:`lmckit.resume.saved_progress`); the estimate is the time per epoch of the
    process that saved the file (from where it resumed, when the file says) times the
    epochs left — for a file saved within an epoch only where it records the epoch's steps
    (STE-MM's do)."""
    seconds, epoch, epochs = progress["seconds"] or 0, progress["epoch"] or 0, progress["epochs"]
    step, per_epoch = progress["step_in_epoch"] or 0, progress.get("steps_per_epoch")
    where = f"after {progress.get('unit') or 'epoch'} {epoch}"
    done = _epochs_done(epoch, step, per_epoch)
    if step:
        where = f"at step {step}" + (f" of {per_epoch}" if per_epoch else "")
        where += f" of epoch {epoch + 1}"
    kept = f"{seconds / 60:.0f} min of work kept"
    if done and isinstance(epochs, int) and epochs > done:
        pace = seconds / done
        began = progress.get("resumed_from")
        began = began if isinstance(began, dict) else {}  # older files have none
        began_at = _epochs_done(began.get("epoch") or 0, began.get("step_in_epoch"), per_epoch)
        if began_at is not None and done > began_at and seconds > (began.get("seconds") or 0):
            pace = (seconds - (began.get("seconds") or 0)) / (done - began_at)
        kept += f"; about {_duration(pace * (epochs - done))} more at its pace"
    return f"resumable: {name} saved {where} of {epochs} ({kept})"


def _epochs_done(epoch: int, step: int | None, per_epoch: int | None) -> float | None:
    """Epochs done at step ``step`` of epoch ``epoch + 1`` (fractional; ``None`` when the
    step is within an epoch of unknown length)."""
    if not step:
        return epoch
    return epoch + step / per_epoch if per_epoch else None


def cmd_report(args: argparse.Namespace) -> int:
    from lmckit.experiments.report import write_report

    print(f"report -> {write_report(args.out)}")
    return 0


# -- options that do not apply: one table, checked before any command runs ---------------
def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _needs(dest: str, why: str) -> Callable[[argparse.Namespace], str | None]:
    """Applies only when ``dest`` was given too."""
    return lambda a: None if dest in a.given else f"it needs {_flag(dest)} ({why})"


def _excludes(dest: str, why: str) -> Callable[[argparse.Namespace], str | None]:
    """Does not apply together with ``dest``."""
    return lambda a: f"it conflicts with {_flag(dest)} ({why})" if dest in a.given else None


def _method_option(registry_name: str, dest: str) -> Callable[[argparse.Namespace], str | None]:
    """A method's keyword option: applies when the chosen method (or, for a merge sweep,
    one of the swept methods) takes it — read from the method registry."""

    def check(a: argparse.Namespace) -> str | None:
        if registry_name == "match":
            from lmckit.match import METHODS as registry
        else:
            from lmckit.merge import METHODS as registry
        swept = getattr(a, "methods", None) or list(SWEEP_METHODS)
        methods = swept if getattr(a, "sweep_n", None) else [a.method]
        if any(dest in registry[m].options() for m in methods):
            return None
        if len(methods) == 1:
            takes = ", ".join(registry[methods[0]].options()) or "none"
            return f"method {methods[0]} takes no {dest} (its options: {takes})"
        return f"none of the methods {', '.join(methods)} takes {dest}"

    return check


def _data_needed(a: argparse.Namespace) -> str | None:
    from lmckit.match import METHODS

    if METHODS[a.method].needs_data:
        return None
    return f"method {a.method} does not look at data"


def _split_setting(dest: str, kinds: tuple[str, ...]) -> Callable[[argparse.Namespace], str | None]:
    def check(a: argparse.Namespace) -> str | None:
        if a.split is None:
            return "it is a setting of --split"
        if a.split not in kinds:
            return f"--split {a.split} takes no {dest} (it is for {' and '.join(kinds)})"
        return None

    return check


Check = Callable[[argparse.Namespace], str | None]
_MODEL_CLASS: list[tuple[str, Check]] = [
    (dest, _needs("model_class", "it describes a user's class"))
    for dest in ("model_args", "input_shape", "tokens")
]


def _not_for_folders(a: argparse.Namespace) -> str | None:
    from lmckit.model_folder import is_model_folder

    if is_model_folder(a.target):
        return "a model folder's example input comes from its config"
    return None


_MATCH_OPTIONS = ("epochs", "lr", "batch_size", "restarts", "max_memory")
_DATA_OPTIONS = ("dataset", "data_dir", "no_download")
SWEEP_METHODS = ("star-wm", "merge-many", "ccmm", "ste-mm")
_FIXED = "it draws a fixed construction"
APPLIES: dict[str, list[tuple[str, Check]]] = {
    "match": [
        *((d, _method_option("match", d)) for d in _MATCH_OPTIONS),
        *((d, _data_needed) for d in _DATA_OPTIONS),
        *_MODEL_CLASS,
    ],
    "interpolate": [
        ("method", _excludes("perm", "the path uses the given permutation")),
        *_MODEL_CLASS,
    ],
    "analyze": [
        *(
            (d, _excludes("counterexample", _FIXED))
            for d in ("a", "b", "perm", "method", "gamma", "no_taylor", "layerwise", "no_data")
        ),
        *((d, _excludes("counterexample", _FIXED)) for d in (*_DATA_OPTIONS, "model_class")),
        ("method", _excludes("perm", "the analysis uses the given permutation")),
        *((d, _excludes("no_data", "weights only")) for d in _DATA_OPTIONS),
        ("layerwise", _excludes("no_data", "the diagnostics run the models on data")),
        ("no_taylor", _excludes("no_data", "without data there is no Taylor barrier anyway")),
        *_MODEL_CLASS,
    ],
    "merge": [
        *((d, _method_option("merge", d)) for d in ("epochs", "lr", "batch_size")),
        ("methods", _needs("sweep_n", "use --method for a single merge")),
        ("method", _excludes("sweep_n", "a sweep takes --methods")),
        ("sharpness_probes", _excludes("sweep_n", "sharpness is measured for a single merge")),
        ("landscape", _excludes("sweep_n", "the landscape is drawn for a single merge")),
        *_MODEL_CLASS,
    ],
    "train": [
        ("part", _needs("split", "the part of which partition")),
        ("fraction", _split_setting("fraction", ("class-imbalanced",))),
        ("clients", _split_setting("clients", ("dirichlet", "random"))),
        ("alpha", _split_setting("alpha", ("dirichlet",))),
        ("split_seed", _split_setting("split_seed", ("class-imbalanced", "dirichlet", "random"))),
        ("hidden", _excludes("width_multiplier", "the MLP's widths are given or scaled")),
    ],
    "spec": [
        ("model_args", lambda a: None if ":" in a.target else "the target is a checkpoint"),
        *((d, _not_for_folders) for d in ("input_shape", "tokens", "batch", "strict")),
    ],
    "run": [("address", lambda a: None if a.executor == "ray" else "it is for --executor ray")],
}
"""For each command, the options that apply only in some cases: ``(dest, check)`` pairs,
``check(args)`` saying why the option does not apply (``None`` when it does). An option
given on the command line where it does not apply is an error, never silently ignored."""


NO_REPEATS: dict[str, tuple[str, ...]] = {
    "train": ("seeds",),
    "interpolate": ("method",),
    "analyze": ("method", "gamma"),
    "merge": ("methods",),
}
"""List options whose values must be distinct: a repeated seed, method or γ would compute
the same thing twice and list it twice."""


def _check_applicable(args: argparse.Namespace) -> None:
    for dest in NO_REPEATS.get(args.command, ()):
        values = getattr(args, dest, None) or []
        repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
        if dest in args.given and repeated:
            raise UsageError(f"{_flag(dest)} lists {repeated} more than once")
    for dest, check in APPLIES.get(args.command, []):
        if dest in args.given:
            why = check(args)
            if why:
                name = dest.upper() if dest in ("a", "b") else _flag(dest)
                raise UsageError(f"{name} does not apply here: {why}")


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.extend(_subparsers(sub))
    return out


def given_options(argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the options ``argv`` sets explicitly (not by default): the same
    parser with every default suppressed leaves only those in the namespace."""
    shadow = build_parser()
    positionals = set()
    for parser in _subparsers(shadow):
        for action in parser._actions:
            if action.dest == "command":
                continue
            if action.option_strings:
                action.default = argparse.SUPPRESS
            else:  # argparse would run an optional positional's type on a string default
                action.default = None
                positionals.add(action.dest)
        parser._defaults.clear()
    namespace, _ = shadow.parse_known_args(list(argv))
    given = {k for k, v in vars(namespace).items() if k not in positionals or v is not None}
    return frozenset(given - {"command", "debug"})


# -- the parser ----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage is one ``--help`` away)."""

    _argv: list[str] | None = None  # what main() parses (sys.argv otherwise)

    def error(self, message: str) -> NoReturn:
        message = self._dash_value(message) or message
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def _dash_value(self, message: str) -> str | None:
        """argparse reads a value that starts with ``-`` (``--max-memory -1G``) as an option
        and says the option lacks its argument: say what was given instead."""
        import re

        found = re.fullmatch(r"argument (\S+): expected (one|at least one) argument", message)
        if found is None:
            return None
        names = found.group(1).split("/")
        argv = self._argv if self._argv is not None else sys.argv[1:]
        for i, token in enumerate(argv[:-1]):
            value = argv[i + 1]
            if (
                token in names
                and value.startswith("-")
                and value not in self._option_string_actions
            ):
                return (
                    f"argument {token}: {value!r} was read as an option, not as its value; "
                    f"write {token}={value} to give a value that starts with '-'"
                )
        return None


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate checkpoints on data."""
    p.add_argument("--dataset", type=_dataset, help="default: the dataset the checkpoint records")
    p.add_argument("--data-dir", type=_existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=_device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument(
        "--seed", type=_seed, default=0,
        help="seeds the method's randomness (group orders, batch order, draws); default 0",
    )  # fmt: skip
    _add_max_hours(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _add_max_hours(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-hours",
        type=_positive,
        metavar="H",
        help="refuse work whose estimated time exceeds H hours (default 24)",
    )


def _add_model_class_arguments(p: argparse.ArgumentParser) -> None:
    """Options for A and B that are a user's state dicts rather than lmckit checkpoints."""
    p.add_argument(
        "--model-class", metavar="MODULE:CLASS",
        help="A and B are plain state dicts (.safetensors, or .pt read with weights_only) of "
        "this class, importable from here; its spec is traced (see `lmckit spec`)",
    )  # fmt: skip
    p.add_argument("--model-args", metavar="JSON", help="keyword arguments for the class")
    p.add_argument(
        "--input-shape", type=_int_at_least(1), nargs="+", metavar="N",
        help="with --model-class: one example's shape without the batch axis",
    )  # fmt: skip
    p.add_argument(
        "--tokens", type=_int_at_least(1), metavar="VOCAB",
        help="with --model-class: the model takes token ids in [0, VOCAB)",
    )  # fmt: skip


def _methods_help(summaries: dict[str, str]) -> str:
    return "; ".join(f"{name}: {summary}" for name, summary in summaries.items())


def build_parser() -> argparse.ArgumentParser:
    """The ``lmckit`` argument parser (method choices come from the registries)."""
    # plain data from the registries: help needs no torch
    from lmckit._catalog import (
        DATASETS,
        EXECUTORS,
        MATCHERS,
        MERGERS,
        MODELS,
        OPTIMIZERS,
        SCHEDULES,
        SPLIT_KINDS,
        VARIANTS,
    )

    parser = _Parser(
        prog="lmckit",
        description="Align, merge and analyse neural networks modulo permutation symmetries.",
    )
    parser.add_argument("--version", action="version", version=f"lmckit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("info", help="list the model zoo with group sizes and symmetry counts")
    p.add_argument("-v", "--verbose", action="store_true", help="also list every group")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "train",
        help="train one model per seed into a folder of checkpoints (resumable)",
        description="Train a zoo model once per seed. Finished seeds are skipped, so an "
        "interrupted run resumes by running the same command again. Unset options take the "
        "papers' recipe for the model (MLP: Adam 1e-3, batch 512; conv nets: SGD 0.4 with "
        "Nesterov momentum, weight decay 5e-4, batch 500, warm-up + linear decay).",
    )
    p.add_argument(
        "--model",
        required=True,
        type=_model_name,
        help="the zoo: " + ", ".join(MODELS) + " (gpt: a byte-level language model)",
    )
    p.add_argument(
        "--dataset",
        type=_dataset,
        default="fashion-mnist",
        help=", ".join(DATASETS) + " (python-stdlib: this Python's standard-library sources "
        "as bytes, for gpt; --data-dir: another tree)",
    )
    p.add_argument("--seeds", type=_seed, nargs="+", default=[0], help="one model per seed")
    p.add_argument("--out", required=True, type=_out_path, help="folder for the checkpoints")
    p.add_argument(
        "--epochs", type=_int_at_least(1),
        help="passes over the training set (default: the paper's recipe for the model)",
    )  # fmt: skip
    p.add_argument(
        "--width-multiplier", type=_positive, help="scales the model's widths (default 1)"
    )
    p.add_argument(
        "--hidden", type=_int_at_least(1), nargs="+", help="MLP hidden widths (default 3×512·k)"
    )
    p.add_argument(
        "--norm",
        choices=["none", "batch", "layer"],
        default=None,
        help="normalisation layers (default: none for MLP, batch for conv nets)",
    )
    p.add_argument("--skip", action="store_true", help="MLP with residual connections")
    p.add_argument(
        "--optimizer", choices=list(OPTIMIZERS),
        help="default: the recipe's (adam for MLPs and transformers, sgd for conv nets); "
        "sophia-l2: Sophia with the weight decay as an L2 penalty",
    )  # fmt: skip
    p.add_argument("--lr", type=_positive, help="peak learning rate (default: the recipe's)")
    p.add_argument("--momentum", type=_float_in(0.0, 1.0), help="SGD momentum (default 0.9)")
    p.add_argument(
        "--weight-decay", type=_float_in(0.0),
        help="L2 penalty; decoupled for adamw and sophia (default: the recipe's)",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", type=_int_at_least(1), help="examples per step (default: the recipe's)"
    )
    p.add_argument(
        "--schedule", choices=list(SCHEDULES),
        help="constant, or warmup_linear: linear warm-up to --lr, then linear decay to 0",
    )  # fmt: skip
    p.add_argument(
        "--warmup-epochs", type=_float_in(0.0),
        help="warm-up length for warmup_linear (default 5, or a fifth of a shorter run)",
    )  # fmt: skip
    p.add_argument(
        "--label-smoothing", type=_float_in(0.0, 1.0), help="cross-entropy label smoothing (0)"
    )
    p.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random crop + flip (default: on for CIFAR)",
    )
    split = p.add_argument_group(
        "training on a part of the data",
        "Train on one part of a partition of the training set (the test set stays whole): "
        "Git Re-Basin's class-imbalanced halves (--split class-imbalanced --fraction 0.2 "
        "--part a|b), a label-skewed Dirichlet client (--split dirichlet --clients N "
        "--alpha A --part k) or a random client (--split random --clients N --part k). "
        "The partition depends on --split-seed only, so every part of one partition "
        "comes from the same cut; the checkpoint records the split and its indices' hash.",
    )
    split.add_argument(
        "--split", choices=list(SPLIT_KINDS), help="how the training set is partitioned"
    )
    split.add_argument("--part", help="a or b (class-imbalanced), else 0 … clients − 1")
    split.add_argument(
        "--fraction", type=_float_in(0.0, 1.0), default=0.2,
        help="class-imbalanced: the share of the other half's classes a part keeps (0.2)",
    )  # fmt: skip
    split.add_argument(
        "--clients", type=_int_at_least(1), default=2,
        help="dirichlet, random: the number of parts (2)",
    )  # fmt: skip
    split.add_argument("--alpha", type=_positive, default=1.0, help="Dirichlet concentration")
    split.add_argument(
        "--split-seed", type=_seed, default=0, help="the partition's seed (0): one cut for all"
    )
    split.add_argument(
        "--init-seed",
        type=_seed,
        help="one initialisation for every seed (clients from a shared start)",
    )
    p.add_argument("--data-dir", type=_existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=_device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--threads", type=_int_in(1, 4096), help="torch CPU threads")
    _add_max_hours(p)
    p.add_argument(
        "--keep-diverged",
        action="store_true",
        help="save a run whose loss rose far above its start (it fails otherwise, keeping "
        "its last good state as <checkpoint>-last-good)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "match",
        help="find the permutation of checkpoint B that aligns it to checkpoint A",
        description="Methods: " + _methods_help(MATCHERS) + ".",
    )
    p.add_argument("a", type=_weights, help="reference checkpoint (.safetensors)")
    p.add_argument("b", type=_weights, help="checkpoint to permute")
    p.add_argument(
        "--method", choices=sorted(MATCHERS), default="wm-fast",
        help="the matcher (default wm-fast); each is described above",
    )  # fmt: skip
    p.add_argument("--out", type=_out_path, default=Path("perm.json"), help="permutation file")
    p.add_argument("--epochs", type=_int_at_least(1), help="STE / Sinkhorn-mid epochs (1)")
    p.add_argument("--lr", type=_positive, help="STE (1e-3) / Sinkhorn (0.1) learning rate")
    p.add_argument("--batch-size", type=_int_at_least(1), help="STE / Sinkhorn-mid batch (256)")
    p.add_argument(
        "--variant", choices=VARIANTS,
        help="STE / Sinkhorn: lmckit's defaults (default) or the paper's procedure as "
        "written (STE: Git Re-Basin Alg. 2; Sinkhorn: Peña et al.'s settings)",
    )  # fmt: skip
    p.add_argument(
        "--restarts", type=_int_at_least(1), help="weight matching: best of this many starts"
    )
    p.add_argument(
        "--max-memory", type=_size, metavar="SIZE",
        help="weight matching: memory it may hold, e.g. 12G (the two models, the cost "
        "matrices, one step's working set); refused up front if too small",
    )  # fmt: skip
    p.add_argument(
        "--aligned", type=_out_path, metavar="FOLDER",
        help="model folders: also write B, permuted onto A (with --symmetries: moved by the "
        "transform, A's norm gains put back), as a model folder of B's architecture and "
        "sharding (from_pretrained loads it)",
    )  # fmt: skip
    p.add_argument(
        "--symmetries", choices=("perm", "orth", "full"), default="perm",
        help="perm: permutations (default); orth: also orthogonal maps where the model's "
        "graph allows them (a transformer's residual stream with its norm gains folded, "
        "each head's query/key and value/output dimensions); full: every kind — invertible "
        "maps per head, positive scalings of ReLU units — fitted by least squares on the "
        "data. With wm, wm-fast (weights, then least squares for full), am (activations) or "
        "ste (weights, then the midpoint loss over the maps); written as a transform file",
    )  # fmt: skip
    _add_data_arguments(p)
    _add_model_class_arguments(p)
    p.set_defaults(func=cmd_match)

    p = sub.add_parser(
        "interpolate",
        help="loss/accuracy along the linear path between two checkpoints, naive and matched",
        description="Evaluate θ(λ) = (1−λ)θ_A + λπ(θ_B) on train and test data for each "
        "matching method (or a given permutation file), with barriers, ensemble reference and "
        "plots. BatchNorm statistics are re-estimated at every interior λ.",
    )
    p.add_argument("a", type=_weights, help="checkpoint A, the path's start (λ = 0)")
    p.add_argument("b", type=_weights, help="checkpoint B, permuted onto A; the end (λ = 1)")
    p.add_argument(
        "--perm", type=_existing_file, help="use this permutation file instead of --method"
    )
    p.add_argument(
        "--method",
        nargs="+",
        default=["none", "wm-fast"],
        choices=["none", *sorted(MATCHERS)],
        help="none = the naive path",
    )
    p.add_argument("--out", type=_out_path, required=True, help="folder for curves and plots")
    p.add_argument("--lambdas", type=_int_at_least(2), default=25, help="points on the path")
    p.add_argument("--calibrated", action="store_true", help="temperature-calibrated loss too")
    p.add_argument("--test-only", action="store_true", help="skip the training split")
    p.add_argument("--bn-batches", type=_int_at_least(1), default=20, help="batches for BN reset")
    p.add_argument(
        "--repair",
        action="store_true",
        help="REPAIR channel statistics at every interior λ (BN-free nets)",
    )
    _add_data_arguments(p)
    _add_model_class_arguments(p)
    p.set_defaults(func=cmd_interpolate)

    p = sub.add_parser(
        "analyze",
        help="L2 distances, spectra, singular-vector alignment R(γ) and the Taylor barrier of "
        "two checkpoints (or Git Re-Basin's counterexample)",
        description="Ito et al.'s measurements for each matching method: per-tensor L2 "
        "before/after, singular values (Fig. 1), R(θ_A, π(θ_B)) at each γ (Fig. 2), R to the "
        "merged model (Fig. 3), singular-vector cosine heat maps, and eq. 2's Taylor barrier "
        "beside the actual one along λ; conv nets also get their operator spectra. "
        "--counterexample draws Git Re-Basin Fig. 6 instead.",
    )
    p.add_argument("a", type=_weights, nargs="?", help="reference checkpoint")
    p.add_argument("b", type=_weights, nargs="?", help="checkpoint to permute")
    p.add_argument("--perm", type=_existing_file, help="use this permutation file")
    p.add_argument(
        "--method",
        nargs="+",
        default=["none", "wm-fast"],
        choices=["none", *sorted(MATCHERS)],
        help="none = no permutation",
    )
    p.add_argument(
        "--gamma",
        type=_float_in(0.0, 1.0),
        nargs="+",
        default=[0.0, 0.3],
        help="thresholds γ of R (singular values > γ × the largest)",
    )
    p.add_argument("--no-taylor", action="store_true", help="skip the Taylor barrier")
    p.add_argument(
        "--layerwise",
        action="store_true",
        help="also the width study's diagnostics at λ=½: LEWC, ReLU weak additivity, second "
        "moments, reciprocal orthogonality, commutativity, activation norms, the flatness "
        "proxy and random-permutation merges with temperature calibration",
    )
    p.add_argument(
        "--no-data",
        action="store_true",
        help="weights only: no Taylor barrier, no data-driven methods",
    )
    p.add_argument(
        "--counterexample",
        action="store_true",
        help="Git Re-Basin's counterexample (App. A.3, Fig. 6) instead",
    )
    p.add_argument(
        "--out", type=_out_path, required=True, help="folder for analysis.json and plots"
    )
    _add_data_arguments(p)
    _add_model_class_arguments(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser(
        "demo",
        help="train 3 MLPs, match them with every method, plot the interpolation curves",
        description="The README's main job: train three 3×512 MLPs on Fashion-MNIST (digits "
        "when it is not installed), match seed 1 to seed 0 with WM, AM, STE and Sinkhorn, "
        "interpolate naive vs matched and print the table. Finished pieces are cached in --out.",
    )
    p.add_argument(
        "--out", type=_out_path, default=Path("demo-out"),
        help="folder for the run: store, ledger, tables, curves, figures (demo-out)",
    )  # fmt: skip
    p.add_argument(
        "--dataset", type=_dataset, help="override the dataset (default: fashion-mnist or digits)"
    )
    p.add_argument(
        "--epochs", type=_int_at_least(1), help="default 5 (Fashion-MNIST) or 40 (digits)"
    )
    p.add_argument(
        "--ste-epochs", type=_int_at_least(1), default=1, help="epochs of STE matching (1)"
    )
    _add_max_hours(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "merge",
        help="merge several checkpoints into one (star, MergeMany, STE-MM, CCMM)",
        description="Merge checkpoints of one architecture; the last is the reference. "
        "Writes the merged checkpoint, permutations, multi-model metrics and plots. With "
        "--sweep-n 2..N, merges the first n checkpoints for every n and method and plots "
        "metric vs n. Methods: " + _methods_help(MERGERS) + ".",
    )
    p.add_argument(
        "checkpoints", nargs="+", type=_weights,
        help="checkpoints (.safetensors) or model folders of one architecture; the last is "
        "the reference",
    )  # fmt: skip
    p.add_argument(
        "--method", default="merge-many", choices=sorted(MERGERS),
        help="the merger (default merge-many); each is described above",
    )  # fmt: skip
    p.add_argument("--sweep-n", type=_range, help="e.g. 2..5: sweep the number of models")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=sorted(MERGERS),
        help="methods for --sweep-n (default: star-wm merge-many ccmm ste-mm)",
    )
    p.add_argument("--out", type=_out_path, required=True, help="folder for the results")
    p.add_argument(
        "--epochs", type=_int_at_least(1), help="STE-MM (paper: 10) / star-STE (1) epochs"
    )
    p.add_argument("--lr", type=_positive, help="STE / STE-MM learning rate (1e-3)")
    p.add_argument("--batch-size", type=_int_at_least(1), help="STE / STE-MM batch (256)")
    p.add_argument(
        "--variant", choices=VARIANTS,
        help="STE-MM / star-STE: lmckit's defaults (default) or the paper's procedure as "
        "written (STE-MM Alg. 1; STE: Git Re-Basin Alg. 2)",
    )  # fmt: skip
    p.add_argument(
        "--sharpness-probes",
        type=_int_at_least(2, zero_means_off=True),
        default=0,
        help="estimate tr(H⊙θθᵀ) of merged and input models with this many probes",
    )
    p.add_argument(
        "--landscape",
        type=_int_at_least(2),
        default=0,
        metavar="RES",
        help="plot loss on the plane through the first three aligned models (RES ≥ 2 points "
        "a side; no landscape without it)",
    )
    _add_data_arguments(p)
    _add_model_class_arguments(p)
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser(
        "run",
        help="run an experiment file (a sweep of training, matching, curves, merges)",
        description="Expand an experiment file into jobs and run those whose results are not "
        "stored yet. Kill it at any time and rerun: finished jobs are reused. Results, the "
        "job ledger and the experiment file go to --out.",
    )
    p.add_argument("experiment", type=_existing_file, help="experiment file (.toml)")
    p.add_argument("--out", type=_out_path, required=True, help="folder for the run")
    p.add_argument(
        "--executor", choices=EXECUTORS, default="local",
        help="local: --jobs processes on this machine; ray: a Ray cluster (--address)",
    )  # fmt: skip
    p.add_argument("--jobs", type=_int_in(1, 4096), default=1, help="jobs at a time")
    p.add_argument("--address", help="Ray cluster address (with --executor ray)")
    p.add_argument("--retry-failed", action="store_true", help="rerun jobs that failed before")
    p.add_argument(
        "--reuse-from",
        action="append",
        type=_existing_dir,
        metavar="FOLDER",
        help="an earlier run's folder (any experiment) whose finished results (and the "
        "resume files of jobs it left half done) this run copies instead of recomputing; "
        "only read (repeatable)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a value of the file, e.g. --set train.epochs=2 (repeatable)",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help="run only the jobs whose names match (shell-style, e.g. 'merge/b1/*'; names as "
        "the report's job table lists them) and the jobs they need (repeatable)",
    )
    p.add_argument("--data-dir", type=_existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=_device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument(
        "--max-hours",
        type=_positive,
        metavar="H",
        help="refuse a run whose largest training job is estimated beyond H hours (default 24)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the jobs this command would take up (with --only: the matching ones and "
        "what they need) and what --out knows of each (finished, failed, resumable), then "
        "stop: nothing is run or written",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "spec",
        help="trace a model's permutation symmetries and print the coverage report",
        description="Export the model with torch.export, relate the axes of every op, verify "
        "the resulting permutation spec (random permutations of every group leave the outputs "
        "unchanged, float64, eval and train mode) and print its groups and frozen axes.",
    )
    p.add_argument(
        "target",
        help="an lmckit checkpoint, a Hugging Face model folder, or MODULE:CLASS (importable "
        "from here)",
    )
    p.add_argument(
        "--input-shape", type=_int_at_least(1), nargs="+", metavar="N",
        help="one example's shape without the batch axis, e.g. 1 28 28 (tokens: the length); "
        "a model folder's comes from its config, an lmckit checkpoint's from the dataset its "
        "sidecar records",
    )  # fmt: skip
    p.add_argument("--batch", type=_int_at_least(1), default=4, help="examples in the trace")
    p.add_argument(
        "--tokens", type=_int_at_least(1), metavar="VOCAB",
        help="integer token inputs drawn from [0, VOCAB) instead of Gaussian floats",
    )  # fmt: skip
    p.add_argument("--model-args", metavar="JSON", help="keyword arguments for CLASS")
    p.add_argument("--strict", action="store_true", help="fail on an operator without a rule")
    p.add_argument("--out", type=_out_path, help="write the spec and report as JSON")
    p.set_defaults(func=cmd_spec)

    p = sub.add_parser("status", help="summarise an experiment run's job ledger")
    p.add_argument("out", type=_existing_dir, help="the run's --out folder")
    p.add_argument(
        "--csv", type=_out_path, metavar="DIR", help="also write jobs.csv and metrics.csv"
    )
    p.add_argument("--parquet", type=_out_path, metavar="DIR", help="also write Parquet (pyarrow)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="write a self-contained HTML report of an experiment run")
    p.add_argument("out", type=_existing_dir, help="the run's --out folder")
    p.set_defaults(func=cmd_report)
    return parser


def _fail(message: str, status: int) -> int:
    print(f"lmckit: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser._argv = argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a one-line usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        args.given = given_options(argv)
        _check_applicable(args)
        return int(args.func(args) or 0)
    except Exception as exc:
        if args.debug:
            raise
        if isinstance(exc, UsageError):
            return _fail(str(exc), 2)
        if isinstance(exc, LmcError):
            return _fail(str(exc), 1)
        if isinstance(exc, BrokenPipeError):  # `lmckit info | head`
            sys.stderr.close()
            return 0
        if isinstance(exc, OSError):
            return _fail(f"{exc.strerror or exc}: {exc.filename or ''}", 1)
        return _fail(
            f"internal error ({type(exc).__name__}: {exc}); rerun with --debug for the "
            "traceback and please report it",
            1,
        )
    except KeyboardInterrupt as stop:
        from lmckit.errors import Terminated

        print("lmckit: interrupted; finished results are kept", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
