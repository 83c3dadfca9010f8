"""Per-tensor L2 distances against params_distance and a planted permutation."""

import math

import pytest
import torch

from lmckit.analysis.distance import l2_distances
from lmckit.errors import SpecError
from lmckit.models import build_model, permutation_spec
from lmckit.params import params_distance
from lmckit.perm import Permutation
from tests.zoo import nontrivial


def test_distances_split_parameters_and_buffers_and_undo_a_planted_permutation():
    torch.manual_seed(0)
    model = nontrivial(build_model("mlp", in_dim=10, hidden=[8, 6], norm="batch"))
    spec = permutation_spec(model)
    a = model.state_dict()
    planted = Permutation.random(spec, 1)
    b = {k: v.clone() for k, v in planted.apply(a).items()}
    b["layers.0.weight"] += 0.5  # a known difference left after undoing the permutation
    d = l2_distances(a, b, planted.inverse())
    assert d.per_tensor["layers.0.weight"][1] == pytest.approx(0.5 * math.sqrt(80), rel=1e-6)
    assert d.parameters[1] == pytest.approx(0.5 * math.sqrt(80), rel=1e-6)
    assert d.buffers[1] == pytest.approx(0.0, abs=1e-12)
    assert d.buffers[0] > 0 and d.parameters[0] > d.parameters[1]
    total_before = math.hypot(d.parameters[0], d.buffers[0])
    assert total_before == pytest.approx(params_distance(a, b), rel=1e-7)
    assert "norms.0.num_batches_tracked" not in d.per_tensor
    names = {k for k, _ in model.named_buffers() if "running" in k}
    assert l2_distances(a, b, planted.inverse(), buffers=names) == d
    same = l2_distances(a, b)
    assert all(before == after for before, after in same.per_tensor.values())
    with pytest.raises(SpecError, match="buffers not in"):
        l2_distances(a, b, buffers=["nope"])
