"""The ``lmckit`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
