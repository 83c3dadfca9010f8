"""The command line's argument types and shared option groups: each type raises
``argparse.ArgumentTypeError`` with a message naming what is wrong, so that argparse prints
one line."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from lmckit.cli.applicability import flag
from lmckit.errors import LmcError, ParamsError, UsageError

MAX_SEED = 2**32 - 1


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_at_least(low: int, *, zero_means_off: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if value < low and not (zero_means_off and value == 0):
            off = " (or 0 for off)" if zero_means_off else ""
            raise argparse.ArgumentTypeError(f"must be ≥ {low}{off}, got {value}")
        return value

    return parse


def int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value

    return parse


def seed(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seeds are integers in [0, {MAX_SEED}], got {value}")
    return value


def float_in(
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


positive = float_in(0.0, low_open=True)


def device(text: str) -> str:
    from lmckit._checks import check_device

    try:
        return check_device(text)
    except ParamsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(text: str) -> int:
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


def out_path(text: str) -> Path:
    """An output path: any path but the empty one (which would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output path is empty")
    return Path(text)


def weights(text: str) -> Path:
    """A checkpoint's weights: an existing file, an lmckit checkpoint by stem, or a Hugging
    Face model folder."""
    from lmckit.checkpoint import checkpoint_paths
    from lmckit.files import special_kind
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


def existing(kind: str) -> Callable[[str], Path]:
    """An argument type for an existing ``"file"`` or ``"folder"``."""

    def parse(text: str) -> Path:
        from lmckit.files import describe_path

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


existing_file, existing_dir = existing("file"), existing("folder")


def dataset(text: str) -> str:
    from lmckit.data import DATASETS, canonical_name

    try:
        return canonical_name(text)
    except LmcError:
        raise argparse.ArgumentTypeError(
            f"unknown dataset {text!r}; choose from {', '.join(DATASETS)}"
        ) from None


def model_name(text: str) -> str:
    from lmckit.workflows.training import model_name_key

    try:
        return model_name_key(text)
    except LmcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count_range(text: str) -> list[int]:
    from lmckit.workflows.merging import parse_range

    try:
        return parse_range(text)
    except LmcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextlib.contextmanager
def as_usage() -> Iterator[None]:
    """Library complaints about values taken from the command line are usage errors."""
    try:
        yield
    except UsageError:
        raise
    except LmcError as exc:
        raise UsageError(str(exc)) from None


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate checkpoints on data."""
    p.add_argument("--dataset", type=dataset, help="default: the dataset the checkpoint records")
    p.add_argument("--data-dir", type=existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument(
        "--seed", type=seed, default=0,
        help="seeds the method's randomness (group orders, batch order, draws); default 0",
    )  # fmt: skip
    add_max_hours(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def add_max_hours(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-hours",
        type=positive,
        metavar="H",
        help="refuse work whose estimated time exceeds H hours (default 24)",
    )


def add_model_class_arguments(p: argparse.ArgumentParser) -> None:
    """Options for A and B that are a user's state dicts rather than lmckit checkpoints."""
    p.add_argument(
        "--model-class", metavar="MODULE:CLASS",
        help="A and B are plain state dicts (.safetensors, or .pt read with weights_only) of "
        "this class, importable from here; its spec is traced (see `lmckit spec`)",
    )  # fmt: skip
    p.add_argument("--model-args", metavar="JSON", help="keyword arguments for the class")
    p.add_argument(
        "--input-shape", type=int_at_least(1), nargs="+", metavar="N",
        help="with --model-class: one example's shape without the batch axis",
    )  # fmt: skip
    p.add_argument(
        "--tokens", type=int_at_least(1), metavar="VOCAB",
        help="with --model-class: the model takes token ids in [0, VOCAB)",
    )  # fmt: skip


def methods_help(summaries: dict[str, str]) -> str:
    """``name: summary; …`` for a command's description."""
    return "; ".join(f"{name}: {summary}" for name, summary in summaries.items())


class OnceOption(argparse.Action):
    """A store option that refuses a second value for its ``dest`` — given twice, or also
    under its old spelling (:class:`RenamedOption`) — rather than keeping the last."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(
                f"{option_string} sets {flag(self.dest)}, which is already given: give it once"
            )
        setattr(namespace, self.dest, values)


class RenamedOption(OnceOption):
    """An option's old spelling (``--variant`` for ``--recipe``), hidden from ``--help`` and
    accepted for one release: it stores into the new option's ``dest`` and prints one line
    saying the new name."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs) -> None:
        self.new = new
        self.announce = True  # off in the parse that only finds which options were given
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if self.announce:
            print(
                f"lmckit: {option_string} is now {self.new}; the old spelling goes in the next "
                "release",
                file=sys.stderr,
            )
        super().__call__(parser, namespace, values, option_string)


def add_recipe_argument(p: argparse.ArgumentParser, choices: tuple[str, ...], help: str) -> None:
    """``--recipe`` (a method's ``recipe=``: lmckit's defaults or the paper's procedure as
    written), and its old spelling ``--variant``."""
    p.add_argument("--recipe", choices=choices, help=help, action=OnceOption)
    p.add_argument(
        "--variant", dest="recipe", choices=choices, action=RenamedOption, new="--recipe"
    )
