"""``lmckit train``: one model per seed into a folder of checkpoints (resumable)."""

from __future__ import annotations

import argparse

from lmckit._catalog import DATASETS, MODELS, OPTIMIZERS, SCHEDULES, SPLIT_KINDS
from lmckit.cli import arguments as arg
from lmckit.cli.applicability import Check, excludes, needs, split_setting
from lmckit.cli.progress import ProgressBars, budget
from lmckit.errors import UsageError

COMMAND = "train"
APPLIES: list[tuple[str, Check]] = [
    ("part", needs("split", "the part of which partition")),
    ("fraction", split_setting("fraction", ("class-imbalanced",))),
    ("clients", split_setting("clients", ("dirichlet", "random"))),
    ("alpha", split_setting("alpha", ("dirichlet",))),
    ("split_seed", split_setting("split_seed", ("class-imbalanced", "dirichlet", "random"))),
    ("hidden", excludes("width_multiplier", "the MLP's widths are given or scaled")),
]
NO_REPEATS = ("seeds",)


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

    from lmckit.files import check_output_dir
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
    with arg.as_usage():
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
            budget=budget(args),
        )
    return 0


def add_parser(sub) -> None:
    """The ``lmckit train`` parser."""
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
        type=arg.model_name,
        help="the zoo: " + ", ".join(MODELS) + " (gpt, llama: byte-level language models)",
    )
    p.add_argument(
        "--dataset",
        type=arg.dataset,
        default="fashion-mnist",
        help=", ".join(DATASETS) + " (python-stdlib: this Python's standard-library sources "
        "as bytes, for gpt and llama; --data-dir: another tree)",
    )
    p.add_argument("--seeds", type=arg.seed, nargs="+", default=[0], help="one model per seed")
    p.add_argument("--out", required=True, type=arg.out_path, help="folder for the checkpoints")
    p.add_argument(
        "--epochs", type=arg.int_at_least(1),
        help="passes over the training set (default: the paper's recipe for the model)",
    )  # fmt: skip
    p.add_argument(
        "--width-multiplier", type=arg.positive, help="scales the model's widths (default 1)"
    )
    p.add_argument(
        "--hidden", type=arg.int_at_least(1), nargs="+", help="MLP hidden widths (default 3×512·k)"
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
    p.add_argument("--lr", type=arg.positive, help="peak learning rate (default: the recipe's)")
    p.add_argument("--momentum", type=arg.float_in(0.0, 1.0), help="SGD momentum (default 0.9)")
    p.add_argument(
        "--weight-decay", type=arg.float_in(0.0),
        help="L2 penalty; decoupled for adamw and sophia (default: the recipe's)",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", type=arg.int_at_least(1), help="examples per step (default: the recipe's)"
    )
    p.add_argument(
        "--schedule", choices=list(SCHEDULES),
        help="constant, or warmup_linear: linear warm-up to --lr, then linear decay to 0",
    )  # fmt: skip
    p.add_argument(
        "--warmup-epochs", type=arg.float_in(0.0),
        help="warm-up length for warmup_linear (default 5, or a fifth of a shorter run)",
    )  # fmt: skip
    p.add_argument(
        "--label-smoothing", type=arg.float_in(0.0, 1.0), help="cross-entropy label smoothing (0)"
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
        "--fraction", type=arg.float_in(0.0, 1.0), default=0.2,
        help="class-imbalanced: the share of the other half's classes a part keeps (0.2)",
    )  # fmt: skip
    split.add_argument(
        "--clients", type=arg.int_at_least(1), default=2,
        help="dirichlet, random: the number of parts (2)",
    )  # fmt: skip
    split.add_argument("--alpha", type=arg.positive, default=1.0, help="Dirichlet concentration")
    split.add_argument(
        "--split-seed", type=arg.seed, default=0, help="the partition's seed (0): one cut for all"
    )
    split.add_argument(
        "--init-seed",
        type=arg.seed,
        help="one initialisation for every seed (clients from a shared start)",
    )
    p.add_argument("--data-dir", type=arg.existing_dir, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", type=arg.device, default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--threads", type=arg.int_in(1, 4096), help="torch CPU threads")
    arg.add_max_hours(p)
    p.add_argument(
        "--keep-diverged",
        action="store_true",
        help="save a run whose loss rose far above its start (it fails otherwise, keeping "
        "its last good state as <checkpoint>-last-good)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)
