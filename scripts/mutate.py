"""Does the suite catch a wrong algorithm? Apply plausible single bugs one at a time and
run the tests that should notice.

Each mutation replaces one exact snippet of lmckit's source (the snippet must occur exactly
once, so a refactor that moves it makes the script fail loudly rather than test nothing)
in a scratch copy of the repository, then runs the listed test files there. A mutation is
*caught* when those tests fail. Not part of CI: it takes several minutes.

    python scripts/mutate.py               # all mutations, relevant test files
    python scripts/mutate.py --full        # the whole suite for every mutation (slow)
    python scripts/mutate.py --only lerp-wrong-way ste-ignores-proxy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    why: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


M = Mutation
MUTATIONS = [
    # -- orthogonal symmetries of transformers (issue 29) --
    M(
        "fold-forgets-gain",
        "folding sets a norm's gain to ones without multiplying it into the readers",
        "src/lmckit/transform.py",
        "            out[name] = put_group_rows(spec, name, axis, group, t, rows * g.to(t.dtype)"
        "[:, None])\n",
        "            out[name] = put_group_rows(spec, name, axis, group, t, rows)\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "fold-forgets-bias",
        "folding leaves a LayerNorm's bias undivided by its gain",
        "src/lmckit/transform.py",
        "            out[bias] = params[bias] / g.to(params[bias].dtype)\n",
        "            out[bias] = params[bias]\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "rotation-on-one-side-only",
        "an orthogonal map applied to the layers that write a group, not to those that read it",
        "src/lmckit/transform.py",
        "            if m.ndim == 2:\n                t = _move_rows(",
        "            if m.ndim == 2 and axis == 0:\n                t = _move_rows(",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "kinds-accepted-unchecked",
        "a group is declared orthogonal without the numerical check (an activation, rotary "
        "embeddings or gating would be rotated through)",
        "src/lmckit/spec/kinds.py",
        "            if _close(reference, _run(twin, moved, args64, kwargs64, False, select), "
        "rtol):\n",
        "            if True:\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "layer-norm-stream-any-rotation",
        "a LayerNorm's stream rotated by any orthogonal map, not one fixing the ones vector",
        "src/lmckit/match/orthogonal.py",
        '    if kind == "orthogonal":\n        return procrustes(gains)\n',
        '    if kind != "permutation":\n        return procrustes(gains)\n',
        ("tests/match/test_orthogonal.py",),
    ),
    M(
        "procrustes-transposed",
        "Procrustes returns V Uᵀ instead of U Vᵀ",
        "src/lmckit/match/orthogonal.py",
        "    return u @ vh\n",
        "    return (u @ vh).T\n",
        ("tests/match/test_orthogonal.py",),
    ),
    M(
        "orthogonal-gains-not-undone",
        "the gain matrix of a rotated group keeps the group's own current map",
        "src/lmckit/match/orthogonal.py",
        "    return gram @ m.to(torch.float64)\n",
        "    return gram\n",
        ("tests/match/test_orthogonal.py",),
    ),
    M(
        "dual-side-moved-like-writers",
        "an invertible map applied by M to the layers that read its group too (Q on one "
        "side only: M⁻ᵀ forgotten)",
        "src/lmckit/transform.py",
        "    if dual is m or not any(flags):\n",
        "    if True:\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "keys-not-dual",
        "both writers of a query/key group (queries and keys) move by M⁻ᵀ",
        "src/lmckit/spec/kinds.py",
        "        return frozenset(sites[1])\n",
        "        return frozenset(sites[0] | sites[1])\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "scaling-accepts-negative-scales",
        "a scaling map with a negative scale passes the check (relu(−z) ≠ −relu(z))",
        "src/lmckit/transform.py",
        "        if not one_per_line or bool((m64 < 0).any()):\n",
        "        if not one_per_line:\n",
        ("tests/spec/test_kinds.py",),
    ),
    M(
        "least-squares-dual-as-primal",
        "least squares on a dual site solved as if it were primal",
        "src/lmckit/match/activation_transform.py",
        "    return ab @ _pinv(bb) if primal else _pinv(aa) @ ab\n",
        "    return ab @ _pinv(bb)\n",
        ("tests/match/test_activation_transform.py",),
    ),
    M(
        "sites-assumed-primal",
        "every activation site taken to move by M (keys too), without the probe",
        "src/lmckit/match/activation_transform.py",
        "        sides[site] = True if errors[0] < tol else False if errors[1] < tol else None\n",
        "        sides[site] = True\n",
        ("tests/match/test_activation_transform.py",),
    ),
    M(
        "refinement-reassigns-heads",
        "the least-squares refinement solves the head LAP again instead of keeping weight "
        "matching's heads",
        "src/lmckit/match/activation_transform.py",
        "    if refine:\n        outer = torch.arange(heads)\n",
        "    if False:\n        outer = torch.arange(heads)\n",
        ("tests/match/test_activation_transform.py",),
    ),
    # -- language models trained here (issue 28, item 5) --
    M(
        "gpt-not-causal",
        "the GPT's attention sees the future (no causal mask)",
        "src/lmckit/models/transformer.py",
        "        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)\n",
        "        y = F.scaled_dot_product_attention(q, k, v)\n",
        ("tests/models/test_gpt.py",),
    ),
    M(
        "tokens-scored-as-last-position",
        "a language model's outputs scored at the last position only, not per token",
        "src/lmckit/functional.py",
        "        return out.reshape(-1, out.shape[-1]), y.reshape(-1)\n",
        "        return out[:, -1], y[:, -1]\n",
        ("tests/models/test_gpt.py",),
    ),
    M(
        "corpus-targets-not-shifted",
        "the code corpus's targets are the inputs themselves, not the next byte",
        "src/lmckit/data/text.py",
        "    y = data[1 : count * context + 1].view(count, context).clone()\n",
        "    y = data[: count * context].view(count, context).clone()\n",
        ("tests/data/test_text.py",),
    ),
    M(
        "corpus-split-by-basename",
        "the split hashes a file's name, not its path (every pkg*/helpers.py lands alike)",
        "src/lmckit/data/text.py",
        '        parts["test" if is_test_file(path.relative_to(base).as_posix()) else "train"]',
        '        parts["test" if is_test_file(path.name) else "train"]',
        ("tests/data/test_text.py",),
    ),
    M(
        "corpus-keeps-test-suites",
        "the standard library's own test suites are read into the corpus",
        "src/lmckit/data/text.py",
        "        if EXCLUDED_FOLDERS.isdisjoint(rel.parts[:-1]) and path.is_file():\n",
        "        if path.is_file():\n",
        ("tests/data/test_text.py",),
    ),
    M(
        "perplexity-not-exponentiated",
        "the records' perplexity is the log-perplexity (the loss itself)",
        "src/lmckit/evaluate/interpolation.py",
        '            out[f"{name}.midpoint"] = math.exp(self.midpoint(split, loss))\n',
        '            out[f"{name}.midpoint"] = self.midpoint(split, loss)\n',
        ("tests/experiments/test_language_models.py",),
    ),
    M(
        "taylor-fused-attention",
        "the Taylor barrier differentiates twice through fused attention (no 2nd derivative)",
        "src/lmckit/analysis/taylor.py",
        "    with module_mode(model, False), twice_differentiable():\n",
        "    with module_mode(model, False):\n",
        ("tests/models/test_gpt.py",),
    ),
    M(
        "lock-left-in-users-folder",
        "a command refused in a user's folder leaves its lock (the next run adopts their files)",
        "src/lmckit/_io.py",
        "            (path / LOCK).unlink(missing_ok=True)\n",
        "            pass\n",
        ("tests/test_io.py",),
    ),
    # -- model folders and memory budgets (issue 28) --
    M(
        "folder-written-unpermuted",
        "write_model_folder writes B's tensors without the permutation",
        "src/lmckit/model_folder.py",
        "    if perm is not None and name in spec.axes:\n",
        "    if False:\n",
        ("tests/test_model_folder.py",),
    ),
    M(
        "folder-index-unchecked",
        "a shard index that puts a tensor in the wrong shard is accepted",
        "src/lmckit/model_folder.py",
        "            if name not in tensors or tensors[name].shard != shard:\n",
        "            if name not in tensors:\n",
        ("tests/test_model_folder.py",),
    ),
    M(
        "folder-mismatched-shapes-accepted",
        "tensors whose shapes do not fit the model are re-initialised silently",
        "src/lmckit/model_folder.py",
        '            ("mismatched_keys", "tensors whose shapes do not fit the model"),\n',
        "",
        ("tests/test_model_folder.py",),
    ),
    M(
        "wm-max-memory-ignored",
        "weight matching runs whatever max_memory says",
        "src/lmckit/match/weight.py",
        "    if max_memory is None or need.total <= max_memory:\n",
        "    if True:\n",
        ("tests/test_model_folder.py",),
    ),
    M(
        "block-view-columns-swapped",
        "an update gathers a block view's columns with block and offset swapped",
        "src/lmckit/match/weight_matcher.py",
        '        return t[:, torch.div(index, width, rounding_mode="floor"), index % width]\n',
        '        return t[:, index % width, torch.div(index, width, rounding_mode="floor")]\n',
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "no-upsampling-rule",
        "upsampling has no rule (a U-Net's up path freezes)",
        "src/lmckit/spec/rules.py",
        '            "upsample_nearest2d",\n',
        "",
        ("tests/spec/test_trace_transformers.py",),
    ),
    M(
        "memory-need-forgets-kept-costs",
        "the memory estimate leaves out the cost matrices kept between sweeps",
        "src/lmckit/match/weight_matcher.py",
        "        kept = sum(n * n * itemsize for n in sizes)\n",
        "        kept = 0\n",
        ("tests/test_model_folder.py",),
    ),
    # -- the bugs a reviewer found unnoticed (issue "Tests that catch a wrong algorithm") --
    M(
        "lap-ignores-duals",
        "solve_lap always starts from reduction duals (a warm start is silently cold)",
        "src/lmckit/lap.py",
        "    if cold:\n        c_min = sign * c\n",
        "    if True:\n        c_min = sign * c\n",
        ("tests/test_lap.py",),
    ),
    M(
        "wm-never-stores-duals",
        "WeightMatcher never keeps the duals of its solves",
        "src/lmckit/match/weight_matcher.py",
        "                    if warm_start:\n                        lap_duals[g] = new_duals\n",
        "",
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "ste-ignores-proxy",
        "STE projects A instead of the trained proxy: it silently becomes weight matching",
        "src/lmckit/match/ste.py",
        "current = {**params_a, **{k: v.detach() for k, v in proxy.items()}}",
        "current = dict(params_a)",
        ("tests/match/test_ste.py",),
    ),
    M(
        "ste-mm-ignores-weights",
        "STE-MM averages its members uniformly whatever λ was drawn",
        "src/lmckit/merge/ste_mm.py",
        "mixture = average_params(members, lam)",
        "mixture = average_params(members)",
        ("tests/merge/test_ste_mm.py",),
    ),
    M(
        "ste-mm-skips-final-projection",
        "STE-MM returns the projections made before its last step (Alg. 1 line 12 skipped)",
        "src/lmckit/merge/ste_mm.py",
        "            history.append(loss_sum / count)\n"
        "        for i in others:\n            project(i)\n",
        "            history.append(loss_sum / count)\n",
        ("tests/merge/test_ste_mm.py",),
    ),
    M(
        "ste-mm-never-steps",
        "STE-MM evaluates the loss but never takes an optimiser step (it becomes star-WM)",
        "src/lmckit/merge/ste_mm.py",
        "value = optimise(optimizer, batch_loss(model, wired, x, y))",
        "value = batch_loss(model, wired, x, y).item()",
        ("tests/merge/test_ste_mm.py",),
    ),
    M(
        "ccmm-vertex-minimises",
        "CCMM's Frank–Wolfe vertex minimises the linearised objective",
        "src/lmckit/merge/ccmm.py",
        "            best = assign_groups(grad, spec.heads)",
        "            best = assign_groups({g: -m for g, m in grad.items()}, spec.heads)",
        ("tests/merge/test_ccmm.py",),
    ),
    M(
        "repair-fitted-at-half",
        "interpolation applies REPAIR fitted at λ = ½ at every λ",
        "src/lmckit/evaluate/interpolation.py",
        "params = repair(model, params_a, params_b, lam, repair_data, endpoints=endpoints)",
        "params = repair(model, params_a, params_b, 0.5, repair_data, endpoints=endpoints)",
        ("tests/evaluate/test_interpolation.py",),
    ),
    M(
        "bn-reset-keeps-ema",
        "BN reset keeps BatchNorm's exponential running averages instead of exact statistics",
        "src/lmckit/evaluate/bn.py",
        '        new[f"{name}.running_mean"] = mean.to(new[f"{name}.running_mean"])\n'
        '        new[f"{name}.running_var"] = var.to(new[f"{name}.running_var"])\n',
        "",
        ("tests/evaluate/test_bn.py", "tests/merge/test_result.py"),
    ),
    M(
        "lerp-wrong-way",
        "lerp_params goes from B towards A for λ ≤ ½",
        "src/lmckit/params.py",
        "            out[k] = a + lam * (b - a)",
        "            out[k] = b + lam * (a - b)",
        ("tests/test_params.py", "tests/evaluate/test_interpolation.py"),
    ),
    M(
        "temperature-fitted-on-eval",
        "the temperature is fitted on the evaluation examples instead of the held-out part",
        "src/lmckit/evaluate/calibration.py",
        "beta = fit_temperature(logits[held], labels[held])",
        "beta = fit_temperature(logits[rest], labels[rest])",
        ("tests/evaluate/test_calibration.py",),
    ),
    M(
        "am-correlation-uncentred",
        "activation matching's correlation forgets to subtract the means",
        "src/lmckit/match/activation.py",
        "cov = cross - mean_a[:, None] * mean_b[None, :]",
        "cov = cross",
        ("tests/match/test_activation.py",),
    ),
    M(
        "sinkhorn-no-column-normalisation",
        "Sinkhorn normalises rows only",
        "src/lmckit/match/sinkhorn.py",
        "        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)\n",
        "",
        ("tests/match/test_sinkhorn.py",),
    ),
    M(
        "sharpness-sums-the-loss",
        "the sharpness loss sums over examples instead of averaging",
        "src/lmckit/analysis/sharpness.py",
        "        return total / count",
        "        return total",
        ("tests/analysis/test_sharpness.py",),
    ),
    # -- more of our own ----------------------------------------------------------------
    M(
        "wm-skips-too-eagerly",
        "weight matching skips every group it has solved once",
        "src/lmckit/match/weight_matcher.py",
        "return last is not None and all(p is q for p, q in zip(neighbours, last, strict=True))",
        "return last is not None",
        ("tests/match/test_weight.py",),
    ),
    M(
        "wm-cost-transposed",
        "the group cost matrix is built B-by-A instead of A-by-B",
        "src/lmckit/match/weight_matcher.py",
        "        product = _rows_product(a2, self.b2(perm))",
        "        product = _rows_product(a2, self.b2(perm)).T",
        ("tests/match/test_weight.py",),
    ),
    M(
        "wm-objective-unpermuted",
        "the tracked objective pairs A with B as it is, not with the chosen permutation",
        "src/lmckit/match/weight_matcher.py",
        "    return _dot64(params_a[name], permute_tensor(params_b[name], spec, name, perm))\n",
        "    return _dot64(params_a[name], params_b[name])\n",
        ("tests/match/test_weight.py",),
    ),
    M(
        "compose-backwards",
        "Permutation.compose applies the inner permutation last",
        "src/lmckit/perm.py",
        "{g: inner._perms[g][p] for g, p in self._perms.items()}",
        "{g: p[inner._perms[g]] for g, p in self._perms.items()}",
        ("tests/test_perm.py",),
    ),
    M(
        "canonicalise-wrong-side",
        "mergers re-express permutations in the reference frame from the wrong side",
        "src/lmckit/merge/result.py",
        "return tuple(inv.compose(p) for p in perms)",
        "return tuple(p.compose(inv) for p in perms)",
        ("tests/merge/test_result.py",),
    ),
    M(
        "merge-many-stale-alignment",
        "MergeMany never updates the aligned copy of a re-matched model",
        "src/lmckit/merge/many.py",
        "                aligned[i] = r.perm.apply(params_list[i])\n",
        "",
        ("tests/merge/test_many.py",),
    ),
    M(
        "am-first-tap-only",
        "activation matching uses one tap of a residual stream instead of all of them",
        "src/lmckit/match/activation.py",
        "gains = sum(moments[name].gains(method) for name in names)",
        "gains = moments[names[0]].gains(method)",
        ("tests/match/test_activation.py",),
    ),
    M(
        "barrier-min-endpoint",
        "the Git Re-Basin barrier subtracts the better endpoint instead of their mean",
        "src/lmckit/evaluate/interpolation.py",
        '"rebasin": float(v.max() - 0.5 * (v[0] + v[-1])),',
        '"rebasin": float(v.max() - min(v[0], v[-1])),',
        ("tests/evaluate/test_interpolation.py",),
    ),
    M(
        "ensemble-fixed-mix",
        "the endpoint ensemble mixes the logits ½/½ at every λ",
        "src/lmckit/evaluate/interpolation.py",
        "ens = [(1 - lam) * stack[0] + lam * stack[-1] for lam in lams]",
        "ens = [0.5 * stack[0] + 0.5 * stack[-1] for lam in lams]",
        ("tests/evaluate/test_interpolation.py",),
    ),
    M(
        "bn-reset-biased-variance",
        "BN reset stores the biased variance (BatchNorm keeps the unbiased one)",
        "src/lmckit/evaluate/bn.py",
        "mean, var = sums[name].mean_var(unbiased=True)",
        "mean, var = sums[name].mean_var(unbiased=False)",
        ("tests/evaluate/test_bn.py",),
    ),
    M(
        "repair-forgets-target-mean",
        "REPAIR rescales the channels but does not move their means",
        "src/lmckit/evaluate/bn.py",
        "merged[bias_key] = ((b.double() - mean_m) * scale + target_mean).to(b)",
        "merged[bias_key] = ((b.double() - mean_m) * scale + mean_m).to(b)",
        ("tests/evaluate/test_bn.py",),
    ),
    M(
        "ece-unweighted-bins",
        "ECE averages the bins' gaps without weighting them by their counts",
        "src/lmckit/evaluate/calibration.py",
        "ece += count / n * abs(c - a)",
        "ece += abs(c - a) / n_bins",
        ("tests/evaluate/test_calibration.py",),
    ),
    M(
        "integer-buffers-from-b",
        "averages take integer buffers from the smallest weight",
        "src/lmckit/params.py",
        "return max(range(len(weights)), key=lambda i: (weights[i], -i))",
        "return min(range(len(weights)), key=lambda i: (weights[i], -i))",
        ("tests/test_params.py",),
    ),
    M(
        "mode-not-restored",
        "module_mode leaves the module in the mode it switched to",
        "src/lmckit/functional.py",
        "        for m, mode in saved:\n            m.training = mode\n",
        "        pass\n",
        ("tests/test_functional.py", "tests/test_side_effects.py"),
    ),
    M(
        "nan-weights-accepted",
        "matchers stop checking for NaN weights",
        "src/lmckit/match/result.py",
        '    check_finite(params_b, "model B")\n',
        "",
        ("tests/match/test_weight.py",),
    ),
    M(
        "star-matches-to-model-zero",
        "star merging aligns every model to the first instead of the reference",
        "src/lmckit/merge/star.py",
        "spec, params_list[ref], params, model=model, data=data, seed=seed, **match_options",
        "spec, params_list[0], params, model=model, data=data, seed=seed, **match_options",
        ("tests/merge/test_star.py", "tests/merge/test_result.py"),
    ),
    # -- the analyses (Ito et al., Git Re-Basin's counterexample) ----------------------------
    M(
        "r-ignores-input-permutation",
        "R permutes the left singular vectors of B but not the right ones (P_{l-1} dropped)",
        "src/lmckit/analysis/spectral.py",
        "    V = svd.V if cols is None else svd.V.index_select(0, cols.to(svd.V.device))",
        "    V = svd.V",
        ("tests/analysis/test_spectral.py",),
    ),
    M(
        "r-normalised-by-all-vectors",
        "R divides by every singular value's count instead of the kept ones",
        "src/lmckit/analysis/spectral.py",
        "        n = min(int(ka.sum()), int(kb.sum()))",
        "        n = a.S.numel()",
        ("tests/analysis/test_spectral.py",),
    ),
    M(
        "operator-spectrum-unpadded",
        "the kernel's DFT is taken at its own size, not zero-padded to the input",
        "src/lmckit/analysis/spectral.py",
        "torch.fft.fft2(kernel.detach().double(), s=(n, m))",
        "torch.fft.fft2(kernel.detach().double())",
        ("tests/analysis/test_spectral.py",),
    ),
    M(
        "taylor-hessians-swapped",
        "eq. 2 weights B's curvature by λ and A's by 1 − λ",
        "src/lmckit/analysis/taylor.py",
        "        curvature = lam * curv_a + (1 - lam) * curv_b",
        "        curvature = lam * curv_b + (1 - lam) * curv_a",
        ("tests/analysis/test_taylor.py",),
    ),
    M(
        "taylor-gradient-sign",
        "eq. 2 uses ∇L(θ_B) − ∇L(θ_A)",
        "src/lmckit/analysis/taylor.py",
        "(beta * (slope_a - slope_b)",
        "(beta * (slope_b - slope_a)",
        ("tests/analysis/test_taylor.py",),
    ),
    M(
        "exhaustive-tries-identity-only",
        "the exhaustive search stops after the first permutation",
        "src/lmckit/analysis/counterexample.py",
        '        notify(progress, k + 1, count, barrier=b["rebasin"])',
        '        notify(progress, k + 1, count, barrier=b["rebasin"])\n        break',
        ("tests/analysis/test_counterexample.py",),
    ),
    # -- the width study's measurements (issue "LMC without permutations") --
    M(
        "lewc-linear-weights",
        "LEWC compares with the linear mixture (1−λ)f_A + λf_B instead of the λ^ℓ one",
        "src/lmckit/analysis/layerwise.py",
        '("lewc", ((1 - lam) ** lay.depth, lam**lay.depth)),',
        '("lewc", (1 - lam, lam)),',
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "weak-additivity-wrong-side",
        "weak additivity mixes the post-activations on both sides",
        "src/lmckit/analysis/layerwise.py",
        "        relu_mix = torch.lerp(za, zb, lam).relu_()",
        "        relu_mix = torch.lerp(F.relu(za), F.relu(zb), lam)",
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "reciprocal-keeps-bias",
        "W z keeps the layer's bias (the paper's quantities are bias-free)",
        "src/lmckit/analysis/layerwise.py",
        "            return out - bias.view(1, -1, *([1] * (out.ndim - 2)))",
        "            return out",
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "commutativity-swapped",
        "commutativity compares W_A z_A + W_B z_B with itself (W_A z_B + W_B z_A never formed)",
        "src/lmckit/analysis/layerwise.py",
        "        left, right = wa_za + wb_zb, wa_zb + wb_za",
        "        left, right = wa_za + wb_zb, wa_za + wb_zb",
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "moments-mean-not-rms",
        "second moments accumulate |z| instead of z²",
        "src/lmckit/analysis/layerwise.py",
        '        m["a"] = m["a"] + za.square().sum(over).to(torch.float64)',
        '        m["a"] = m["a"] + za.abs().sum(over).to(torch.float64)',
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "flatness-direction-not-normalised",
        "the random direction is not normalised (the step is d·u, not d·u/‖u‖)",
        "src/lmckit/analysis/flatness.py",
        "    return {n: (t / norm).to(params[n]) for n, t in u.items()}",
        "    return {n: t.to(params[n]) for n, t in u.items()}",
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "calibration-on-held",
        "the calibrated loss is scored on the examples β was fitted on",
        "src/lmckit/evaluate/calibration.py",
        "    loss = F.cross_entropy(logits[rest].double() * beta, labels[rest].long()).item()",
        "    loss = F.cross_entropy(logits[held].double() * beta, labels[held].long()).item()",
        ("tests/analysis/test_layerwise.py",),
    ),
    M(
        "sophia-no-batch-factor",
        "Sophia's GNB estimate forgets the batch-size factor B",
        "src/lmckit/optim.py",
        "value=(1 - beta2) * batch_size)",
        "value=(1 - beta2))",
        ("tests/test_optim.py",),
    ),
    M(
        "sophia-unclipped",
        "Sophia's step is not clipped to [−1, 1]",
        "src/lmckit/optim.py",
        "                ratio = (m / (rho * h).clamp_min(eps)).clamp_(-1.0, 1.0)",
        "                ratio = m / (rho * h).clamp_min(eps)",
        ("tests/test_optim.py",),
    ),
    M(
        "snapshot-taken-late",
        "a snapshot is taken one epoch late",
        "src/lmckit/train.py",
        "        if epoch + 1 in snapshots:",
        "        if epoch in snapshots:",
        ("tests/test_train.py",),
    ),
    M(
        "effective-rank-no-exp",
        "effective rank returns the entropy instead of its exponential",
        "src/lmckit/analysis/spectral.py",
        "    return float(torch.exp(-(p * p.log()).sum()))",
        "    return float(-(p * p.log()).sum())",
        ("tests/analysis/test_spectral.py",),
    ),
    M(
        "lap-no-grid",
        "Jonker-Volgenant sees the raw reduced costs (the stalling matrix hangs)",
        "src/lmckit/lap.py",
        "    quantum = _on_grid(reduced)",
        "    quantum = 0.0",
        ("tests/test_lap.py",),
    ),
    # -- block-structured axes and the tracer ------------------------------------------------
    M(
        "blocks-interleaved",
        "a block permutation moves entries u + n·s (channels-last) instead of u·b + s",
        "src/lmckit/perm.py",
        "        index = (index[:, None] * block + torch.arange(block, device=index.device))"
        ".reshape(-1)",
        "        n = index.numel()\n"
        "        index = (index[None, :] + n * torch.arange(block, device=index.device)[:, None])"
        ".reshape(-1)",
        ("tests/test_perm_blocks.py", "tests/spec/test_trace.py"),
    ),
    M(
        "wm-blocks-rows-per-entry",
        "WM lays B out with one row per entry of a blocked axis instead of one per unit",
        "src/lmckit/match/weight_matcher.py",
        "        return group_rows("
        "self.spec, self.name, self.axis, self.group, b.movedim(self.axis, 0), 0)",
        "        b = b.movedim(self.axis, 0)\n        return b.reshape(b.shape[0], -1)",
        ("tests/test_perm_blocks.py", "tests/spec/test_trace.py"),
    ),
    M(
        "sinkhorn-blocks-rows-per-entry",
        "Sinkhorn's soft permutation multiplies one row per entry of a blocked axis",
        "src/lmckit/match/sinkhorn.py",
        "                rows = group_rows(spec, name, axis, g, t)",
        "                rows = t.movedim(axis, 0).reshape(t.shape[axis], -1)",
        ("tests/test_perm_blocks.py",),
    ),
    M(
        "trace-ties-not-joined",
        "tied tensors exported as two placeholders are not joined",
        "src/lmckit/spec/trace.py",
        "            uf.union((theirs, i), (mine, i))",
        "            pass",
        ("tests/spec/test_trace.py", "tests/spec/test_trace_transformers.py"),
    ),
    M(
        "trace-unknown-op-ignored",
        "an operator without a rule relates nothing instead of freezing its axes",
        "src/lmckit/spec/trace.py",
        "                for x in _tensor_inputs(node):\n"
        "                    ax.freeze_all(x, why)\n",
        "",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "trace-no-verification",
        "the traced spec is returned without the equivalence check",
        "src/lmckit/spec/trace.py",
        "        modes = _verify(model, spec, args, kwargs, seed, rtol, select, precision)\n"
        "    except SpecError as exc:",
        '        modes = ("eval", "train")\n    except SpecError as exc:',
        ("tests/spec/test_trace.py",),
    ),
    M(
        "trace-split-heads-inner-axis",
        "a split into heads takes the head dimension for the heads (outer and inner swapped)",
        "src/lmckit/spec/rules.py",
        "            ax.nest(x, big_in[0], node, big_out[0], big_out[1])",
        "            ax.nest(x, big_in[0], node, big_out[1], big_out[0])",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "unit-rows-ignore-repeats",
        "a repeated axis is laid out unit-major over all segments (one row mixes units)",
        "src/lmckit/perm.py",
        "    return moved.reshape(repeat, n, -1).transpose(0, 1).reshape(n, -1)",
        "    return moved.reshape(n, -1)",
        ("tests/test_perm_blocks.py",),
    ),
    M(
        "trace-sums-parts-not-joined",
        "two direct sums cut alike on one axis leave their parts apart",
        "src/lmckit/spec/trace.py",
        "                        changed |= uf.union(x, y)",
        "                        pass",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "trace-frozen-sum-parts-move",
        "a frozen direct sum does not freeze its parts",
        "src/lmckit/spec/trace.py",
        "            if (why := uf.reason(root)) is not None:\n                if not why",
        "            if False and (why := uf.reason(root)) is not None:\n"
        "                if not why",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "graph-taps-units-not-moved",
        "activations read off the graph keep their units on the axis they had, not on axis 1",
        "src/lmckit/spec/taps.py",
        'f"{node}:{axis}": found[node].movedim(axis, 1)',
        'f"{node}:{axis}": found[node]',
        ("tests/spec/test_taps.py",),
    ),
    M(
        "trace-sites-ignore-head-labels",
        "activation sites of head-structured groups looked up without their inside label",
        "src/lmckit/spec/trace.py",
        "        name = names.get((uf.find((node, i)), labels.get((node, i))))",
        "        name = names.get((uf.find((node, i)), None))",
        ("tests/spec/test_taps.py",),
    ),
    M(
        "wm-delta-forgets-the-old-columns",
        "an updated cost-matrix term adds A[:, D] B̃_new[:, D]ᵀ without taking B̃_old's away",
        "src/lmckit/match/weight_matcher.py",
        "            change = new.sub_(_take_columns(self.b_rows, self._sources(before, chunk)))",
        "            change = new",
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "wm-delta-keeps-a-product-across-calls",
        "a kept product survives into the next match() call, whose A is another",
        "src/lmckit/match/weight_matcher.py",
        "        self._costs.clear()  # formed from another A",
        "        pass",
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "wm-overlap-ignores-dependence",
        "the next unit's cost matrices are formed before this LAP even when they neighbour it",
        "src/lmckit/match/weight_matcher.py",
        "                    and not set(unit) & set(self.neighbours[following])\n",
        "",
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "wm-small-gpu-matrices-updated",
        "on a GPU every kept matrix is updated, however cheap forming it again would be",
        "src/lmckit/match/weight_matcher.py",
        "        return not on_gpu or formation_flops >= self.gpu_min_flops\n",
        "        return True\n",
        ("tests/match/test_weight_matcher.py", "tests/test_device.py"),
    ),
    M(
        "lap-stale-duals-left-infeasible",
        "warm duals are handed to JV as they are, negative reduced costs and all",
        "src/lmckit/lap.py",
        "    shift = np.minimum(row_min, 0.0)\n",
        "    shift = np.zeros(n)\n",
        ("tests/test_lap.py",),
    ),
    M(
        "straight-through-drops-the-weight",
        "the straight-through mixture hands each proxy the whole gradient, not w_i of it",
        "src/lmckit/match/_functional.py",
        "return (None, None, *(grad * w for w in ctx.weights))",
        "return (None, None, *(grad for w in ctx.weights))",
        ("tests/match/test_ste.py",),
    ),
    M(
        "lap-grid-half-steps",
        "the grid rounding lands on half steps (the magic constant one binade too low)",
        "src/lmckit/lap.py",
        "    magic = 1.5 * 2.0**52 * quantum\n",
        "    magic = 1.5 * 2.0**51 * quantum\n",
        ("tests/test_lap.py",),
    ),
    M(
        "lap-warm-path-skips-finiteness",
        "a warm solve no longer checks the reduced costs' row minima for NaN or -inf",
        "src/lmckit/lap.py",
        "    if not np.isfinite(row_min).all():\n        _raise_non_finite(c, duals)\n",
        "",
        ("tests/test_lap.py",),
    ),
    M(
        "lap-contended-cold-solve-left-to-jv",
        "a cold solve whose rows all prefer a few columns stays with Jonker-Volgenant",
        "src/lmckit/lap.py",
        '        if backend != "scipy" and n > 1 and _contended(c_min, duals):\n',
        "        if False:\n",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-keeps-every-earlier-pair",
        "the warm kernel keeps every pair of the earlier assignment, tight or not",
        "src/lmckit/_warm_jv.py",
        "and reduced[i, j] - row_min[i] == v[j]:",
        "and reduced[i, j] - row_min[i] >= v[j]:",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-ignores-the-earlier-assignment",
        "the warm kernel never keeps the earlier assignment (a hint silently dropped)",
        "src/lmckit/_warm_jv.py",
        "    if previous.shape[0] == n:\n",
        "    if False:\n",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-row-reduction-raises-the-price",
        "augmenting row reduction moves the column price the wrong way",
        "src/lmckit/_warm_jv.py",
        "                v[j1] -= second - first\n",
        "                v[j1] += second - first\n",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-path-prices-not-updated",
        "after a shortest path the scanned columns' prices are left as they were",
        "src/lmckit/_warm_jv.py",
        "            v[j] += dist[j] - least\n",
        "            v[j] += 0.0\n",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-reduction-misses-nan",
        "the kernel's reduced costs no longer notice a NaN (min and max skip it)",
        "src/lmckit/_warm_jv.py",
        "            spoilt += r - r  # stays 0 unless an entry is NaN or ±inf\n",
        "",
        ("tests/test_lap.py",),
    ),
    M(
        "jv-shift-not-applied",
        "the kernel rounds the reduced costs without lowering the rows first",
        "src/lmckit/_warm_jv.py",
        "                row[j] = ((row[j] - s) + magic) - magic\n",
        "                row[j] = (row[j] + magic) - magic\n",
        ("tests/test_lap.py",),
    ),
    M(
        "lap-dual-passes-stop-early",
        "duals_of stops after one pass, before the constraints have settled",
        "src/lmckit/lap.py",
        "        if np.array_equal(settled, v):\n",
        "        if True:\n",
        ("tests/test_lap.py",),
    ),
    M(
        "sum-index-without-offset",
        "a direct sum's segments are indexed from 0 instead of from their start",
        "src/lmckit/perm.py",
        "        else start + block_index(perms[g], block)",
        "        else block_index(perms[g], block)",
        ("tests/test_perm_sums.py",),
    ),
    M(
        "sum-rows-first-segment-only",
        "a group in two segments of a direct sum counts only the first in its cost matrix",
        "src/lmckit/perm.py",
        "    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)",
        "    return parts[0]",
        ("tests/test_perm_sums.py",),
    ),
    M(
        "trace-tolerance-ignores-casts",
        "the equivalence check holds a model that computes in float32 to float64's tolerance",
        "src/lmckit/spec/trace.py",
        "    return max(1e-7, 1000 * lowest) if lowest > torch.finfo(torch.float64).eps else 1e-7",
        "    return 1e-7",
        ("tests/spec/test_trace_transformers.py",),
    ),
    # -- head-structured groups, splits and per-part metrics --
    M(
        "heads-outer-ignores-inner-optima",
        "the two-level assignment picks the heads from the diagonal blocks only",
        "src/lmckit/lap.py",
        "                totals[i, j] += blocks[i, j][rows, cols].sum()",
        "                totals[i, j] += blocks[i, j].trace()",
        ("tests/test_perm_heads.py",),
    ),
    M(
        "heads-inner-of-wrong-pair",
        "each head keeps the inner permutation solved against its own position, not its match",
        "src/lmckit/lap.py",
        "        chosen = best[np.arange(heads), outer]",
        "        chosen = best[np.arange(heads), np.arange(heads)]",
        ("tests/test_perm_heads.py",),
    ),
    M(
        "tie-not-joined",
        "groups tied by a head permutation are solved one by one in weight matching",
        "src/lmckit/perm.py",
        "            if g in self.heads:\n                tie = self.heads[g][0]",
        "            if False:\n                tie = self.heads[g][0]",
        ("tests/test_perm_heads.py",),
    ),
    M(
        "heads-structure-unchecked",
        "Permutation accepts index vectors that move units between heads",
        "src/lmckit/perm.py",
        "                if parts is None:\n                    raise PermutationError(",
        "                if parts is None and False:\n                    raise PermutationError(",
        ("tests/test_perm_heads.py",),
    ),
    M(
        "inside-ignores-rotary",
        "a head's insides stay permutable though its inner axis was frozen (a rotary slice)",
        "src/lmckit/spec/trace.py",
        "        if (why := found.inner_reasons[inner]) is not None:\n"
        "            inside.freeze(merged, why)",
        "        if (why := found.inner_reasons[inner]) is not None:\n            pass",
        ("tests/spec/test_trace_transformers.py",),
    ),
    M(
        "dirichlet-one-draw",
        "the Dirichlet split draws one set of proportions for all classes",
        "src/lmckit/data/splits.py",
        "        shares = rng.dirichlet(np.full(clients, float(alpha)))",
        "        shares = np.random.default_rng(seed).dirichlet(np.full(clients, float(alpha)))",
        ("tests/data/test_splits.py",),
    ),
    M(
        "split-ignored-in-training",
        "train() ignores config.split and trains on all the data",
        "src/lmckit/train.py",
        "        data = data.subset(train_idx=part)",
        "        pass",
        ("tests/test_cli.py",),
    ),
    M(
        "part-not-by-seed-index",
        "every seed's model of an experiment trains on part 0",
        "src/lmckit/experiments/spec.py",
        '    options["split"] = {**table, "part": index % parts}',
        '    options["split"] = {**table, "part": 0}',
        ("tests/experiments/test_splits.py",),
    ),
    M(
        "majority-by-count-not-share",
        "a part's majority classes are the classes it has most examples of, not most of",
        "src/lmckit/evaluate/parts.py",
        "    share = mine.double() / every.clamp_min(1).double()",
        "    share = mine.double() / mine.sum().double()",
        ("tests/evaluate/test_parts.py",),
    ),
    M(
        "match-key-ignores-spec",
        "stored permutations are keyed without the spec they were found over",
        "src/lmckit/experiments/matching.py",
        '    if spec is not None:\n        settings["spec"] = spec',
        "",
        ("tests/experiments/test_matching.py",),
    ),
    M(
        "fused-parts-all-first",
        "every select of a fused projection reads its first part (q, k and v one group)",
        "src/lmckit/spec/rules.py",
        "            ax.same(parts[index], 0, reader, where[rest[0]])\n"
        "        else:\n"
        "            ax.nest(parts[index], 0, reader, where[rest[0]], where[rest[1]])",
        "            ax.same(parts[0], 0, reader, where[rest[0]])\n"
        "        else:\n"
        "            ax.nest(parts[0], 0, reader, where[rest[0]], where[rest[1]])",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "batch-heads-merge-joined",
        "a merge of a frozen batch with the heads joins the heads to the batch (MHA frozen)",
        "src/lmckit/spec/rules.py",
        "        if not self.frozen(split, inner) and (",
        "        if False and not self.frozen(split, inner) and (",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "mha-dropout-left-on",
        "the check leaves nn.MultiheadAttention's dropout on in train mode",
        "src/lmckit/spec/trace.py",
        "(F.scaled_dot_product_attention, 4), (F.multi_head_attention_forward, 10))",
        "(F.scaled_dot_product_attention, 4),)",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "regroup-nest-swapped",
        "a regrouping reshape nests its refined axes inner-first",
        "src/lmckit/spec/rules.py",
        "                ax.nest(t, d, fine, span[0], span[1])",
        "                ax.nest(t, d, fine, span[1], span[0])",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "groupnorm-nest-swapped",
        "GroupNorm's channels nested as per-group × groups (blocks across the groups)",
        "src/lmckit/spec/rules.py",
        '        ax.nest(node, 1, ax.unit(node, (groups, xs[1] // groups), "groups"), 0, 1)',
        '        ax.nest(node, 1, ax.unit(node, (xs[1] // groups, groups), "groups"), 0, 1)',
        ("tests/spec/test_trace.py",),
    ),
    M(
        "checkpoint-trusts-sidecar-class",
        "load_checkpoint imports whatever user class a sidecar names",
        "src/lmckit/checkpoint.py",
        '    if custom and model_meta.get("class") not in set(classes):',
        '    if False and custom and model_meta.get("class") not in set(classes):',
        ("tests/experiments/test_custom.py",),
    ),
    M(
        "wm-update-keeps-old-seen",
        "an updated term keeps the permutations it was formed with (later updates repeat it)",
        "src/lmckit/match/weight_matcher.py",
        "        self.seen = self.current(perm)\n        self.flops = 2 * n * n * cols.numel()",
        "        self.flops = 2 * n * n * cols.numel()",
        ("tests/match/test_weight_matcher.py",),
    ),
    M(
        "wm-objective-cache-never-refreshed",
        "a tensor's share of the objective is computed once and never again",
        "src/lmckit/match/weight_matcher.py",
        "            if hit is None or not _same(used, hit[0]):",
        "            if hit is None:",
        ("tests/match/test_weight.py", "tests/match/test_weight_matcher.py"),
    ),
    M(
        "wm-update-first-chunk-only",
        "an update over many changed columns applies only its first chunk",
        "src/lmckit/match/weight_matcher.py",
        "        for chunk in cols.split(max(1, n // 4)):",
        "        for chunk in cols.split(max(1, n // 4))[:1]:",
        ("tests/match/test_weight_matcher.py",),
    ),
    # -- the bugs a reviewer found unnoticed (issue "Every input checked"): random choices,
    # temperatures and initialisations a test could not tell from fixed ones --------------
    M(
        "ece-one-bin-short",
        "the calibration error is computed over n_bins − 1 bins",
        "src/lmckit/evaluate/calibration.py",
        "edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)",
        "edges = torch.linspace(0, 1, n_bins, dtype=torch.float64)",
        ("tests/test_random_choices.py",),
    ),
    M(
        "sinkhorn-ignores-tau",
        "Sinkhorn's soft permutations are formed at temperature 1 whatever tau says",
        "src/lmckit/match/sinkhorn.py",
        "    def soft_b() -> dict:\n        soft = {g: log_sinkhorn(z / tau, sinkhorn_iters)",
        "    def soft_b() -> dict:\n        soft = {g: log_sinkhorn(z, sinkhorn_iters)",
        ("tests/test_random_choices.py",),
    ),
    M(
        "sinkhorn-init-transposed",
        "Sinkhorn's initial permutation is placed transposed (its inverse)",
        "src/lmckit/match/sinkhorn.py",
        "base[torch.arange(n), init[g]] += 5.0",
        "base[init[g], torch.arange(n)] += 5.0",
        ("tests/test_random_choices.py",),
    ),
    M(
        "merge-many-fixed-order",
        "MergeMany visits the models in index order instead of Alg. 3's random order",
        "src/lmckit/merge/many.py",
        "for i in torch.randperm(n, generator=generator).tolist():",
        "for i in range(n):",
        ("tests/test_random_choices.py",),
    ),
    M(
        "random-merges-one-permutation",
        "the width study's random merges draw one permutation for both models",
        "src/lmckit/analysis/random_permutations.py",
        "pi_a, pi_b = Permutation.random(spec, gen), Permutation.random(spec, gen)",
        "pi_a = pi_b = Permutation.random(spec, gen)",
        ("tests/test_random_choices.py",),
    ),
    M(
        "calibrated-loss-ignores-beta",
        "the calibrated loss is the raw loss on the held-out rest (β fitted, then unused)",
        "src/lmckit/evaluate/calibration.py",
        "F.cross_entropy(logits[rest].double() * beta, labels[rest].long())",
        "F.cross_entropy(logits[rest].double(), labels[rest].long())",
        ("tests/test_random_choices.py",),
    ),
    # -- issue "Every input checked": validation, integrity, ledger, outputs, divergence --
    M(
        "integrity-whole-digest-skipped",
        "the sidecar's whole-file SHA-256 is never compared with the weights",
        "src/lmckit/checkpoint.py",
        "if whole is not None and whole != computed:",
        "if False:",
        ("tests/test_integrity.py",),
    ),
    M(
        "integrity-chunks-only-from-v2",
        "a version-1 sidecar's chunk digests are not checked",
        "src/lmckit/checkpoint.py",
        '    recorded = meta.get("weights_sha256_chunks")\n',
        '    recorded = meta.get("weights_sha256_chunks") '
        'if meta.get("format_version", 1) >= 2 else None\n',
        ("tests/test_integrity.py",),
    ),
    M(
        "store-meta-digest-ignored",
        "an edited store record is believed",
        "src/lmckit/experiments/store.py",
        'if meta.get("meta_sha256") != meta_digest(meta):',
        "if False:",
        ("tests/test_integrity.py",),
    ),
    M(
        "store-unlisted-files-allowed",
        "files meta.json does not list are reused unchecked",
        "src/lmckit/experiments/store.py",
        'unlisted = sorted(set(present) - set(meta["files"]))',
        "unlisted = []",
        ("tests/test_integrity.py",),
    ),
    M(
        "ledger-never-says-reused",
        "a reused job is recorded as computed again (one more attempt)",
        "src/lmckit/experiments/ledger.py",
        "(int(reused), 0 if reused else 1, started, finished, seconds, run, name),",
        "(0, 1, started, finished, seconds, run, name),",
        ("tests/experiments/test_ledger.py",),
    ),
    M(
        "ledger-reads-every-run",
        "status and report read the jobs of every run, not the latest",
        "src/lmckit/experiments/ledger.py",
        "f\"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE run = ? ORDER BY name\",",
        "f\"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE run <= ? ORDER BY name\",",
        ("tests/experiments/test_ledger.py",),
    ),
    M(
        "overrides-not-recorded",
        "the experiment file is recorded as written, without the overrides it ran with",
        "src/lmckit/experiments/spec.py",
        "        if not self.overrides:\n",
        "        if True:\n",
        ("tests/experiments/test_runner.py", "tests/experiments/test_spec.py"),
    ),
    M(
        "outputs-unguarded",
        "writes into an output folder no longer check what is already there",
        "src/lmckit/_io.py",
        "    claim(dest)\n    dest.parent.mkdir(",
        "    dest.parent.mkdir(",
        ("tests/test_io.py",),
    ),
    M(
        "foreign-files-are-sidecar-pairs",
        "a user's weights file is taken for an lmckit pair (stem.safetensors/.json)",
        "src/lmckit/checkpoint.py",
        "        if self.foreign:\n",
        "        if False:\n",
        ("tests/test_integrity.py", "tests/test_nothing_ignored.py"),
    ),
    M(
        "divergence-only-non-finite",
        "a loss far above its start is not a divergence",
        "src/lmckit/train.py",
        "        if train_loss > start_loss + max(DIVERGENCE_MARGIN, start_loss):",
        "        if False:",
        ("tests/test_train.py",),
    ),
    M(
        "diverged-model-not-restored",
        "a diverged model is left as it diverged, not at its last good state",
        "src/lmckit/train.py",
        "        model.load_state_dict(last_good)\n",
        "        pass\n",
        ("tests/test_train.py",),
    ),
    M(
        "fedavg-uniform",
        "FedAvg weights every client alike",
        "src/lmckit/merge/average.py",
        "weights = [n / sum(sizes) for n in sizes]",
        "weights = [1 / len(sizes) for _ in sizes]",
        ("tests/merge/test_star.py",),
    ),
    M(
        "registry-accepts-unknown-options",
        "a method option the method does not take is accepted",
        "src/lmckit/registry.py",
        "unknown = sorted(set(options) - set(allowed))",
        "unknown = []",
        ("tests/test_registry.py", "tests/experiments/test_spec.py"),
    ),
    M(
        "cli-options-never-checked",
        "command-line options that do not apply are ignored",
        "src/lmckit/cli.py",
        "        if dest in args.given:\n",
        "        if False:\n",
        ("tests/test_nothing_ignored.py",),
    ),
    M(
        "data-dir-falls-back",
        "an explicit data folder without the data falls back to another copy",
        "src/lmckit/data/datasets.py",
        "        return [Path(root), Path(root) / subdir]",
        "        out += [Path(root), Path(root) / subdir]",
        ("tests/data/test_datasets.py",),
    ),
    M(
        "killed-worker-internal-error",
        "a killed worker ends the run in an internal error",
        "src/lmckit/experiments/runner.py",
        "                except BrokenProcessPool:",
        "                except ValueError:",
        ("tests/experiments/test_runner.py",),
    ),
    M(
        "user-code-not-keyed",
        "a user's class is keyed by its name and arguments, not its code",
        "src/lmckit/models/custom.py",
        "    if source is not None:  # the code is part of what the model is (and of every key)",
        "    if False:",
        ("tests/experiments/test_custom.py",),
    ),
    M(
        "split-takes-foreign-settings",
        "a split table naming another kind's setting is accepted",
        "src/lmckit/data/splits.py",
        "        if own is not None and foreign:",
        "        if False:",
        ("tests/experiments/test_spec.py",),
    ),
    M(
        "options-accept-booleans",
        "true and false are accepted as integers (epochs = true)",
        "src/lmckit/options.py",
        "        return isinstance(value, int) and not isinstance(value, bool)",
        "        return isinstance(value, int)",
        ("tests/test_registry.py", "tests/experiments/test_spec.py"),
    ),
    M(
        "partial-dataset-skipped",
        "a partial copy of a dataset on the lookup path is passed over for the next copy",
        "src/lmckit/data/datasets.py",
        "        if root is None and directory != download_target:",
        "        if False:",
        ("tests/data/test_datasets.py",),
    ),
    M(
        "repeats-accepted",
        "a method, model count or grid value listed twice is accepted (jobs run twice)",
        "src/lmckit/experiments/spec.py",
        "    if repeated:\n        raise ExperimentError(",
        "    if False:\n        raise ExperimentError(",
        ("tests/experiments/test_spec.py",),
    ),
    M(
        "pad-moves-padded-axis",
        "a padded axis is mapped through the pad like an unpadded one",
        "src/lmckit/spec/rules.py",
        '        if i in padded:\n            ax.freeze(x, i, "padded axis")',
        '        if False:\n            ax.freeze(x, i, "padded axis")',
        ("tests/spec/test_trace.py",),
    ),
    M(
        "pad-counts-from-the-front",
        "pad's amounts read from the first axis instead of the last",
        "src/lmckit/spec/rules.py",
        "            padded.add(len(xs) - 1 - k)",
        "            padded.add(k)",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "trace-keeps-the-cache",
        "a Hugging Face decoder is traced with its default use_cache=True",
        "src/lmckit/spec/trace.py",
        '        kwargs["use_cache"] = False  # see trace()',
        "        pass  # see trace()",
        ("tests/spec/test_trace_transformers.py",),
    ),
    M(
        "no-pointwise-fallback",
        "ops outside the hand-written table get no rule even when PyTorch tags them pointwise",
        "src/lmckit/spec/rules.py",
        '    if rule is None and torch.Tag.pointwise in getattr(target, "tags", ()):',
        "    if False:",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "ramp-as-constant",
        "an arange made in forward is taken for a constant (every entry equal)",
        "src/lmckit/spec/rules.py",
        '    (fresh_constant, ("arange", "empty",',
        '    (like_constant, ("arange",)),\n    (fresh_constant, ("empty",',
        ("tests/spec/test_trace.py",),
    ),
    M(
        "constants-made-in-forward-freeze",
        "zeros/ones/full made in forward freeze the axes they meet",
        "src/lmckit/spec/rules.py",
        '    (fresh_constant, ("arange", "empty",',
        '    (fresh_constant, ("zeros", "ones", "full", "new_ones", "arange", "empty",',
        ("tests/spec/test_trace.py",),
    ),
    M(
        "unread-values-constrain",
        "a value nothing reads (a shape probe) still freezes the axes it selects from",
        "src/lmckit/spec/trace.py",
        "            if _unread(node):\n                continue",
        "            if False:\n                continue",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "mutating-ops-skipped",
        "an in-place op whose result nobody reads is skipped (its write ignored)",
        "src/lmckit/spec/trace.py",
        "    return schema is not None and not schema.is_mutable",
        "    return schema is not None",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "every-output-is-the-function",
        "a Hugging Face output holding logits is read whole (T5's encoder stream freezes)",
        "src/lmckit/spec/trace.py",
        '    if isinstance(output, Mapping) and "logits" in output:',
        "    if False:",
        ("tests/spec/test_trace_transformers.py",),
    ),
    M(
        "outputs-selector-ignored",
        "outputs= is accepted but every output is frozen anyway",
        "src/lmckit/spec/trace.py",
        "    return {names[i] for i in picked if i < len(names) and names[i] is not None}",
        "    return {n for n in names if n is not None}",
        ("tests/spec/test_trace.py",),
    ),
    M(
        "private-file-list",
        "the output folder's file list keeps mkstemp's 0o600",
        "src/lmckit/_io.py",
        "        os.chmod(tmp, _default_mode())  # readable like the files it lists",
        "        pass  # readable like the files it lists",
        ("tests/test_io.py",),
    ),
]


def copy_repository(target: Path) -> None:
    for name in ("src", "tests", "experiments", "pyproject.toml", "README.md", ".ci"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, target / name)


def run(mutation: Mutation, full: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="lmckit-mutant-") as tmp:
        work = Path(tmp)
        copy_repository(work)
        path = work / mutation.path
        text = path.read_text()
        count = text.count(mutation.old)
        if count != 1:
            raise SystemExit(
                f"{mutation.name}: the snippet occurs {count} times in {mutation.path}"
            )
        path.write_text(text.replace(mutation.old, mutation.new))
        tests = [] if full else list(mutation.tests)
        env = {**os.environ, "PYTHONPATH": str(work / "src")}
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return {
            "mutation": mutation.name,
            "why": mutation.why,
            "caught": proc.returncode != 0,
            "by": failed[:1],
            "seconds": round(time.perf_counter() - start, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="run the whole suite per mutation")
    parser.add_argument("--only", nargs="+", help="mutation names")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    results = []
    for mutation in chosen:
        result = run(mutation, args.full)
        results.append(result)
        mark = "caught " if result["caught"] else "MISSED "
        print(
            f"{mark} {mutation.name:<34} {result['seconds']:>6.1f} s  {' '.join(result['by'])}",
            file=sys.stderr,
            flush=True,
        )
    caught = sum(r["caught"] for r in results)
    print(json.dumps({"caught": caught, "mutations": len(results), "results": results}, indent=2))
    sys.exit(0 if caught == len(results) else 1)


if __name__ == "__main__":
    main()
