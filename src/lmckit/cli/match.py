"""``lmckit match``: the permutation (or transform) of checkpoint B that aligns it to A."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmckit._catalog import MATCHERS, RECIPES
from lmckit.cli import arguments as arg
from lmckit.cli import inputs as cli_inputs
from lmckit.cli.applicability import DATA_OPTIONS, MODEL_CLASS, Check, data_needed, method_options
from lmckit.cli.progress import ProgressBars, budget
from lmckit.errors import UsageError
from lmckit.workflows.inputs import refuse_folders_for_data

COMMAND = "match"
APPLIES: list[tuple[str, Check]] = [*((d, data_needed) for d in DATA_OPTIONS), *MODEL_CLASS]
"""Options that apply only in some cases (the method's own options are read from the
registry: :func:`~lmckit.cli.applicability.method_rules`)."""
NO_REPEATS: tuple[str, ...] = ()
METHOD_FAMILY = "match"


_STARTS = {"wm": "wm", "wm-fast": "wm", "am": "am", "ste": "ste"}  # --symmetries' methods


def _check_aligned(args: argparse.Namespace) -> None:
    """``--aligned``: a folder of its own, not ``--out``, not inside an input folder."""
    from lmckit.files import check_output_dir

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


def cmd_match(args: argparse.Namespace) -> int:
    from lmckit.files import check_output_file, prepare_output_file
    from lmckit.match import METHODS, TRANSFORM_METHODS
    from lmckit.workflows.estimates import check_match
    from lmckit.workflows.inputs import graph_example
    from lmckit.workflows.matching import (
        PERMUTATION_FORMAT,
        TRANSFORM_FORMAT,
        check_same_architecture,
        match_to_files,
    )

    if args.symmetries != "perm" and args.method not in _STARTS:
        raise UsageError(
            f"--symmetries {args.symmetries} works with weight matching (--method wm or "
            f"wm-fast), activation matching (am) or the midpoint loss (ste), not {args.method!r}"
        )
    prepare_output_file(args.out, "--out", create=False)  # created once the work starts
    if args.aligned is not None:
        _check_aligned(args)
    method = args.method
    if args.symmetries != "perm":
        method = f"{_STARTS[args.method]}-{args.symmetries}"
    transform = method in TRANSFORM_METHODS
    if METHODS[method].needs_data:
        refuse_folders_for_data([args.a, args.b])
    a, b = cli_inputs.pair(args)
    check_output_file(
        args.out, "--out", inputs=[*a.files, *b.files],
        file_format=TRANSFORM_FORMAT if transform else PERMUTATION_FORMAT,
    )  # fmt: skip
    check_same_architecture(a, b)
    if args.aligned is not None and not b.folder:
        raise UsageError("--aligned writes a model folder; B is not one")
    if args.aligned is not None:
        from lmckit.model_folder import check_writable

        check_writable(b)  # before the match: its result is written in B's layout
    data = cli_inputs.data(a, args) if METHODS[method].needs_data else None
    check_match(
        a, b, args.method, data, restarts=args.restarts, epochs=args.epochs,
        batch_size=args.batch_size, budget=budget(args),
    )  # fmt: skip
    options = method_options("match", args)
    if transform:
        example, example_kwargs = graph_example(
            a, data, input_shape=args.input_shape, tokens=args.tokens
        )
        options.update(example_inputs=example, example_kwargs=example_kwargs)
    with ProgressBars(not args.quiet) as bars:
        result = match_to_files(
            a, b, method, data, args.out, aligned=args.aligned, log=print, seed=args.seed,
            progress=bars(f"match {method}"), **options,
        )  # fmt: skip
    if transform:
        _print_transform(result, args)
    else:
        objective = f"{result.history[-1]:.6g}" if result.history else "n/a"
        print(f"method        {result.method}")
        print(f"objective     {objective}   ({result.iterations} iterations)")
        print(f"L2 distance   {result.distance_before:.4f} -> {result.distance_after:.4f}")
        print(f"time          {result.seconds:.2f} s")
        print(f"permutation   -> {args.out}")
        if args.aligned is not None:
            print(f"B aligned     -> {args.aligned} (a model folder)")
    return 0


def _print_transform(result, args: argparse.Namespace) -> None:
    spec = result.alignment.spec
    counts = spec.kind_counts()
    stages = result.info["stages"]
    path = " -> ".join(f"{s['distance']:.4f} ({s['method']})" for s in stages)
    print(f"method        {result.method} ({' + '.join(s['method'] for s in stages)})")
    print(f"groups        {', '.join(f'{n} {k}' for k, n in counts.items())}")
    print(f"folded norms  {len(spec.folds)} gains multiplied into their readers")
    print(f"L2 distance   {result.distance_before:.4f} -> {path}, folded weights")
    print(f"time          {result.seconds:.2f} s")
    print(f"transform     -> {args.out}")
    if args.aligned is not None:
        print(f"B aligned     -> {args.aligned} (a model folder, A's norm gains)")


def add_parser(sub) -> None:
    """The ``lmckit match`` parser."""
    p = sub.add_parser(
        "match",
        help="find the permutation of checkpoint B that aligns it to checkpoint A",
        description="Methods: " + arg.methods_help(MATCHERS) + ".",
    )
    p.add_argument("a", type=arg.weights, help="reference checkpoint (.safetensors)")
    p.add_argument("b", type=arg.weights, help="checkpoint to permute")
    p.add_argument(
        "--method", choices=sorted(MATCHERS), default="wm-fast",
        help="the matcher (default wm-fast); each is described above",
    )  # fmt: skip
    p.add_argument("--out", type=arg.out_path, default=Path("perm.json"), help="permutation file")
    p.add_argument("--epochs", type=arg.int_at_least(1), help="STE / Sinkhorn-mid epochs (1)")
    p.add_argument("--lr", type=arg.positive, help="STE (1e-3) / Sinkhorn (0.1) learning rate")
    p.add_argument("--batch-size", type=arg.int_at_least(1), help="STE / Sinkhorn-mid batch (256)")
    arg.add_recipe_argument(
        p, RECIPES,
        help="STE / Sinkhorn: lmckit's defaults (default) or the paper's procedure as "
        "written (STE: Git Re-Basin Alg. 2; Sinkhorn: Peña et al.'s settings)",
    )  # fmt: skip
    p.add_argument(
        "--restarts", type=arg.int_at_least(1), help="weight matching: best of this many starts"
    )
    p.add_argument(
        "--max-memory", type=arg.size, metavar="SIZE",
        help="weight matching: memory it may hold, e.g. 12G (the two models, the cost "
        "matrices, one step's working set; with --symmetries, the folded readers and B's "
        "moved copy, the kinds check in float32 where float64 would not fit); refused up "
        "front if too small",
    )  # fmt: skip
    p.add_argument(
        "--aligned", type=arg.out_path, metavar="FOLDER",
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
    arg.add_data_arguments(p)
    arg.add_model_class_arguments(p)
    p.set_defaults(func=cmd_match)
