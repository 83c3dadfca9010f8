"""lmckit: align, merge and analyse neural networks modulo permutation symmetries."""

from lmckit.errors import LmcError, ModelConfigError, ParamsError, PermutationError, SpecError
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
