"""lmckit: align, merge and analyse neural networks modulo permutation symmetries."""

from typing import TYPE_CHECKING

from lmckit.errors import LmcError, ModelConfigError, ParamsError, PermutationError, SpecError

if TYPE_CHECKING:
    from lmckit.perm import Permutation, PermutationSpec

__version__ = "0.1.0"

__all__ = [
    "LmcError",
    "ModelConfigError",
    "ParamsError",
    "Permutation",
    "PermutationError",
    "PermutationSpec",
    "SpecError",
    "__version__",
]


def __getattr__(name: str):
    """``Permutation`` and ``PermutationSpec`` load on first use: importing lmckit (the
    command line's ``--help``) needs no torch."""
    if name in ("Permutation", "PermutationSpec"):
        from lmckit import perm

        return getattr(perm, name)
    raise AttributeError(f"module 'lmckit' has no attribute {name!r}")
