"""STE-MM: simplex weights and the multi-model straight-through estimator."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.merge import ste_mm
from lmckit.merge.ste_mm import simplex_weights
from tests.merge.common import random_models


def test_simplex_weights():
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([simplex_weights(3, g) for _ in range(4000)])
    assert torch.allclose(draws.sum(1), torch.ones(4000, dtype=torch.float64))
    assert (draws > 0).all()
    assert draws[:, 0].mean().item() == pytest.approx(1 / 3, abs=0.02)
    # Dirichlet(1,1,1): each coordinate is Beta(1, 2) with variance 1/18
    assert draws[:, 0].var().item() == pytest.approx(1 / 18, rel=0.1)
    with pytest.raises(ParamsError):
        simplex_weights(3, g, "gaussian")


def test_ste_mm_reports_every_step_and_checks_its_options(digits):
    model, spec, params = random_models(3)
    events = []
    result = ste_mm(
        spec, params, model=model, data=digits, epochs=1, batch_size=256, progress=events.append
    )
    steps = len(digits.loader("train", batch_size=256))
    assert result.iterations == steps and [e.step for e in events] == list(range(1, steps + 1))
    assert len(result.history) == 1
    with pytest.raises(ParamsError, match="weights must be"):
        ste_mm(spec, params, model=model, data=digits, weights="gaussian")
    with pytest.raises(ParamsError, match="epochs"):
        ste_mm(spec, params, model=model, data=digits, epochs=0)
