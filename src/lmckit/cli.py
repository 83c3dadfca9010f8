"""The ``lmckit`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lmckit import __version__
from lmckit.errors import LmcError

# Zoo entries shown by `lmckit info`: the papers' configurations.
INFO_MODELS: list[tuple[str, dict]] = [
    ("mlp", {"in_dim": 784, "hidden": [512, 512, 512], "out_dim": 10}),
    ("mlp", {"in_dim": 784, "hidden": [512, 512, 512], "out_dim": 10, "skip": True}),
    ("vgg", {"depth": 11, "width_multiplier": 1, "in_channels": 3}),
    ("vgg", {"depth": 16, "width_multiplier": 1, "in_channels": 3}),
    ("resnet20", {"width_multiplier": 1}),
    ("resnet20", {"width_multiplier": 16}),
]


def _describe(name: str, config: dict) -> str:
    parts = []
    for k, v in config.items():
        if k in ("in_dim", "out_dim", "hidden") and name == "mlp":
            continue
        parts.append(f"{k}={v}")
    if name == "mlp":
        widths = [config["in_dim"], *config["hidden"], config["out_dim"]]
        parts.insert(0, "-".join(str(w) for w in widths))
    return f"{name}({', '.join(parts)})"


def cmd_info(args: argparse.Namespace) -> int:
    from lmckit.models import build_model, permutation_spec

    print(f"lmckit {__version__} — model zoo and permutation symmetries")
    header = (
        f"{'model':<52} {'params':>11} {'groups':>6} {'permuted units':>14} "
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
            f"{_describe(name, config):<52} {n_params:>11,} {len(spec.groups):>6} {units:>14,} "
            f"{spec.log10_num_symmetries():>18.2f}"
        )
        if args.verbose:
            for g, n in spec.groups.items():
                print(f"    {g:<24} {n:>6}  ({len(spec.group_axes(g))} tensor axes)")
    print("(Git Re-Basin Table 1 quotes 10^3498 for the 3×512 MLP: log10((512!)^3) = 3499.62.)")
    return 0


def _progress_bar_factory(desc: str):
    """``seed -> callback`` that drives one tqdm bar per seed (loss/acc in the postfix)."""
    from tqdm.auto import tqdm

    def factory(seed: int):
        bar = None

        def callback(event) -> None:
            nonlocal bar
            if bar is None:
                bar = tqdm(
                    total=event.epochs * event.steps_per_epoch,
                    desc=f"{desc} seed {seed}",
                    unit="step",
                    dynamic_ncols=True,
                    leave=True,
                    mininterval=0.1 if sys.stderr.isatty() else 10.0,
                )
            if event.epoch_done is None:
                bar.update(1)
                if event.step % 10 == 0:
                    bar.set_postfix(
                        epoch=event.epoch + 1,
                        loss=f"{event.loss:.3f}",
                        acc=f"{event.accuracy:.3f}",
                        refresh=False,
                    )
            else:
                done = event.epoch_done
                bar.set_postfix(
                    epoch=done.epoch,
                    loss=f"{done.train_loss:.3f}",
                    test_acc=f"{done.test_accuracy:.3f}",
                )
                if done.epoch == event.epochs:
                    bar.close()

        return callback

    return factory


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from lmckit.experiments.training import load_for_model, model_config_for, train_seeds
    from lmckit.train import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_for_model(args.model, args.dataset, args.data_dir, download=not args.no_download)
    print(
        f"dataset {data.name}: {len(data.train_x)} train / {len(data.test_x)} test, input "
        f"{data.input_shape}, {data.num_classes} classes (from {data.source})"
    )
    model_cfg = model_config_for(
        args.model,
        data,
        width_multiplier=args.width_multiplier,
        hidden=args.hidden,
        norm="default" if args.norm is None else (None if args.norm == "none" else args.norm),
        skip=args.skip,
    )
    overrides = {
        k: v
        for k, v in {
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
        }.items()
        if v is not None
    }
    config = TrainConfig.paper_defaults(args.model, data.name, **overrides)

    def report(outcome) -> None:
        m = outcome.metrics
        state = "exists, skipped" if outcome.skipped else f"trained in {outcome.seconds:.1f}s"
        print(
            f"seed {outcome.seed}: train acc {m.get('train_accuracy', float('nan')):.4f}, "
            f"test acc {m.get('test_accuracy', float('nan')):.4f}, test loss "
            f"{m.get('test_loss', float('nan')):.4f} ({state}) -> {outcome.path}",
            flush=True,
        )

    train_seeds(
        args.model,
        model_cfg,
        data,
        config,
        args.seeds,
        args.out,
        progress=None if args.quiet else _progress_bar_factory(args.model),
        on_seed_done=report,
        device=args.device,
    )
    return 0


def _data_for_checkpoint(ckpt, dataset: str | None, data_dir, no_download: bool):
    from lmckit.experiments.training import load_for_model

    name = dataset or ckpt.meta.get("dataset")
    if not name:
        raise LmcError(f"{ckpt.path} does not record its dataset; pass --dataset")
    return load_for_model(ckpt.meta["model"]["name"], name, data_dir, download=not no_download)


def cmd_match(args: argparse.Namespace) -> int:
    from lmckit.checkpoint import load_checkpoint
    from lmckit.experiments.matching import NEEDS_DATA, match_checkpoints, save_match

    a, b = load_checkpoint(args.a, device=args.device), load_checkpoint(args.b, device=args.device)
    data = None
    if args.method in NEEDS_DATA:
        data = _data_for_checkpoint(a, args.dataset, args.data_dir, args.no_download)
    result = match_checkpoints(
        a,
        b,
        args.method,
        data,
        seed=args.seed,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
    )
    save_match(args.out, result, a=str(a.path), b=str(b.path))
    objective = f"{result.history[-1]:.6g}" if result.history else "n/a"
    print(f"method        {result.method}")
    print(f"objective     {objective}   ({result.iterations} iterations)")
    print(f"L2 distance   {result.distance_before:.4f} -> {result.distance_after:.4f}")
    print(f"time          {result.seconds:.2f} s")
    print(f"permutation   -> {args.out}")
    return 0


def _bar(desc: str, total: int | None = None):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        dynamic_ncols=True,
        leave=False,
        mininterval=0.1 if sys.stderr.isatty() else 10.0,
    )


def cmd_interpolate(args: argparse.Namespace) -> int:
    from lmckit.checkpoint import load_checkpoint
    from lmckit.evaluate import interpolate
    from lmckit.experiments.matching import (
        check_same_architecture,
        load_permutation,
        match_checkpoints,
        save_match,
    )
    from lmckit.perm import Permutation
    from lmckit.plots import plot_barriers, plot_interpolation

    a, b = load_checkpoint(args.a, device=args.device), load_checkpoint(args.b, device=args.device)
    check_same_architecture(a, b)
    data = _data_for_checkpoint(a, args.dataset, args.data_dir, args.no_download)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.perm is not None:
        perms = {"given": load_permutation(args.perm, a.spec)}
    else:
        perms = {}
        for method in args.method:
            if method == "none":
                perms["naive"] = Permutation.identity(a.spec)
                continue
            result = match_checkpoints(a, b, method, data, seed=args.seed)
            save_match(out / f"perm-{method}.json", result, a=str(a.path), b=str(b.path))
            print(
                f"{method}: L2 {result.distance_before:.3f} -> {result.distance_after:.3f} "
                f"in {result.seconds:.2f} s"
            )
            perms[method] = result.perm
    loaders = {"test": data.loader("test", batch_size=1000)}
    if not args.test_only:
        loaders = {"train": data.loader("train", batch_size=1000, shuffle=False), **loaders}
    uses_bn = any(k.endswith("running_mean") for k in a.params)
    bn_loader = data.loader("train", batch_size=500, shuffle=True) if uses_bn else None
    repair_loader = None
    if args.repair:
        if uses_bn:
            raise LmcError("--repair is for networks without BatchNorm (BN nets are BN-reset)")
        repair_loader = data.loader("train", batch_size=1000, shuffle=False)
    curves = {}
    for label, perm in perms.items():
        bar = _bar(f"interpolate {label}", args.lambdas)
        curve = interpolate(
            a.model,
            a.params,
            perm.apply(b.params),
            args.lambdas,
            loaders,
            bn_reset_loader=bn_loader,
            bn_reset_batches=args.bn_batches,
            repair_loader=repair_loader,
            calibrated=args.calibrated,
            ensemble=True,
            progress=lambda done, total, bar=bar: bar.update(1),
        )
        bar.close()
        curves[label] = curve
    png = plot_interpolation(
        curves, out / "interpolation.png", title=f"{a.path.stem} → {b.path.stem}"
    )
    barriers = {
        k: {
            "loss": c.barriers["test"]["loss"]["rebasin"],
            "accuracy": c.barriers["test"]["accuracy"]["rebasin"],
        }
        for k, c in curves.items()
    }
    plot_barriers(barriers, out / "barriers.png")
    print(f"{'curve':<10} {'loss barrier':>13} {'convex':>9} {'acc barrier':>12} {'acc(λ=½)':>9}")
    for label, c in curves.items():
        t = c.barriers["test"]
        print(
            f"{label:<10} {t['loss']['rebasin']:>13.4f} {t['loss']['convex']:>9.4f} "
            f"{100 * t['accuracy']['rebasin']:>11.2f}% "
            f"{100 * c.midpoint('test', 'accuracy'):>8.2f}%"
        )
    print(
        f"curves, barriers and plots -> {out} ({png.name}, barriers.png, interpolation.json/.csv)"
    )
    return 0


def _step_bar(label: str):
    """A callback that advances a progress bar (created on first use) once per call."""
    bar = None

    def callback(*_event) -> None:
        nonlocal bar
        if bar is None:
            bar = _bar(label)
        bar.update(1)

    return callback


def cmd_demo(args: argparse.Namespace) -> int:
    from lmckit.experiments.demo import format_table, run_demo

    summary = run_demo(
        args.out,
        dataset=args.dataset,
        epochs=args.epochs,
        ste_epochs=args.ste_epochs,
        train_progress=None if args.quiet else _progress_bar_factory("mlp"),
        step_progress=None if args.quiet else _step_bar,
    )
    from lmckit.experiments.demo import DemoRow

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


def _parse_range(text: str) -> list[int]:
    """``"2..5"`` -> [2, 3, 4, 5]; ``"4"`` -> [2, 3, 4]."""
    if ".." in text:
        lo, hi = (int(x) for x in text.split(".."))
    else:
        lo, hi = 2, int(text)
    if lo < 2 or hi < lo:
        raise LmcError(f"--sweep-n needs a range like 2..5, got {text!r}")
    return list(range(lo, hi + 1))


def cmd_merge(args: argparse.Namespace) -> int:
    from lmckit.analysis import multi_model_metrics, plane_landscape, sharpness
    from lmckit.checkpoint import load_checkpoint, save_checkpoint
    from lmckit.experiments.merging import bn_loader_for, merge_checkpoints, sweep
    from lmckit.plots import plot_geometry, plot_landscape, plot_sweep

    ckpts = [load_checkpoint(p, device=args.device) for p in args.checkpoints]
    if len(ckpts) < 2:
        raise LmcError("merge needs at least two checkpoints")
    data = _data_for_checkpoint(ckpts[0], args.dataset, args.data_dir, args.no_download)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep_n:
        methods = args.methods or ["star-wm", "merge-many", "ccmm", "ste-mm"]
        results = sweep(
            ckpts,
            methods,
            _parse_range(args.sweep_n),
            data,
            out,
            epochs=args.epochs,
            progress=_step_bar,
        )
        png = plot_sweep(
            results,
            out / "sweep.png",
            title=f"merging {ckpts[0].meta['model']['name']} on {data.name}",
        )
        print(f"{'n':>3} " + " ".join(f"{m:>12}" for m in methods) + "   (merged test acc %)")
        for n in _parse_range(args.sweep_n):
            print(
                f"{n:>3} "
                + " ".join(f"{100 * results[m][n]['merged_accuracy']:>12.2f}" for m in methods)
            )
        print(f"sweep plot -> {png}")
        return 0
    result = merge_checkpoints(
        ckpts,
        args.method,
        data,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=_step_bar(args.method),
    )
    test = data.loader("test", batch_size=1000)
    bn_loader = bn_loader_for(ckpts[0], data)
    merged = result.merged
    if bn_loader is not None and args.method != "ste-mm":
        from lmckit.evaluate import bn_reset

        merged = bn_reset(ckpts[0].model, merged, bn_loader)
    metrics = multi_model_metrics(
        ckpts[0].model,
        [c.params for c in ckpts],
        result.perms,
        test,
        bn_reset_loader=bn_loader,
        merged=merged,
    )
    report = {
        "method": result.method,
        "seconds": result.seconds,
        "checkpoints": [str(c.path) for c in ckpts],
        **metrics.to_dict(),
    }
    if args.sharpness_probes:
        model = ckpts[0].model
        s_merged = sharpness(model, merged, test, probes=args.sharpness_probes)
        base = [sharpness(model, c.params, test, probes=args.sharpness_probes) for c in ckpts]
        report["sharpness_merged"] = {"value": s_merged.value, "stderr": s_merged.stderr}
        report["sharpness_models_mean"] = sum(s.value for s in base) / len(base)
    from lmckit.models import build_model

    model = ckpts[0].model
    merged_model = build_model(ckpts[0].meta["model"]["name"], **ckpts[0].meta["model"])
    merged_model.load_state_dict(merged)
    save_checkpoint(
        out / "merged",
        merged_model,
        {
            "merged_from": [str(c.path) for c in ckpts],
            "merge_method": result.method,
            "dataset": ckpts[0].meta.get("dataset"),
            "metrics": {"test_loss": metrics.merged_loss, "test_accuracy": metrics.merged_accuracy},
        },
    )
    from lmckit._io import atomic_write_json

    atomic_write_json(
        out / "permutations.json",
        {"groups": dict(ckpts[0].spec.groups), "perms": [p.to_dict() for p in result.perms]},
    )
    atomic_write_json(out / "metrics.json", report)
    plot_geometry(
        metrics.distance_ratios,
        metrics.triplet_angles,
        out / "geometry.png",
        title=f"{result.method}: aligned models",
    )
    if args.landscape and len(ckpts) >= 3:
        aligned = [p.apply(c.params) for p, c in zip(result.perms, ckpts, strict=True)][:3]
        land = plane_landscape(
            model, aligned, test, resolution=args.landscape, bn_reset_loader=bn_loader
        )
        plot_landscape(land, out / "landscape.png")
    print(f"method {result.method}: {result.seconds:.1f} s")
    print(
        f"merged test accuracy {100 * metrics.merged_accuracy:.2f} % (models: mean "
        f"{100 * metrics.mean_accuracy:.2f} %), loss {metrics.merged_loss:.4f} "
        f"(gap {metrics.loss_gap:+.4f}, pairwise gap {metrics.pairwise_gap:+.4f})"
    )
    if "sharpness_merged" in report:
        print(
            f"sharpness tr(H⊙θθᵀ): merged {report['sharpness_merged']['value']:.4g} ± "
            f"{report['sharpness_merged']['stderr']:.2g}, models' mean "
            f"{report['sharpness_models_mean']:.4g}"
        )
    print(f"merged checkpoint, permutations.json, metrics.json, plots -> {out}")
    return 0


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate checkpoints on data."""
    p.add_argument("--dataset", help="default: the dataset the checkpoint records")
    p.add_argument("--data-dir", type=Path, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmckit",
        description="Align, merge and analyse neural networks modulo permutation symmetries.",
    )
    parser.add_argument("--version", action="version", version=f"lmckit {__version__}")
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
    p.add_argument("--model", required=True, help="mlp, vgg11, vgg16 or resnet20")
    p.add_argument(
        "--dataset",
        default="fashion-mnist",
        help="fashion-mnist, mnist, cifar10, cifar100, digits or synthetic",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="one model per seed")
    p.add_argument("--out", required=True, type=Path, help="folder for the checkpoints")
    p.add_argument("--epochs", type=int)
    p.add_argument("--width-multiplier", type=float, default=1.0)
    p.add_argument("--hidden", type=int, nargs="+", help="MLP hidden widths (default 3×512·k)")
    p.add_argument(
        "--norm",
        choices=["none", "batch", "layer"],
        default=None,
        help="normalisation layers (default: none for MLP, batch for conv nets)",
    )
    p.add_argument("--skip", action="store_true", help="MLP with residual connections")
    p.add_argument("--optimizer", choices=["adam", "adamw", "sgd"])
    p.add_argument("--lr", type=float)
    p.add_argument("--momentum", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--schedule", choices=["constant", "warmup_linear"])
    p.add_argument("--warmup-epochs", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random crop + flip (default: on for CIFAR)",
    )
    p.add_argument("--data-dir", type=Path, help="where the dataset files are")
    p.add_argument("--no-download", action="store_true", help="never download datasets")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "match",
        help="find the permutation of checkpoint B that aligns it to checkpoint A",
        description="Methods: wm (weight matching, cold LAPs), wm-fast (weight matching with "
        "dual warm starts), am (activation matching), ste (straight-through estimator), "
        "sinkhorn (Sinkhorn re-basin on the weight distance).",
    )
    p.add_argument("a", type=Path, help="reference checkpoint (.safetensors)")
    p.add_argument("b", type=Path, help="checkpoint to permute")
    p.add_argument(
        "--method", choices=["wm", "wm-fast", "am", "ste", "sinkhorn"], default="wm-fast"
    )
    p.add_argument("--out", type=Path, default=Path("perm.json"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1, help="STE epochs")
    p.add_argument("--lr", type=float, help="STE (1e-3) / Sinkhorn (0.1) learning rate")
    p.add_argument("--batch-size", type=int, default=256)
    _add_data_arguments(p)
    p.set_defaults(func=cmd_match)

    p = sub.add_parser(
        "interpolate",
        help="loss/accuracy along the linear path between two checkpoints, naive and matched",
        description="Evaluate θ(λ) = (1−λ)θ_A + λπ(θ_B) on train and test data for each "
        "matching method (or a given permutation file), with barriers, ensemble reference and "
        "plots. BatchNorm statistics are re-estimated at every interior λ.",
    )
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--perm", type=Path, help="use this permutation file instead of --method")
    p.add_argument(
        "--method",
        nargs="+",
        default=["none", "wm-fast"],
        choices=["none", "wm", "wm-fast", "am", "ste", "sinkhorn"],
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lambdas", type=int, default=25)
    p.add_argument("--calibrated", action="store_true", help="temperature-calibrated loss too")
    p.add_argument("--test-only", action="store_true", help="skip the training split")
    p.add_argument("--bn-batches", type=int, default=20, help="batches for BN reset")
    p.add_argument(
        "--repair",
        action="store_true",
        help="REPAIR channel statistics at every interior λ (BN-free nets)",
    )
    p.add_argument("--seed", type=int, default=0)
    _add_data_arguments(p)
    p.set_defaults(func=cmd_interpolate)

    p = sub.add_parser(
        "demo",
        help="train 3 MLPs, match them with every method, plot the interpolation curves",
        description="The README's main job: train three 3×512 MLPs on Fashion-MNIST (digits "
        "when it is not installed), match seed 1 to seed 0 with WM, AM, STE and Sinkhorn, "
        "interpolate naive vs matched and print the table. Finished pieces are cached in --out.",
    )
    p.add_argument("--out", type=Path, default=Path("demo-out"))
    p.add_argument("--dataset", help="override the dataset (default: fashion-mnist or digits)")
    p.add_argument("--epochs", type=int, help="default 5 (Fashion-MNIST) or 40 (digits)")
    p.add_argument("--ste-epochs", type=int, default=1)
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "merge",
        help="merge several checkpoints into one (star, MergeMany, STE-MM, CCMM)",
        description="Merge checkpoints of one architecture; the last is the reference. "
        "Writes the merged checkpoint, permutations, multi-model metrics and plots. With "
        "--sweep-n 2..N, merges the first n checkpoints for every n and method and plots "
        "metric vs n.",
    )
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument(
        "--method",
        default="merge-many",
        choices=["star-wm", "star-ste", "merge-many", "ste-mm", "ccmm"],
    )
    p.add_argument("--sweep-n", help="e.g. 2..5: sweep the number of models")
    p.add_argument(
        "--methods",
        nargs="+",
        choices=["star-wm", "star-ste", "merge-many", "ste-mm", "ccmm"],
        help="methods for --sweep-n (default: star-wm merge-many ccmm ste-mm)",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=10, help="STE / STE-MM epochs (paper: 10)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sharpness-probes",
        type=int,
        default=0,
        help="estimate tr(H⊙θθᵀ) of merged and input models with this many probes",
    )
    p.add_argument(
        "--landscape",
        type=int,
        default=0,
        metavar="RES",
        help="plot loss on the plane through the first three aligned models",
    )
    _add_data_arguments(p)
    p.set_defaults(func=cmd_merge)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LmcError as exc:
        print(f"lmckit: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `lmckit info | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("lmckit: interrupted; finished results are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
