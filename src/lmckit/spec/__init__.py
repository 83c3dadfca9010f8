"""Permutation specs derived from a model's code: :func:`trace` exports the model with
``torch.export``, relates the axes of every op and verifies the result."""

from lmckit.spec.trace import TraceReport, trace, trace_report

__all__ = ["TraceReport", "trace", "trace_report"]
