"""Moved to :mod:`lmckit.workflows.analysis` (this path stays for one release)."""

from lmckit._moved import alias

alias(__name__, "lmckit.workflows.analysis")
