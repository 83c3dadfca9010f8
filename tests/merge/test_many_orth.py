"""MergeMany over orthogonal maps (lmckit.merge.merge_many_orthogonal): models that are
the same function in other orthogonal frames merge back into that function exactly, where
permutations alone cannot; on independent models the objective only rises."""

from __future__ import annotations

import itertools

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.merge import METHODS, merge_many, merge_many_orthogonal
from lmckit.models import build_model, permutation_spec
from lmckit.tracing import symmetry_kinds
from lmckit.transform import Transform, fold_norms, orthogonal_subgroup, unfold_norms
from tests.tracing.test_kinds import randomized_norms


def _gpt(seed: int):
    torch.manual_seed(seed)
    model = build_model("gpt", vocab_size=20, context=8, dim=16, depth=2, heads=4, mlp_dim=32)
    return randomized_norms(model.double().eval(), seed)


def _logits(model, params, x):
    with torch.no_grad():
        return torch.func.functional_call(model, params, (x,))


def test_copies_in_rotated_frames_merge_back_into_the_model():
    model = _gpt(0)
    x = torch.randint(0, 20, (4, 8))
    spec = permutation_spec(model)
    kinds = orthogonal_subgroup(symmetry_kinds(model, x, spec).spec)
    params = {k: v.detach() for k, v in model.state_dict().items()}
    gains = {k: params[k] for k in kinds.folds}
    folded = fold_norms(kinds, params)
    copies = [params] + [
        unfold_norms(kinds, Transform.random(kinds, seed).apply(folded), gains) for seed in (1, 2)
    ]
    ref = _logits(model, params, x)
    for copy in copies:  # each copy is the model's function, in another frame
        assert ((_logits(model, copy, x) - ref).abs().max() / ref.abs().max()) < 1e-10
    result = merge_many_orthogonal(spec, copies, model=model, example_inputs=x, reference=0)
    merged = _logits(model, result.merged, x)
    assert ((merged - ref).abs().max() / ref.abs().max()).item() < 1e-9
    assert result.perms[0].distance(folded, folded) == 0.0  # the reference keeps its frame
    plain = merge_many(spec, copies, reference=0).merged
    assert ((_logits(model, plain, x) - ref).abs().max() / ref.abs().max()).item() > 1e-2


def test_independent_models_raise_the_objective_round_by_round():
    models = [_gpt(s) for s in range(3)]
    x = torch.randint(0, 20, (4, 8))
    spec = permutation_spec(models[0])
    params = [{k: v.detach() for k, v in m.state_dict().items()} for m in models]
    result = METHODS["merge-many-orth"](
        spec, params, model=models[0], data=[(x, None)], max_rounds=5
    )
    history = result.history
    assert len(history) >= 2
    assert all(b >= a - 1e-9 * abs(a) for a, b in itertools.pairwise(history))
    assert history[-1] > history[0]  # beyond MergeMany's permutations
    assert set(result.merged) == set(params[0])


def test_a_model_without_rotations_is_refused():
    model = build_model("mlp", hidden=(8,))
    x = torch.randn(4, 1, 28, 28)
    spec = permutation_spec(model)
    params = [{k: v.detach() for k, v in model.state_dict().items()}] * 2
    with pytest.raises(ParamsError, match="merge-many"):
        merge_many_orthogonal(spec, params, model=model, example_inputs=x)
    with pytest.raises(ParamsError, match="example_inputs"):
        merge_many_orthogonal(spec, params, model=model)
