"""Moved to :mod:`lmckit.experiments.schema` (this path stays for one release)."""

from lmckit._moved import alias

alias(__name__, "lmckit.experiments.schema")
