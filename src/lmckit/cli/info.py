"""``lmckit info``: the model zoo with its group sizes and symmetry counts."""

from __future__ import annotations

import argparse

from lmckit import __version__
from lmckit.cli.applicability import Check

COMMAND = "info"
APPLIES: list[tuple[str, Check]] = []
NO_REPEATS: tuple[str, ...] = ()


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
    (
        "llama",
        {"vocab_size": 256, "context": 128, "dim": 128, "depth": 4, "heads": 4, "kv_heads": 2},
    ),
]


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
        f"{'model':<74} {'params':>11} {'groups':>6} {'permuted units':>14} "
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
            f"{_describe(name, config):<74} {n_params:>11,} {len(spec.groups):>6} {units:>14,} "
            f"{spec.log10_num_symmetries():>18.2f}"
        )
        if args.verbose:
            for g, n in spec.groups.items():
                print(f"    {g:<24} {n:>6}  ({len(spec.group_axes(g))} tensor axes)")
    print("(Git Re-Basin Table 1 quotes 10^3498 for the 3×512 MLP: log10((512!)^3) = 3499.62.)")
    return 0


def add_parser(sub) -> None:
    """The ``lmckit info`` parser."""
    p = sub.add_parser("info", help="list the model zoo with group sizes and symmetry counts")
    p.add_argument("-v", "--verbose", action="store_true", help="also list every group")
    p.set_defaults(func=cmd_info)
