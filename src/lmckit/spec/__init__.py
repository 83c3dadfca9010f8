"""Moved to :mod:`lmckit.tracing` (this path, and its modules' paths, stay for one release)."""

from lmckit._moved import alias

alias(__name__, "lmckit.tracing")
