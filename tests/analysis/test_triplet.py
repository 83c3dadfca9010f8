"""Three models aligned to one: R and midpoint barriers for the three pairs."""

import pytest
import torch

from lmckit.analysis.spectral import alignment
from lmckit.analysis.triplet import PAIRS, three_models
from lmckit.match import weight_matching
from lmckit.models import permutation_spec
from lmckit.perm import Permutation


def test_copies_undone_exactly_are_one_model(three):
    model, params = three
    spec = permutation_spec(model)
    a = params[0]
    qb, qc = Permutation.random(spec, 1), Permutation.random(spec, 2)
    loader = [(torch.randn(50, 64), torch.randint(0, 10, (50,)))]
    exact = three_models(
        spec, model, a, qb.apply(a), qc.apply(a), qb.inverse(), qc.inverse(), loader
    )
    for pair in PAIRS:
        assert exact.R[pair] == pytest.approx(1.0, abs=1e-9)
        assert exact.loss_barrier[pair] == pytest.approx(0.0, abs=1e-5)
        assert exact.accuracy_barrier[pair] == pytest.approx(0.0, abs=1e-9)
    ident = Permutation.identity(spec)
    wrong = three_models(spec, model, a, qb.apply(a), qc.apply(a), ident, ident, loader)
    assert all(wrong.R[p] < 0.9 for p in PAIRS)


def test_weight_matching_aligns_b_and_c_through_a(three, digits):
    model, (a, b, c) = three
    spec = permutation_spec(model)
    pb = weight_matching(spec, a, b, seed=0).perm
    pc = weight_matching(spec, a, c, seed=0).perm
    result = three_models(spec, model, a, b, c, pb, pc, digits.loader("test", batch_size=360))
    unaligned = alignment(spec, b, c, gamma=0.3).total
    # the pair that was never matched directly is aligned better than unmatched models are
    assert result.R["b-c"] > unaligned + 0.05
    assert result.R["a-b"] > result.R["b-c"] and result.R["a-c"] > result.R["b-c"]
    assert result.R["b-c"] == pytest.approx(
        alignment(spec, pb.apply(b), pc.apply(c), gamma=0.3).total, abs=1e-12
    )
