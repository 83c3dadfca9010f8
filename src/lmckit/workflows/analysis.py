"""``lmckit analyze``: the measurements of Ito et al. for two checkpoints and each matching
method — L2 distances, spectra, singular-vector alignment R(γ), R to the merged model,
cosine heat maps and the Taylor-predicted barrier — and Git Re-Basin's counterexample."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmckit.analysis.counterexample import (
    counterexample_data,
    counterexample_error,
    counterexample_networks,
    exhaustive_barriers,
)
from lmckit.analysis.distance import l2_distances
from lmckit.analysis.flatness import flatness
from lmckit.analysis.layerwise import gaussian_weak_additivity, layerwise
from lmckit.analysis.random_permutations import random_permutation_merges
from lmckit.analysis.spectral import (
    alignment,
    layer_svds,
    operator_spectra,
    singular_values,
    singular_vector_cosines,
)
from lmckit.analysis.taylor import taylor_barrier
from lmckit.checkpoint import Checkpoint
from lmckit.data import Dataset, TensorLoader
from lmckit.errors import UsageError
from lmckit.files import atomic_write_json, check_outputs, prepare_output_dir, writes_folder
from lmckit.match import METHODS, TRANSFORM_METHODS
from lmckit.params import Params, has_batchnorm, lerp_params
from lmckit.perm import Permutation, PermutationSpec
from lmckit.plots import (
    plot_alignment_bars,
    plot_cosine_heatmaps,
    plot_counterexample,
    plot_flatness,
    plot_layer_distances,
    plot_layerwise,
    plot_moment_histograms,
    plot_spectra,
    plot_taylor,
)
from lmckit.progress import ProgressCallback
from lmckit.store import Store
from lmckit.workflows.matching import (
    check_data_fits,
    check_pair_record,
    check_same_architecture,
    load_permutation,
    stored_matches,
)

__all__ = ["analyze_pair", "layerwise_pair", "run_analyze", "run_counterexample"]

NAIVE = "none"
TAYLOR_LAMBDAS = (0.1, 0.25, 0.5, 0.75, 0.9)


def _key(gamma: float) -> str:
    return f"{gamma:g}"


def analyze_pair(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    perm: Permutation,
    loader: Iterable[tuple[Tensor, Tensor]] | None = None,
    *,
    gammas: Sequence[float] = (0.0, 0.3),
    taylor_lambdas: Sequence[float] | None = TAYLOR_LAMBDAS,
    top_k: int = 32,
) -> dict[str, Any]:
    """Every measurement of one aligned pair ``(θ_A, π(θ_B))`` as JSON-ready data:

    * ``distances``: per tensor and total L2, before and after π (params / buffers);
    * ``R[γ]``: eq. 5 at each γ, total and per layer; ``R_merged[γ]``: R from θ_A and from
      π(θ_B) to the merged model ``½(θ_A + π(θ_B))`` (Fig. 3);
    * ``taylor``: eq. 2's prediction and the actual barrier at ``taylor_lambdas`` on
      ``loader`` (skipped when either is None);
    * ``cosines``: |cos| of the top-``top_k`` singular vectors per layer (nested lists).
    """
    aligned = perm.apply(params_b)
    svd_a, svd_b = layer_svds(params_a), layer_svds(params_b)
    merged = lerp_params(params_a, aligned, 0.5)
    svd_m = layer_svds(merged)
    out: dict[str, Any] = {"distances": l2_distances(params_a, params_b, perm).to_dict()}
    out["R"] = {
        _key(g): alignment(
            spec, params_a, params_b, perm, gamma=g, svds_a=svd_a, svds_b=svd_b
        ).to_dict()
        for g in gammas
    }
    svd_aligned = layer_svds(aligned)
    out["R_merged"] = {
        _key(g): {
            "a": alignment(spec, params_a, merged, gamma=g, svds_a=svd_a, svds_b=svd_m).total,
            "b": alignment(spec, aligned, merged, gamma=g, svds_a=svd_aligned, svds_b=svd_m).total,
        }
        for g in gammas
    }
    cosines = singular_vector_cosines(
        spec, params_a, params_b, perm, k=top_k, svds_a=svd_a, svds_b=svd_b
    )
    out["cosines"] = {k: [left.tolist(), right.tolist()] for k, (left, right) in cosines.items()}
    if loader is not None and taylor_lambdas:
        out["taylor"] = taylor_barrier(
            model, params_a, aligned, loader, lambdas=taylor_lambdas
        ).to_dict()
    return out


FLATNESS_LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def layerwise_pair(
    spec: PermutationSpec,
    model: nn.Module,
    params_a: Params,
    params_b: Params,
    perm: Permutation,
    loader: Iterable[tuple[Tensor, Tensor]],
    *,
    bn_reset_data: Any = None,
    extras: bool = False,
    random_n: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """The width study's measurements of ``(θ_A, π(θ_B))`` at λ = ½ as JSON-ready data:

    * ``layerwise``: :func:`lmckit.analysis.layerwise` of the aligned pair;
    * ``gaussian``: Thm. 5.4's simulated ReLU additivity at each ReLU layer's width
      (``[mean, std]`` over 100 draws), the baseline beside ``weak_additivity``;
    * ``random_permutations``: the merge at λ = ½ scored with temperature calibration (β on
      20 % of ``loader``'s examples, metrics on the rest) without a permutation and with π
      (``given``, when π is not the identity), and with ``extras`` also ``random_n``
      random-permutation merges (Fig. 18–19);
    * with ``extras``: ``flatness`` (θ_A moved a distance ‖θ_A − θ_B‖ at random, Fig. 12–13)
      — pair-level results that an experiment computes once per pair.
    """
    aligned = perm.apply(params_b)
    lw = layerwise(model, params_a, aligned, loader, bn_reset_data=bn_reset_data)
    widths = {name: len(m["a"]) for name, m in lw.moments.items()}
    sims = gaussian_weak_additivity(sorted(set(widths.values())), samples=100, seed=seed)
    out: dict[str, Any] = {
        "layerwise": lw.to_dict(),
        "gaussian": {name: list(sims[w]) for name, w in widths.items()},
    }
    out["random_permutations"] = random_permutation_merges(
        model,
        spec,
        params_a,
        params_b,
        loader,
        n=random_n if extras else 0,
        perm=None if perm.is_identity() else perm,
        seed=seed,
        bn_reset_data=bn_reset_data,
    ).to_dict()
    if extras:
        out["flatness"] = flatness(
            model,
            params_a,
            params_b,
            loader,
            lambdas=FLATNESS_LAMBDAS,
            seed=seed,
            bn_reset_data=bn_reset_data,
        ).to_dict()
    return out


@writes_folder(
    "out",
    replaces=(
        "perm-*.json", "operator-spectra.png", "cosines-*.png", "taylor.png", "layerwise.json",
        "layerwise.png", "moments-*.png", "flatness.png", "random-permutations.png",
    ),
)  # fmt: skip
def run_analyze(
    a: Checkpoint,
    b: Checkpoint,
    data: Dataset | None,
    out: str | Path,
    *,
    methods: Sequence[str] = (NAIVE, "wm-fast"),
    perm_file: str | Path | None = None,
    gammas: Sequence[float] = (0.0, 0.3),
    taylor: bool = True,
    layerwise: bool = False,
    top_k: int = 32,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: Callable[[str], ProgressCallback | None] | None = None,
) -> dict[str, Any]:
    """Match B to A with each of ``methods`` (``"none"``: no permutation) — or use
    ``perm_file`` — and write ``analysis.json`` and the figures into ``out``: ``spectra.png``
    (Fig. 1), ``alignment.png`` (R per γ and method, Fig. 2), ``alignment-merged.png``
    (Fig. 3), ``distances.png`` (per-tensor L2), ``cosines-<method>.png`` (heat maps),
    ``taylor.png`` (eq. 2 vs the actual barrier along λ), and for conv nets
    ``operator-spectra.png`` (convolutions as operators, Sedghi et al.).

    The Taylor barrier is computed on the test split of ``data`` (skipped without data or
    with ``taylor=False``). Permutations are kept in ``out/store`` (see
    :func:`lmckit.workflows.matching.stored_match`).

    With ``layerwise`` (needs data) it also writes ``layerwise.json`` — per method
    :func:`layerwise_pair` on the test split, and once the flatness proxy and the random
    permutation merges — with ``layerwise.png`` (the width study's Fig. 3, 4, 6–8, 11, 14,
    20 per method), ``moments-<method>.png`` (Fig. 5/21), ``flatness.png`` (Fig. 12–13) and
    ``random-permutations.png`` (Fig. 18–19). Permutation files and figures of an earlier
    call into ``out`` that this one does not write (another method's heat map, a Taylor plot
    now skipped) are removed.

    Returns:
        ``{"results": {label: analyze_pair(...)}, "layerwise": {...} (with ``layerwise``),
        "files": [...]}``.
    """
    _check_analysis(a, b, data, methods, perm_file, layerwise)
    out = Path(out)
    names = ["analysis.json", "store", "spectra.png", "alignment.png", "alignment-merged.png"]
    names += ["distances.png", "taylor.png", "layerwise.json", "flatness.png"]
    check_outputs(
        [out / n for n in names], [*a.files, *b.files, *([perm_file] if perm_file else [])]
    )
    perms: dict[str, Permutation] = {}
    if perm_file is not None:
        check_pair_record(perm_file, a, b)
        perms["given"] = load_permutation(perm_file, a.spec)
    out = prepare_output_dir(out, "--out")
    if perm_file is None:
        perms.update(
            stored_matches(
                Store(out / "store"),
                a,
                b,
                methods,
                data,
                out,
                seed=seed,
                naive=NAIVE,
                log=log,
                progress=progress,
            )
        )
    loader = data.loader("test", batch_size=1000) if (data is not None and taylor) else None
    results = {}
    for label, perm in perms.items():
        log(f"analysing {label}")
        results[label] = analyze_pair(
            a.spec, a.model, a.params, b.params, perm, loader, gammas=gammas, top_k=top_k
        )
    summary: dict[str, Any] = {"a": str(a.path), "b": str(b.path), "results": results}
    files = [out / "analysis.json"]
    files += _write_spectra(a, b, data, out, summary)
    atomic_write_json(out / "analysis.json", summary)
    files += _analysis_figures(results, gammas, out)
    summary = {"results": results, "files": files}
    if layerwise:
        summary["layerwise"] = _write_layerwise(a, b, data, perms, out, files, seed, log)
    return summary


def _check_analysis(
    a: Checkpoint,
    b: Checkpoint,
    data: Dataset | None,
    methods: Sequence[str],
    perm_file: str | Path | None,
    layerwise: bool,
) -> None:
    """Refuse, before any work, methods that do not exist, that are not permutations, or
    that need data not given; checkpoints of two architectures; data that does not fit."""
    unknown = [m for m in methods if m != NAIVE and m not in METHODS]
    if unknown:
        raise UsageError(f"unknown matching method(s) {unknown}; choose from {sorted(METHODS)}")
    beyond = [m for m in methods if m in TRANSFORM_METHODS]
    if beyond:
        raise UsageError(
            f"the analyses work on permutations; {beyond} align with maps beyond permutations "
            "(use lmckit interpolate for their paths)"
        )
    check_same_architecture(a, b)
    needs_data = [m for m in methods if m != NAIVE and METHODS[m].needs_data]
    if data is None and (needs_data and perm_file is None):
        raise UsageError(f"method(s) {needs_data} need a dataset")
    if data is not None:
        check_data_fits(a, data)
    if layerwise and data is None:
        raise UsageError("the layerwise analysis needs a dataset (it runs the models on data)")


def _write_spectra(
    a: Checkpoint, b: Checkpoint, data: Dataset | None, out: Path, summary: dict[str, Any]
) -> list[Path]:
    """Both models' singular values (and a conv net's operator spectra) into ``summary``,
    with their figures: the figures' paths."""
    files = []
    spectra_b = singular_values(b.params)
    spectra = {k: [s.tolist(), spectra_b[k].tolist()] for k, s in singular_values(a.params).items()}
    summary["spectra"] = spectra
    files.append(plot_spectra(spectra, out / "spectra.png", labels=[a.path.stem, b.path.stem]))
    if data is not None and any(t.ndim == 4 for t in a.params.values()):
        example = data.test_x[:2].to(next(iter(a.params.values())).device)
        ops, skipped = {}, {}
        for params in (a.params, b.params):
            spectra_op, skipped = operator_spectra(a.model, params, example)
            for k, s in spectra_op.items():
                ops.setdefault(k, []).append(s.tolist())
        summary["operator_spectra"] = {"spectra": ops, "skipped": skipped}
        if ops:
            files.append(
                plot_spectra(
                    ops,
                    out / "operator-spectra.png",
                    labels=[a.path.stem, b.path.stem],
                    title="convolutions as operators (circular padding)",
                )
            )
    return files


def _analysis_figures(
    results: dict[str, dict[str, Any]], gammas: Sequence[float], out: Path
) -> list[Path]:
    """R per γ and method, R to the merged model, per-tensor distances, cosine heat maps
    and the Taylor barrier, drawn from each method's :func:`analyze_pair`."""
    files = []
    bars = {
        f"γ={g}": {lab: r["R"][g]["total"] for lab, r in results.items()} for g in map(_key, gammas)
    }
    files.append(plot_alignment_bars(bars, out / "alignment.png", ylabel="R(θ_A, π(θ_B))"))
    merged = {
        f"{lab} γ={g}": {"θ_A": r["R_merged"][g]["a"], "π(θ_B)": r["R_merged"][g]["b"]}
        for lab, r in results.items()
        for g in map(_key, gammas)
    }
    files.append(plot_alignment_bars(merged, out / "alignment-merged.png", ylabel="R(·, merged)"))
    dist = {
        "before": {
            k: v[0] for k, v in next(iter(results.values()))["distances"]["per_tensor"].items()
        }
    }
    for lab, r in results.items():
        if lab != "naive":
            dist[lab] = {k: v[1] for k, v in r["distances"]["per_tensor"].items()}
    files.append(plot_layer_distances(dist, out / "distances.png"))
    for lab, r in results.items():
        files.append(
            plot_cosine_heatmaps(
                r["cosines"],
                out / f"cosines-{lab}.png",
                title=f"|cos| of top singular vectors, {lab}",
            )
        )
    taylors = {lab: r["taylor"] for lab, r in results.items() if "taylor" in r}
    if taylors:
        files.append(plot_taylor(taylors, out / "taylor.png"))
    return files


def _write_layerwise(a, b, data, perms, out: Path, files: list, seed: int, log) -> dict:
    loader = data.loader("test", batch_size=1000)
    bn_data = (
        data.loader("train", batch_size=500, shuffle=True) if has_batchnorm(a.params) else None
    )
    per_method: dict[str, Any] = {}
    # The pair-level results use the first permutation that is not the identity as "given".
    given = next((lab for lab, p in perms.items() if not p.is_identity()), None)
    for label, perm in perms.items():
        log(f"layerwise diagnostics: {label}")
        per_method[label] = layerwise_pair(
            a.spec,
            a.model,
            a.params,
            b.params,
            perm,
            loader,
            bn_reset_data=bn_data,
            extras=label == (given or label),
            seed=seed,
        )
    pair = per_method[given or next(iter(perms))]
    summary = {
        "methods": {
            lab: {"layerwise": r["layerwise"], "gaussian": r["gaussian"]}
            for lab, r in per_method.items()
        },
        "given": given,
        "flatness": pair["flatness"],
        "random_permutations": pair["random_permutations"],
    }
    atomic_write_json(out / "layerwise.json", summary)
    files.append(out / "layerwise.json")
    files.append(
        plot_layerwise(
            {lab: r["layerwise"] for lab, r in per_method.items()}, out / "layerwise.png"
        )
    )
    for lab, r in per_method.items():
        lw = r["layerwise"]
        files.append(
            plot_moment_histograms(
                lw["moments"],
                out / f"moments-{lab}.png",
                small=lw["small"],
                title=f"√E[z̃²] of ReLU inputs, A and {lab}-aligned B",
            )
        )
    files.append(plot_flatness(pair["flatness"], out / "flatness.png"))
    merges = pair["random_permutations"]["merges"]
    files.append(
        plot_alignment_bars(
            {
                "accuracy barrier (points)": {
                    k: 100 * v["accuracy_barrier"] for k, v in merges.items()
                },
                "calibrated loss barrier ×10": {
                    k: 10 * v["calibrated_loss_barrier"] for k, v in merges.items()
                },
                "temperature": {k: v["temperature"] for k, v in merges.items()},
            },
            out / "random-permutations.png",
            ylabel="value",
            title="merges at λ=½: no, found and random permutations",
        )
    )
    return summary


@writes_folder("out")
def run_counterexample(
    out: str | Path, *, n: int = 4000, seed: int = 0, lambdas: int = 21, resolution: int = 101
) -> dict[str, Any]:
    """Git Re-Basin's counterexample: the exhaustive search over the four permutations of
    the hand-set networks on ``n`` points, written to ``out/counterexample.json`` and drawn
    as Fig. 6 with the data of Fig. 7 (``out/counterexample.png``)."""
    out = prepare_output_dir(Path(out), "--out")
    model, a, b, spec = counterexample_networks()
    x, y = counterexample_data(n, seed)
    result = exhaustive_barriers(
        model,
        a,
        b,
        TensorLoader(x, y, batch_size=1000),
        spec,
        metric=counterexample_error,
        lambdas=lambdas,
    )
    axis = torch.linspace(-1, 1, resolution)
    grid = torch.stack(torch.meshgrid(axis, axis, indexing="xy"), -1).reshape(-1, 2)
    shown = [0.0, 0.25, 0.5, 0.75, 1.0]
    predictions = []
    with torch.no_grad():
        for perm in result.permutations:
            aligned = perm.apply(b)
            row = []
            for lam in shown:
                f = torch.func.functional_call(model, lerp_params(a, aligned, lam), (grid,))
                row.append((f.reshape(resolution, resolution) >= 0).float().numpy())
            predictions.append(row)
    summary = {
        **result.to_dict(),
        "n": n,
        "seed": seed,
        "train_error": {"a": result.values[0][0], "b": result.values[0][-1]},
    }
    atomic_write_json(out / "counterexample.json", summary)
    png = plot_counterexample(
        result,
        predictions,
        out / "counterexample.png",
        data=(x[:1500].numpy(), y[:1500].numpy()),
        columns=shown,
    )
    return {"result": result, "files": [out / "counterexample.json", png]}
