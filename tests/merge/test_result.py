"""What every merger shares: one signature, planted copies merged back, the reference's
frame, BatchNorm reset of the merged model, input checks."""

import pytest
import torch

from lmckit.errors import ParamsError, PermutationError, SpecError
from lmckit.merge import METHODS, merge_many
from lmckit.models import build_model
from lmckit.params import params_distance
from lmckit.perm import Permutation
from tests.merge.common import planted_copies, random_models

FAST = {"epochs": 1}  # one epoch is enough for planted copies
# the MLPs here have no orthogonal symmetry: merge-many-orth refuses them (it is tested on
# transformers in test_many_orth.py)
PERMUTING = [m for m in METHODS if m != "merge-many-orth"]
ALIGNING = [m for m in PERMUTING if m not in ("average", "fedavg")]  # no alignment, by design


def run(method, model, spec, params, data, **kwargs):
    options = {k: v for k, v in FAST.items() if k in METHODS[method].options()}
    if METHODS[method].needs_sizes:
        options["sizes"] = [100 + 50 * i for i in range(len(params))]
    return METHODS[method](spec, params, model=model, data=data, **options, **kwargs)


@pytest.mark.parametrize("method", ALIGNING)
def test_planted_copies_are_merged_back_into_the_original(method, digits):
    model, spec, _, copies = planted_copies()
    result = run(method, model, spec, copies, digits)
    reference = copies[-1]
    assert result.perms[-1].is_identity()
    for perm, params in zip(result.perms, copies, strict=True):
        assert params_distance(perm.apply(params), reference) == 0.0
    assert params_distance(result.merged, reference) < 1e-6


@pytest.mark.parametrize("method", ALIGNING)
def test_reference_picks_the_frame(method, digits):
    model, spec, _, copies = planted_copies(3)
    result = run(method, model, spec, copies, digits, reference=1)
    assert result.perms[1].is_identity()
    assert params_distance(result.merged, copies[1]) < 1e-6


@pytest.mark.parametrize("method", ["star-wm", "merge-many", "ccmm"])
def test_merging_is_deterministic_for_a_seed(method, digits):
    model, spec, params = random_models()
    first = run(method, model, spec, params, digits, seed=3)
    again = run(method, model, spec, params, digits, seed=3)
    assert first.perms == again.perms


@pytest.mark.parametrize("method", PERMUTING)
def test_merged_batchnorm_models_get_fresh_statistics(method, digits):
    model, spec, params = random_models(3, hidden=(16, 16), norm="batch")
    result = run(method, model, spec, params, digits)
    assert result.info["bn_reset"] is True
    # the running mean of the first BN is the exact mean of its inputs over the data
    w, b = result.merged["layers.0.weight"], result.merged["layers.0.bias"]
    z = digits.train_x.flatten(1) @ w.T + b
    assert torch.allclose(result.merged["norms.0.running_mean"], z.mean(0), atol=1e-4)
    if not METHODS[method].needs_data:
        sizes = {"sizes": [1] * 3} if METHODS[method].needs_sizes else {}
        bare = METHODS[method](spec, params, **sizes)
        assert bare.info["bn_reset"] is False


def test_bad_inputs_are_named():
    _, spec, base, copies = planted_copies(2)
    with pytest.raises(ParamsError, match="at least 2 models"):
        merge_many(spec, copies[:1])
    with pytest.raises(ParamsError, match="list of parameter dicts"):
        merge_many(spec, copies[0])
    other = build_model("mlp", in_dim=64, hidden=[24, 21]).state_dict()
    with pytest.raises(SpecError, match="model 1 vs model 0"):
        merge_many(spec, [base, other])
    with pytest.raises(ParamsError, match="reference must be an index"):
        merge_many(spec, copies, reference=2)
    with pytest.raises(ParamsError, match="init has 1 permutations for 2 models"):
        merge_many(spec, copies, init=[Permutation.identity(spec)])
    bad = Permutation.identity(Permutation.identity(spec).spec.__class__({"x": 2}, {"w": ("x",)}))
    with pytest.raises(PermutationError, match="init permutes groups"):
        merge_many(spec, copies, init=[bad, bad])
    for method in METHODS.values():
        if method.needs_model:
            with pytest.raises(ParamsError, match="needs model="):
                method(spec, copies)
