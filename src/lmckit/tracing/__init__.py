"""Permutation specs derived from a model's code: :func:`trace` exports the model with
``torch.export``, relates the axes of every op and verifies the result; :class:`GraphTaps`
reads each group's activations off the same graph (for activation matching);
:func:`symmetry_kinds` finds which groups also admit orthogonal maps."""

from lmckit.tracing.kinds import (
    SymmetryReport,
    kinds_check_bytes,
    kinds_check_precision,
    symmetry_kinds,
)
from lmckit.tracing.taps import GraphTaps
from lmckit.tracing.trace import TraceReport, trace, trace_report

__all__ = [
    "GraphTaps",
    "SymmetryReport",
    "TraceReport",
    "kinds_check_bytes",
    "kinds_check_precision",
    "symmetry_kinds",
    "trace",
    "trace_report",
]
