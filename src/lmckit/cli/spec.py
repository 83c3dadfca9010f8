"""``lmckit spec``: trace a model's symmetries and print the coverage report."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmckit.cli import arguments as arg
from lmckit.cli import inputs as cli_inputs
from lmckit.cli.applicability import Check
from lmckit.errors import UsageError
from lmckit.workflows.inputs import load_inputs, model_from_class_path, source_files


def _not_for_folders(a: argparse.Namespace) -> str | None:
    from lmckit.model_folder import is_model_folder

    if is_model_folder(a.target):
        return "a model folder's example input comes from its config"
    return None


COMMAND = "spec"
APPLIES: list[tuple[str, Check]] = [
    ("model_args", lambda a: None if ":" in a.target else "the target is a checkpoint"),
    *((d, _not_for_folders) for d in ("input_shape", "tokens", "batch", "strict")),
]
NO_REPEATS: tuple[str, ...] = ()


SPEC_FORMAT = "lmckit-trace-report"


def cmd_spec(args: argparse.Namespace) -> int:
    from lmckit.files import atomic_write_json, check_output_file, prepare_output_file, special_kind
    from lmckit.tracing import trace_report

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
            cli_inputs.shape_from_sidecar(path, args)
        if args.input_shape is None:
            raise UsageError("spec needs --input-shape (one example's shape) for this target")
        if checkpoint:
            ckpt = load_inputs([path])[0]  # an lmckit checkpoint, on the CPU
            model, inputs = ckpt.model, list(ckpt.files)
        else:
            model = model_from_class_path(args.target, args.model_args)
            inputs = source_files(model)
        if args.out is not None:
            check_output_file(args.out, "--out", inputs=inputs, file_format=SPEC_FORMAT)
        report = trace_report(model, cli_inputs.example(args), strict=args.strict)
    if args.out is not None:
        check_output_file(args.out, "--out", inputs=inputs, file_format=SPEC_FORMAT)
    print(report)
    if args.out is not None:
        atomic_write_json(args.out, {"format": SPEC_FORMAT, **report.to_dict()})
        print(f"spec and report -> {args.out}")
    return 0


def add_parser(sub) -> None:
    """The ``lmckit spec`` parser."""
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
        "--input-shape", type=arg.int_at_least(1), nargs="+", metavar="N",
        help="one example's shape without the batch axis, e.g. 1 28 28 (tokens: the length); "
        "a model folder's comes from its config, an lmckit checkpoint's from the dataset its "
        "sidecar records",
    )  # fmt: skip
    p.add_argument("--batch", type=arg.int_at_least(1), default=4, help="examples in the trace")
    p.add_argument(
        "--tokens", type=arg.int_at_least(1), metavar="VOCAB",
        help="integer token inputs drawn from [0, VOCAB) instead of Gaussian floats",
    )  # fmt: skip
    p.add_argument("--model-args", metavar="JSON", help="keyword arguments for CLASS")
    p.add_argument("--strict", action="store_true", help="fail on an operator without a rule")
    p.add_argument("--out", type=arg.out_path, help="write the spec and report as JSON")
    p.set_defaults(func=cmd_spec)
