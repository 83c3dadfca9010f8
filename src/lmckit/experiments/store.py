"""Moved to :mod:`lmckit.store` (this path stays for one release)."""

from lmckit._moved import alias

alias(__name__, "lmckit.store")
