"""Every long computation reports one kind of event, in order, with honest totals."""

import pytest

from lmckit.evaluate import interpolate
from lmckit.match import METHODS as MATCHERS
from lmckit.match import TRANSFORM_METHODS
from lmckit.merge import METHODS as MERGERS
from lmckit.progress import Progress, notify
from tests.merge.common import random_models, transformer_models


def check_stream(events):
    assert events and all(isinstance(e, Progress) for e in events)
    steps = [e.step for e in events]
    assert steps == sorted(steps) and steps[0] >= 1
    for e in events:
        assert e.total is None or e.step <= e.total
        assert all(isinstance(k, str) for k in e.metrics)


def test_notify_sends_only_when_asked():
    seen = []
    notify(None, 1, 2, loss=0.5)
    notify(seen.append, 1, 2, loss=0.5)
    assert seen == [Progress(1, 2, {"loss": 0.5})]


@pytest.mark.parametrize("name", list(MATCHERS))
def test_matchers_report_progress(name, digits):
    model, spec, params = random_models(2)
    if name in TRANSFORM_METHODS:  # maps beyond permutations: a transformer (MLPs refuse)
        model, spec, params, digits = transformer_models(2)
    events = []
    options = {"epochs": 1} if "epochs" in MATCHERS[name].options() else {}
    if "steps" in MATCHERS[name].options():  # Sinkhorn's 1,000 default steps: 13 s here
        options["steps"] = 40
    data = digits if MATCHERS[name].needs_data or name in TRANSFORM_METHODS else None
    MATCHERS[name](
        spec, params[0], params[1], model=model, data=data, progress=events.append, **options
    )
    check_stream(events)


@pytest.mark.parametrize("name", list(MERGERS))
def test_mergers_report_progress(name, digits):
    model, spec, params = random_models(3)
    if name == "merge-many-orth":  # rotations: a transformer (MLPs refuse)
        model, spec, params, digits = transformer_models(3)
    events = []
    options = {"epochs": 1} if "epochs" in MERGERS[name].options() else {}
    if "max_rounds" in MERGERS[name].options():
        options["max_rounds"] = 2  # a stream of progress, not convergence
    if MERGERS[name].needs_sizes:
        options["sizes"] = [10, 20, 30]
    MERGERS[name](spec, params, model=model, data=digits, progress=events.append, **options)
    check_stream(events)


def test_interpolation_reports_each_lambda(digits_pair, digits):
    model, a, b = digits_pair
    events = []
    interpolate(model, a, b, {"test": digits.loader("test")}, lambdas=4, progress=events.append)
    check_stream(events)
    assert [(e.step, e.total) for e in events] == [(1, 4), (2, 4), (3, 4), (4, 4)]
