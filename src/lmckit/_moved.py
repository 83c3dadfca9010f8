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
    "lmckit.experiments.spec": "lmckit.experiments.schema",
    "lmckit.spec": "lmckit.tracing",
    "lmckit.spec.trace": "lmckit.tracing.trace",
    "lmckit.spec.kinds": "lmckit.tracing.kinds",
    "lmckit.spec.rules": "lmckit.tracing.rules",
    "lmckit.spec.taps": "lmckit.tracing.taps",
}
"""Every old module path and where it lives now (tests import each old path)."""


def alias(old: str, new: str) -> None:
    """Make module ``old`` the module ``new``, with a DeprecationWarning naming both; for a
    package, its moved submodules too (so that ``import old.sub`` finds ``new.sub`` rather
    than loading its file a second time under the old name)."""
    warnings.warn(
        f"{old} moved to {new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
    for old_sub, new_sub in MOVED.items():
        if old_sub.startswith(old + "."):
            sys.modules[old_sub] = importlib.import_module(new_sub)
