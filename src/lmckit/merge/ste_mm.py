"""STE-MM (Linear Mode Connectivity between Multiple Models, Alg. 1), from the paper.

One model is the reference (the paper's model n). Every other model i gets a proxy θ̂_i,
started at the reference. Every step projects each proxy onto its model's orbit,
``π_i = WM(θ̂_i, θ_i)`` (accelerated: each model keeps its previous permutation and LAP
duals), draws mixture weights λ on the simplex, and takes an Adam step on the loss of
``Σ_{i≠ref} λ_i π_i(θ_i) + λ_ref θ_ref``, with straight-through gradients to the proxies.
After training, a final projection gives the permutations (line 12).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from lmckit.data import Dataset, DataSource, as_batches
from lmckit.errors import ParamsError
from lmckit.functional import check_model_fits, module_mode
from lmckit.lap import LapDuals
from lmckit.match.network import (
    Recipe,
    batch_loss,
    batches_per_pass,
    check_training_options,
    is_paper_recipe,
    optimise,
    parameter_names,
    require_model_and_data,
    straight_through,
)
from lmckit.match.weight_matcher import WeightMatcher
from lmckit.merge.result import MergeResult, check_models, merged_result
from lmckit.options import Count, Positive, checked
from lmckit.params import Params, average_params, detached
from lmckit.perm import Permutation, PermutationSpec
from lmckit.progress import ProgressCallback, notify
from lmckit.resume import (
    check_resume_every,
    load_resume_state,
    optimizer_state,
    prefixed,
    restore_optimizer,
    save_interval,
    save_resume_state,
    tensors_digest,
)

WeightScheme = Literal["dirichlet", "normalized_uniform"]
WEIGHT_SCHEMES: tuple[str, ...] = get_args(WeightScheme)


_SIDE_BY_SIDE = True  # False: one projection after the other (the benchmark's baseline)


@contextlib.contextmanager
def _projecting():
    """One torch thread per projection while they run side by side (as many projections as
    there were threads), the former count after: the products then come out as a
    one-thread run computes them, and the cores are not oversubscribed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def simplex_weights(n: int, generator: torch.Generator, scheme: str = "dirichlet") -> Tensor:
    """``n`` positive weights summing to 1: uniform on the simplex (``"dirichlet"``, the
    distribution of Eq. 5) or independent U(0, 1) draws normalised (Alg. 1, lines 4–5)."""
    if scheme not in WEIGHT_SCHEMES:
        raise ParamsError(f"scheme must be one of {WEIGHT_SCHEMES}, got {scheme!r}")
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if scheme == "dirichlet":
        u = -torch.log1p(-u)  # Exp(1) draws, normalised: Dirichlet(1, …, 1)
    return u / u.sum()


def _fingerprint(params_list, data, per_pass, options) -> dict[str, Any]:
    """What makes an STE-MM run this run (:mod:`lmckit.resume`)."""
    return {
        "method": "ste-mm",
        "options": options,
        "models": [tensors_digest(p) for p in params_list],
        "data": data.fingerprint if isinstance(data, Dataset) else f"{per_pass} batches",
    }


def _duals_into(tensors: dict[str, Tensor], duals, i: int) -> dict[str, Any] | None:
    """Model ``i``'s LAP duals (per group) into ``tensors``; their flags for the info."""
    if duals is None:
        return None
    flags = {}
    for g, d in duals.items():
        tensors[f"duals/{i}/{g}/u"] = torch.from_numpy(d.u)
        tensors[f"duals/{i}/{g}/v"] = torch.from_numpy(d.v)
        if d.assignment is not None:
            tensors[f"duals/{i}/{g}/assignment"] = torch.from_numpy(d.assignment)
        flags[g] = d.exact
    return flags


def _duals_from(tensors: dict[str, Tensor], flags, i: int):
    """The duals :func:`_duals_into` saved for model ``i`` (``None`` if it had none)."""
    if flags is None:
        return None
    return {
        g: LapDuals(
            u=tensors[f"duals/{i}/{g}/u"].numpy(),
            v=tensors[f"duals/{i}/{g}/v"].numpy(),
            exact=exact,
            assignment=(
                tensors[f"duals/{i}/{g}/assignment"].numpy()
                if f"duals/{i}/{g}/assignment" in tensors
                else None
            ),
        )
        for g, exact in flags.items()
    }


def check_option_combination(options: Mapping[str, Any]) -> None:
    """Options that cannot go together (each valid alone), checked before a run starts:
    ``recipe="paper"`` with fixed ``weights`` — Alg. 1 draws its own (lines 4–5).

    Raises:
        ParamsError: naming the two options.
    """
    weights = options.get("weights", "dirichlet")
    if options.get("recipe") == "paper" and not (
        isinstance(weights, str) and weights in WEIGHT_SCHEMES
    ):
        raise ParamsError(
            f'recipe="paper" draws normalised uniform weights (Alg. 1 lines 4-5); fixed '
            f"weights={weights!r} do not apply"
        )


def check_options_for_count(options: Mapping[str, Any], n: int) -> None:
    """Refuse fixed ``weights`` that are not ``n`` numbers, before a merge of ``n`` models
    starts (an experiment's block lists several ``n``; fixed weights fit at most one).

    Raises:
        ParamsError: naming the weights and ``n``.
    """
    _fixed_weights(options.get("weights", "dirichlet"), n)


def _fixed_weights(weights: str | Sequence[float], n: int) -> Tensor | None:
    """``None`` for a drawing scheme, else the given weights checked and normalised."""
    if isinstance(weights, str):
        if weights not in WEIGHT_SCHEMES:
            raise ParamsError(
                f"weights must be one of {WEIGHT_SCHEMES} or {n} numbers, got {weights!r}"
            )
        return None
    try:
        fixed = torch.as_tensor([float(w) for w in weights], dtype=torch.float64)
    except (TypeError, ValueError):
        raise ParamsError(
            f"weights must be a scheme name or {n} numbers, got {weights!r}"
        ) from None
    if (
        fixed.shape != (n,)
        or not torch.isfinite(fixed).all()
        or (fixed < 0).any()
        or fixed.sum() <= 0
    ):
        raise ParamsError(
            f"fixed weights must be {n} finite non-negative numbers with a positive sum, got "
            f"{weights!r}"
        )
    return fixed / fixed.sum()


@checked
def ste_mm(
    spec: PermutationSpec,
    params_list: Sequence[Params],
    *,
    model: nn.Module | None = None,
    data: DataSource | None = None,
    reference: int = -1,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    epochs: Count = 10,
    lr: Positive = 1e-3,
    batch_size: Count = 256,
    weights: WeightScheme | Sequence[float] = "dirichlet",
    warm_duals: bool = True,
    restart_from_identity: bool = False,
    recipe: Recipe = "lmckit",
    resume: str | os.PathLike | None = None,
    resume_every: float | None = None,
) -> MergeResult:
    """Gather ``n`` models into one basin with STE-MM.

    Args:
        spec, params_list: the models (at least two, fitting the spec).
        model: the module the dicts fit (run functionally in train mode; its modes are
            restored).
        data: an lmckit ``Dataset`` (training split, shuffled by ``seed``, in batches of
            ``batch_size``) or re-iterable ``(x, y)`` batches; also used to BN-reset the
            merged model when it has BatchNorm.
        reference: the model the proxies start at (the paper's model n; identity).
        seed: fixes batch order, simplex draws and group orders.
        progress: a :class:`~lmckit.progress.Progress` after every step
            (``metrics["loss"]``, ``metrics["epoch"]``).
        epochs, lr, batch_size: the paper's defaults (10, 1e-3, 256).
        weights: how the mixture weights λ are drawn each step: ``"dirichlet"`` (uniform on
            the simplex, Eq. 5) or ``"normalized_uniform"`` (Alg. 1, lines 4–5) — or ``n``
            fixed non-negative numbers (normalised to sum 1), e.g. for ablations.
        warm_duals: keep each model's LAP duals from one projection to the next and from
            one sweep to the next (STE-MM Alg. 3, the default). Off: every LAP starts cold
            — the same permutations, more LAP work (STE-MM Fig. 2's comparison). Measured
            (``benchmarks/bench_stemm_fig2.py``, 3×512 MLPs, n = 3, one CPU thread): the
            same permutations, an epoch 47.0 s warm vs 70.4 s cold (1.5×).
        restart_from_identity: start every projection's weight matching from the identity
            (STE-MM Alg. 1 as written) instead of the previous step's permutation (the
            default: fewer sweeps). The LAP duals are still carried over when
            ``warm_duals`` (Alg. 3 takes them whatever the starting permutation).
        recipe: ``"lmckit"`` (default) or ``"paper"`` — STE-MM's Alg. 1 with Alg. 3 as
            written: every projection weight matching from the identity with the previous
            step's LAP duals, mixture weights drawn as normalised U(0, 1) draws (lines 4–5).
            It sets ``restart_from_identity=True`` and ``weights="normalized_uniform"``
            (fixed weights are refused). Both recipes step the proxies with Adam: Alg. 1's
            "Update" is unspecified and the paper's code follows Git Re-Basin's repository,
            which uses Adam at the paper's lr 1e-3. The default departs for speed (each
            projection starts at the previous permutation, one confirming sweep when it
            has not moved) and draws λ uniformly on the simplex, the distribution Eq. 5
            states; the reproductions use ``recipe="paper"`` and measure the default beside
            it. Measured (``experiments/stemm-variants-fmnist.toml``: n = 2, 3×512 MLPs
            trained 30 epochs on Fashion-MNIST, three pairs): merged test loss 0.355 ±
            0.006 for both, accuracy 89.1 ± 0.3 % (paper) vs 88.8 ± 0.0 % (default), the
            paper recipe 12–15 min per merge against 2 min — the default is kept for its
            speed, not its result.
        resume: a file (:mod:`lmckit.resume`) where the run's state — proxies, Adam's
            state, permutations, LAP duals, the weights' random generator, history — is
            saved at the end of an epoch once ``resume_every`` seconds (default:
            ``$LMCKIT_RESUME_EVERY``, else 60) have passed since the last save, and within
            an epoch once ten times that has passed (an epoch of many wide models can take
            an hour; their state hundreds of MB). A run given
            a file that exists goes on from where it was saved, to the result a run never
            interrupted gives when ``data`` is a ``Dataset`` or a fixed list of batches (an
            epoch's order depends only on the seed and the epoch); the file must come from
            this run (models, options, data) or :class:`~lmckit.resume.ResumeError` names
            what differs. The caller deletes it once the result is kept.

    ``history`` holds the mean loss per epoch.

    The ``n - 1`` projections of a step are independent: with ``T > 1`` torch threads,
    ``min(n - 1, T)`` of them run side by side, each with one torch thread (the products
    come out as a one-thread run computes them; ``info["projection_threads"]``). Measured
    (``benchmarks/bench_stemm_threads.py``, Alg. 1 on 3-layer MLPs, 2 CPU cores): against
    one projection after the other with both threads, a step of three models 1.4× faster
    at 512 and at 1,024 units, the same merge.
    """
    start = time.perf_counter()
    if is_paper_recipe(recipe):
        check_option_combination({"recipe": recipe, "weights": weights})
        weights, restart_from_identity = "normalized_uniform", True
    model = require_model_and_data("ste_mm", model, data)
    check_resume_every(resume, resume_every, "ste_mm")
    ref = check_models(spec, params_list, reference, seed=seed)
    check_model_fits(model, params_list[ref])
    check_training_options("ste_mm", epochs=epochs, lr=lr, batch_size=batch_size)
    params_list = [detached(p) for p in params_list]
    n = len(params_list)
    fixed_weights = _fixed_weights(weights, n)
    others = [i for i in range(n) if i != ref]
    base = params_list[ref]
    batches = as_batches(data, batch_size=batch_size, seed=seed, passes=epochs)
    per_pass = batches_per_pass(batches)
    learnable = parameter_names(model, base)
    proxies = {
        i: {k: base[k].detach().clone().requires_grad_(True) for k in learnable} for i in others
    }
    optimizer = torch.optim.Adam([t for p in proxies.values() for t in p.values()], lr=lr)
    perms = {i: Permutation.identity(spec) for i in others}
    duals: dict[int, object] = dict.fromkeys(others)
    # the n - 1 projections of a step are independent: on a machine with several torch
    # threads they run side by side, each on one thread (see _projecting)
    workers = min(len(others), torch.get_num_threads()) if _SIDE_BY_SIDE else 1
    # (in parallel, each matcher solves its LAPs itself: the one shared overlap thread
    # would queue them all)
    matchers = {i: WeightMatcher(spec, params_list[i], overlap=workers == 1) for i in others}
    generator = torch.Generator().manual_seed(seed)
    options = {
        "epochs": epochs, "lr": lr, "batch_size": batch_size, "warm_duals": warm_duals,
        "weights": weights if fixed_weights is None else fixed_weights.tolist(),
        "restart_from_identity": restart_from_identity, "seed": seed, "reference": ref,
    }  # fmt: skip
    fingerprint = None if resume is None else _fingerprint(params_list, data, per_pass, options)
    loaded = None if resume is None else load_resume_state(resume, fingerprint)
    first_epoch, history, steps = 0, [], 0
    lap_work = dict.fromkeys(others, 0)  # per model: the projections may run in threads
    skip, epoch_loss, epoch_count = 0, 0.0, 0  # a save made within an epoch: how far it got
    resumed_from = {"epoch": 0, "step_in_epoch": 0, "seconds": 0.0}  # where this process began
    if loaded is not None:
        tensors, info = loaded
        with torch.no_grad():
            for i in others:
                for k, t in proxies[i].items():
                    t.copy_(tensors[f"proxy/{i}/{k}"])
        restore_optimizer(optimizer, tensors, info["optimizer"])
        perms = {i: Permutation(spec, prefixed(tensors, f"perm/{i}/")) for i in others}
        duals = {i: _duals_from(tensors, info["duals"][str(i)], i) for i in others}
        generator.set_state(tensors["rng/weights"])
        first_epoch, history, steps = info["epoch"], info["history"], info["steps"]
        # (files saved at an epoch's end by an lmckit without saves within epochs lack them)
        skip = info.get("step_in_epoch", 0)
        epoch_loss, epoch_count = info.get("loss_sum", 0.0), info.get("count", 0)
        lap_work[others[0]] = info["lap_solves"]  # (only the sum is kept)
        start -= info["seconds"]
        resumed_from = {"epoch": first_epoch, "step_in_epoch": skip, "seconds": info["seconds"]}
        if hasattr(batches, "set_epoch"):  # an lmckit loader: epoch e's order from (seed, e)
            batches.set_epoch(first_epoch)
    if resume is not None:
        resume_every = save_interval(resume_every)
    last_save = time.perf_counter()

    def save(epoch: int, step_in_epoch: int = 0, loss_sum: float = 0.0, count: int = 0) -> None:
        tensors = {f"proxy/{i}/{k}": t for i in others for k, t in proxies[i].items()}
        optimizer_tensors, optimizer_rest = optimizer_state(optimizer)
        tensors.update(optimizer_tensors)
        tensors.update({f"perm/{i}/{g}": p for i in others for g, p in perms[i].items()})
        dual_flags = {}
        for i in others:
            dual_flags[str(i)] = _duals_into(tensors, duals[i], i)
        tensors["rng/weights"] = generator.get_state()
        info = {
            "epoch": epoch, "epochs": epochs, "history": history, "steps": steps,
            "step_in_epoch": step_in_epoch, "steps_per_epoch": per_pass,
            "loss_sum": loss_sum, "count": count,
            "lap_solves": sum(lap_work.values()), "seconds": time.perf_counter() - start,
            "resumed_from": resumed_from, "optimizer": optimizer_rest, "duals": dual_flags,
        }  # fmt: skip
        save_resume_state(resume, tensors, info, fingerprint)

    def project(i: int) -> None:
        current = {**base, **{k: v.detach() for k, v in proxies[i].items()}}
        r = matchers[i].match(
            current,
            init=None if restart_from_identity else perms[i],
            duals=duals[i] if warm_duals else None,
            warm_start=warm_duals,  # cold: no duals kept within the call either
            seed=seed,
            validate=False,
            distances=False,
            objective=False,
        )
        perms[i], duals[i] = r.alignment, r.duals
        lap_work[i] += r.info.get("lap_solves", 0)

    pool = ThreadPoolExecutor(workers, "lmckit-ste-mm") if workers > 1 else None

    def project_all() -> None:
        if pool is None:
            for i in others:
                project(i)
            return
        with _projecting():
            for future in [pool.submit(project, i) for i in others]:
                future.result()

    with module_mode(model, True), pool or contextlib.nullcontext():
        for epoch in range(first_epoch, epochs):
            resumed = epoch == first_epoch
            loss_sum, count = (epoch_loss, epoch_count) if resumed else (0.0, 0)
            done = skip if resumed else 0  # batches of this epoch already trained
            for x, y in itertools.islice(batches, done, None):
                project_all()
                lam = (
                    fixed_weights
                    if fixed_weights is not None
                    else simplex_weights(n, generator, weights)
                )
                with torch.no_grad():
                    members = [
                        base if i == ref else perms[i].apply(params_list[i]) for i in range(n)
                    ]
                    mixture = average_params(members, lam)
                wired = straight_through(mixture, [(proxies[i], float(lam[i])) for i in others])
                value = optimise(optimizer, batch_loss(model, wired, x, y), "ste_mm", steps)
                steps += 1
                loss_sum += value
                count += 1
                done += 1
                notify(progress, steps, per_pass and per_pass * epochs, loss=value, epoch=epoch + 1)
                # within an epoch, saves are rarer: a wide n-model state is hundreds of MB
                if resume is not None and time.perf_counter() - last_save >= 10 * resume_every:
                    save(epoch, done, loss_sum, count)
                    last_save = time.perf_counter()
            if count == 0:
                raise ParamsError("ste_mm got no batches")
            history.append(loss_sum / count)
            if (
                resume is not None
                and epoch + 1 < epochs
                and time.perf_counter() - last_save >= resume_every
            ):
                save(epoch + 1)
                last_save = time.perf_counter()
        project_all()
    all_perms = [Permutation.identity(spec) if i == ref else perms[i] for i in range(n)]
    return merged_result(
        "ste-mm",
        params_list,
        all_perms,
        start,
        model=model,
        data=data,
        seed=seed,
        history=history,
        iterations=steps,
        info={
            "lr": lr,
            "epochs": epochs,
            "weights": weights if fixed_weights is None else fixed_weights.tolist(),
            "reference": ref,
            "warm_duals": warm_duals,
            "restart_from_identity": restart_from_identity,
            "lap_solves": sum(lap_work.values()),
            "recipe": recipe,
            "projection_threads": workers,
        },
    )
