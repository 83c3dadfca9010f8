"""Star merging (STE-MM §3's baseline): match every model to one reference independently."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from torch import Tensor, nn

from lmckit.errors import ParamsError
from lmckit.match import ste_matching, weight_matching
from lmckit.merge.result import MergeResult, check_models, merge_with
from lmckit.perm import Params, Permutation, PermutationSpec


def star(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    method: str = "wm",
    reference: int = -1,
    model: nn.Module | None = None,
    loader: Iterable[tuple[Tensor, Tensor]] | None = None,
    epochs: int = 1,
    lr: float = 1e-3,
    batch_size: int = 256,
    seed: int = 0,
) -> MergeResult:
    """Align every model to ``params_list[reference]`` (default: the last) with weight
    matching (``method="wm"``) or the straight-through estimator (``"ste"``, needs
    ``model`` and ``loader``), then average. The reference gets the identity."""
    start = time.perf_counter()
    check_models(spec, params_list)
    if method not in ("wm", "ste"):
        raise ParamsError(f"star method must be 'wm' or 'ste', got {method!r}")
    if method == "ste" and (model is None or loader is None):
        raise ParamsError("star(method='ste') needs model= and loader=")
    n = len(params_list)
    ref = reference % n
    perms = []
    for i, params in enumerate(params_list):
        if i == ref:
            perms.append(Permutation.identity(spec))
        elif method == "wm":
            perms.append(weight_matching(spec, params_list[ref], params, seed=seed).perm)
        else:
            perms.append(
                ste_matching(
                    model,
                    params_list[ref],
                    params,
                    loader,
                    spec=spec,
                    epochs=epochs,
                    lr=lr,
                    batch_size=batch_size,
                    seed=seed,
                ).perm
            )
    return MergeResult(
        tuple(perms),
        merge_with(params_list, perms),
        f"star-{method}",
        time.perf_counter() - start,
        info={"reference": ref},
    )
