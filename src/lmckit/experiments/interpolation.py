"""Moved to :mod:`lmckit.workflows.interpolation` (this path stays for one release)."""

from lmckit._moved import alias

alias(__name__, "lmckit.workflows.interpolation")
