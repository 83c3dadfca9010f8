"""Write ``src/lmckit/_catalog.py``: what the command line lists (the zoo's models, the
datasets, optimisers, schedules, split kinds, executors, and every matching and merging
method with its one-line summary) as plain data, taken from the registries.

The command line builds its parser from that file, so ``lmckit --help`` imports no torch;
``tests/test_cli.py`` checks the file against the registries, so it cannot go stale.
Run this script after adding a model, dataset or method:

    python scripts/write_catalog.py
"""

from __future__ import annotations

import pprint
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "src" / "lmckit" / "_catalog.py"


def live() -> dict:
    """What the catalog must hold, read from the registries (imports torch)."""
    from lmckit.data.datasets import DATASETS
    from lmckit.data.splits import SPLIT_KINDS
    from lmckit.experiments.executors import EXECUTORS
    from lmckit.match import METHODS as MATCHERS
    from lmckit.match.network import RECIPES
    from lmckit.merge import METHODS as MERGERS
    from lmckit.models import ALIASES, MODELS
    from lmckit.train import OPTIMIZERS, SCHEDULES

    return {
        "MODELS": (*MODELS, *ALIASES),
        "DATASETS": tuple(DATASETS),
        "OPTIMIZERS": tuple(OPTIMIZERS),
        "SCHEDULES": tuple(SCHEDULES),
        "SPLIT_KINDS": tuple(SPLIT_KINDS),
        "EXECUTORS": tuple(EXECUTORS),
        "RECIPES": tuple(RECIPES),
        "MATCHERS": {name: m.summary for name, m in MATCHERS.items()},
        "MERGERS": {name: m.summary for name, m in MERGERS.items()},
    }


def render() -> str:
    """The catalog module's source, from the live registries."""
    values = live()
    lines = [
        '"""What the command line lists, as plain data (written by scripts/write_catalog.py',
        "from the registries; tests/test_cli.py checks it against them). The parser reads",
        '`lmckit --help` from here, so asking for help imports no torch."""',
        "",
    ]
    for name, value in values.items():
        text = pprint.pformat(value, width=92, sort_dicts=False)
        lines.append(f"{name} = {text}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import subprocess
    import sys

    TARGET.write_text(render())
    # formatted as the rest of the code, so `make test`'s format check passes
    subprocess.run([sys.executable, "-m", "ruff", "format", str(TARGET)], check=True)
    print(f"wrote {TARGET}")
