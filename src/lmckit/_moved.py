"""Old import paths kept for one release after a module moved: ``alias(__name__, new)`` in
the old module's file makes the old name *the same module object* as the new one (so
attributes, private helpers and monkeypatching all agree) and warns once that it moved."""

from __future__ import annotations

import importlib
import sys
import warnings

MOVED: dict[str, str] = {
    "lmckit.experiments.analysis": "lmckit.workflows.analysis",
    "lmckit.experiments.interpolation": "lmckit.workflows.interpolation",
    "lmckit.experiments.matching": "lmckit.workflows.matching",
    "lmckit.experiments.merging": "lmckit.workflows.merging",
    "lmckit.experiments.training": "lmckit.workflows.training",
    "lmckit.experiments.estimates": "lmckit.workflows.estimates",
    "lmckit.experiments.store": "lmckit.store",
}
"""Every old module path and where it lives now (tests import each old path)."""


def alias(old: str, new: str) -> None:
    """Make module ``old`` the module ``new``, with a DeprecationWarning naming both."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
