"""``lmckit merge``: several checkpoints (or model folders) merged into one."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmckit._catalog import MERGERS, RECIPES
from lmckit.cli import arguments as arg
from lmckit.cli import inputs as cli_inputs
from lmckit.cli.applicability import MODEL_CLASS, Check, excludes, method_options, needs
from lmckit.cli.progress import ProgressBars, budget
from lmckit.errors import UsageError

COMMAND = "merge"
APPLIES: list[tuple[str, Check]] = [
    ("methods", needs("sweep_n", "use --method for a single merge")),
    ("method", excludes("sweep_n", "a sweep takes --methods")),
    ("sharpness_probes", excludes("sweep_n", "sharpness is measured for a single merge")),
    ("landscape", excludes("sweep_n", "the landscape is drawn for a single merge")),
    *MODEL_CLASS,
]
"""Options that apply only in some cases (the methods' own options are read from the
registry: :func:`~lmckit.cli.applicability.method_rules`)."""
NO_REPEATS = ("methods",)
METHOD_FAMILY = "merge"


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
    from lmckit.files import check_output_dir
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
    ckpts = cli_inputs.checkpoints(args.checkpoints, args)
    check_checkpoints(ckpts)
    if ckpts[0].folder:
        return _merge_folders(ckpts, args)
    data = cli_inputs.data(ckpts[0], args)
    from lmckit.workflows.estimates import check_merge

    check_merge(
        ckpts, args.method, data, landscape=args.landscape,
        sharpness_probes=args.sharpness_probes, epochs=args.epochs, budget=budget(args),
    )  # fmt: skip
    options = method_options("merge", args)  # the options the registry's methods take
    with ProgressBars(not args.quiet) as bars:
        if args.sweep_n:
            from lmckit.workflows.merging import SWEEP_METHODS

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
            f"sharpness tr(H⊙θθᵀ): merged {report['sharpness_merged']:.4g} ± "
            f"{report['sharpness_merged_stderr']:.2g}, models' mean "
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
    options = method_options("merge", args)  # the options the registry's methods take
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


def add_parser(sub) -> None:
    """The ``lmckit merge`` parser."""
    p = sub.add_parser(
        "merge",
        help="merge several checkpoints into one (star, MergeMany, STE-MM, CCMM)",
        description="Merge checkpoints of one architecture; the last is the reference. "
        "Writes the merged checkpoint, permutations, multi-model metrics and plots. With "
        "--sweep-n 2..N, merges the first n checkpoints for every n and method and plots "
        "metric vs n. Methods: " + arg.methods_help(MERGERS) + ".",
    )
    p.add_argument(
        "checkpoints", nargs="+", type=arg.weights,
        help="checkpoints (.safetensors) or model folders of one architecture; the last is "
        "the reference",
    )  # fmt: skip
    p.add_argument(
        "--method", default="merge-many", choices=sorted(MERGERS),
        help="the merger (default merge-many); each is described above",
    )  # fmt: skip
    p.add_argument("--sweep-n", type=arg.count_range, help="e.g. 2..5: sweep the number of models")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=sorted(MERGERS),
        help="methods for --sweep-n (default: star-wm merge-many ccmm ste-mm)",
    )
    p.add_argument("--out", type=arg.out_path, required=True, help="folder for the results")
    p.add_argument(
        "--epochs", type=arg.int_at_least(1), help="STE-MM (paper: 10) / star-STE (1) epochs"
    )
    p.add_argument("--lr", type=arg.positive, help="STE / STE-MM learning rate (1e-3)")
    p.add_argument("--batch-size", type=arg.int_at_least(1), help="STE / STE-MM batch (256)")
    arg.add_recipe_argument(
        p, RECIPES,
        help="STE-MM / star-STE: lmckit's defaults (default) or the paper's procedure as "
        "written (STE-MM Alg. 1; STE: Git Re-Basin Alg. 2)",
    )  # fmt: skip
    p.add_argument(
        "--sharpness-probes",
        type=arg.int_at_least(2, zero_means_off=True),
        default=0,
        help="estimate tr(H⊙θθᵀ) of merged and input models with this many probes",
    )
    p.add_argument(
        "--landscape",
        type=arg.int_at_least(2),
        default=0,
        metavar="RES",
        help="plot loss on the plane through the first three aligned models (RES ≥ 2 points "
        "a side; no landscape without it)",
    )
    arg.add_data_arguments(p)
    arg.add_model_class_arguments(p)
    p.set_defaults(func=cmd_merge)
