"""Loss on the plane through three models."""

import pytest

from lmckit.analysis import plane_landscape
from lmckit.errors import ParamsError
from lmckit.metrics import evaluate


def test_plane_landscape_passes_through_the_three_models(three, digits):
    model, params = three
    test = digits.loader("test", batch_size=360)
    events = []
    land = plane_landscape(model, params, test, resolution=5, margin=0.0, progress=events.append)
    assert land.points[0] == (0.0, 0.0) and land.points[1][1] == 0.0
    assert land.loss[0][0] == pytest.approx(evaluate(model, params[0], test).loss, rel=1e-4)
    assert [e.step for e in events] == list(range(1, 26)) and events[0].total == 25
    with pytest.raises(ParamsError, match="exactly 3"):
        plane_landscape(model, params[:2], test)
    with pytest.raises(ParamsError, match="resolution"):
        plane_landscape(model, params, test, resolution=1)
