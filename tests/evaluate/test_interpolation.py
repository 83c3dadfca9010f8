"""Interpolation curves and barriers: exact endpoints, zero self-barrier, closed-form
barriers, REPAIR and BN reset at every interior λ, curve files."""

import json

import pytest
import torch
from safetensors import safe_open

from lmckit.errors import ParamsError
from lmckit.evaluate import (
    barriers,
    evaluate,
    interpolate,
    lambda_grid,
    load_curves,
    repair,
    save_curves,
)
from lmckit.match import weight_matching
from lmckit.models import permutation_spec
from lmckit.params import lerp_params
from tests.conftest import clone


def loaders(data):
    return {
        "train": data.loader("train", batch_size=500, shuffle=False),
        "test": data.loader("test", batch_size=500),
    }


class CountingLoader:
    """Batches of a loader, counting the passes made over them."""

    def __init__(self, loader):
        self.loader, self.passes = loader, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.loader)


def test_barrier_of_a_model_with_itself_is_exactly_zero(digits_pair, digits):
    model, a, _ = digits_pair
    curve = interpolate(model, a, a, loaders(digits), lambdas=7, calibrated=True, ensemble=True)
    for split in ("train", "test"):
        for metric in ("loss", "accuracy", "calibrated_loss"):
            assert curve.barriers[split][metric] == {"rebasin": 0.0, "convex": 0.0}


def test_every_point_is_the_model_at_that_lambda(digits_pair, digits):
    model, a, b = digits_pair
    curve = interpolate(model, a, b, loaders(digits), lambdas=5, ensemble=True)
    assert curve.lambdas == [0.0, 0.25, 0.5, 0.75, 1.0]
    for split, loader in loaders(digits).items():
        for i, lam in enumerate(curve.lambdas):
            m = evaluate(model, lerp_params(a, b, lam), loader)
            assert curve.splits[split]["loss"][i] == pytest.approx(m.loss, rel=1e-6)
            assert curve.splits[split]["accuracy"][i] == m.accuracy
        assert curve.splits[split]["ensemble_accuracy"][0] == curve.splits[split]["accuracy"][0]


def test_class_group_accuracy_is_the_accuracy_on_those_examples(digits_pair, digits):
    from lmckit.data import TensorLoader
    from lmckit.evaluate import calibration_metrics
    from lmckit.metrics import predict

    model, a, b = digits_pair
    groups = {"low": [0, 1, 2, 3, 4], "nine": [9]}
    test = {"test": digits.loader("test", batch_size=500)}
    curve = interpolate(model, a, b, test, lambdas=5, ensemble=True, class_groups=groups)
    y = digits.test_y
    for i, lam in enumerate(curve.lambdas):
        for group, classes in groups.items():
            mask = torch.isin(y, torch.tensor(classes))
            sub = TensorLoader(digits.test_x[mask], y[mask], batch_size=500)
            m = evaluate(model, lerp_params(a, b, lam), sub)
            assert curve.splits["test"][f"accuracy[{group}]"][i] == pytest.approx(m.accuracy)
    ends = curve.splits["test"]
    assert ends["ensemble_accuracy[low]"][0] == ends["accuracy[low]"][0]
    best = min(range(5), key=lambda i: ends["loss"][i])
    diagrams = curve.info["reliability"]["test"]
    assert set(diagrams) == {str(curve.lambdas[i]) for i in {0, 4, best}}
    logits, labels = predict(model, a, test["test"])
    expected = calibration_metrics(logits, labels)["bins"]
    assert json.dumps(diagrams["0.0"]) == json.dumps(expected)  # NaN in empty bins


def test_matching_lowers_the_barrier(digits_pair, digits):
    model, a, b = digits_pair
    spec = permutation_spec(model)
    naive = interpolate(model, a, b, loaders(digits), lambdas=9)
    aligned = weight_matching(spec, a, b).perm.apply(b)
    matched = interpolate(model, a, aligned, loaders(digits), lambdas=9)
    assert matched.barriers["test"]["loss"]["rebasin"] < naive.barriers["test"]["loss"]["rebasin"]


def test_barrier_definitions():
    lams = [0.0, 0.5, 1.0]
    assert barriers(lams, [1.0, 3.0, 2.0], higher_is_better=False) == {
        "rebasin": 1.5,
        "convex": 1.5,
    }
    up = barriers(lams, [0.0, 1.0, 4.0], higher_is_better=False)
    assert up["rebasin"] == 2.0 and up["convex"] == 0.0  # a rising line has no convex barrier
    acc = barriers(lams, [0.9, 0.5, 0.8], higher_is_better=True)
    assert acc["rebasin"] == pytest.approx(0.85 - 0.5) and acc["convex"] == pytest.approx(0.35)


def test_repair_is_fitted_at_each_lambda_from_endpoints_measured_once(digits_pair, digits):
    model, a, b = digits_pair
    b = weight_matching(permutation_spec(model), a, b).perm.apply(b)
    data = CountingLoader(digits.loader("train", batch_size=500, shuffle=False))
    test = {"test": digits.loader("test", batch_size=360)}
    curve = interpolate(model, a, b, test, lambdas=[0.0, 0.3, 0.6, 1.0], repair_data=data)
    # two passes for the endpoints, then one per hidden layer (2) per interior λ (2)
    assert data.passes == 2 + 2 * 2
    for i, lam in enumerate(curve.lambdas[1:-1], start=1):
        direct = repair(model, a, b, lam, data)
        assert curve.splits["test"]["loss"][i] == pytest.approx(
            evaluate(model, direct, test["test"]).loss, rel=1e-6
        )


def test_lambda_grids_are_checked():
    assert lambda_grid(3) == [0.0, 0.5, 1.0]
    assert lambda_grid([0, 0.1, 1]) == [0.0, 0.1, 1.0]
    for bad in (1, 0, -3, True, [0.2, 1.0], [0.0, 0.5, 0.5, 1.0], [0.0, float("nan"), 1.0], "x"):
        with pytest.raises(ParamsError, match="lambdas"):
            lambda_grid(bad)


def test_interpolate_needs_loaders_and_one_statistics_fix(digits_pair, digits):
    model, a, b = digits_pair
    with pytest.raises(ParamsError, match="needs loaders"):
        interpolate(model, a, b, {})
    with pytest.raises(ParamsError, match="not both"):
        interpolate(model, a, b, loaders(digits), bn_reset_data=digits, repair_data=digits)


def test_curves_round_trip_through_their_files(digits_pair, digits, tmp_path):
    model, a, b = digits_pair
    curve = interpolate(model, a, b, loaders(digits), lambdas=3, calibrated=True)
    json_path, csv_path = save_curves({"naive": curve}, tmp_path / "curves")
    assert load_curves(json_path)["naive"].to_dict() == curve.to_dict()
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "curve,split,metric,lambda,value"
    assert len(rows) == 1 + 3 * 2 * len(curve.splits["test"])
    with pytest.raises(ParamsError, match="cannot read curves"):
        load_curves(tmp_path / "missing.json")
    assert torch.is_tensor(digits.test_x)


class Stop(Exception):
    pass


def stop_after(points):
    """A progress callback that stops the curve once ``points`` points are done."""

    def callback(p):
        if p.step == points:
            raise Stop

    return callback


@pytest.fixture(scope="module")
def bn_pair(digits):
    from tests.zoo import train_mlp

    a, b = (train_mlp(digits, s, hidden=(32, 32), epochs=3, norm="batch") for s in (0, 1))
    return a, clone(a.state_dict()), clone(b.state_dict())


@pytest.mark.parametrize("case", ["bn-reset", "calibrated-ensemble"])
def test_an_interrupted_curve_goes_on_from_its_last_saved_point(
    case, digits_pair, bn_pair, digits, tmp_path
):
    from lmckit.resume import saved_progress

    model, a, b = bn_pair if case == "bn-reset" else digits_pair
    options = (
        {"bn_reset_data": digits, "bn_reset_batches": 2}
        if case == "bn-reset"
        else {"calibrated": True, "ensemble": True}
    )
    whole = interpolate(model, a, b, loaders(digits), lambdas=7, seed=3, **options)
    path = tmp_path / "curve.resume"
    with pytest.raises(Stop):
        interpolate(
            model, a, b, loaders(digits), lambdas=7, seed=3, **options,
            resume=path, resume_every=0, progress=stop_after(4),
        )  # fmt: skip
    # stopped in point 4's progress report, before its save
    assert saved_progress(path)["epoch"] == 3 and saved_progress(path)["unit"] == "point"
    counted = {split: CountingLoader(loader) for split, loader in loaders(digits).items()}
    steps = []
    resumed = interpolate(
        model, a, b, counted, lambdas=7, seed=3, **options,
        resume=path, resume_every=0, progress=lambda p: steps.append(p.step),
    )  # fmt: skip
    assert resumed.to_dict() == whole.to_dict()
    assert steps == [4, 5, 6, 7]  # only the points after those saved
    assert all(c.passes == 4 for c in counted.values())
    assert saved_progress(path)["epoch"] == 6  # the last point saves none


def test_a_curve_refuses_a_resume_file_of_another_curve(digits_pair, digits, tmp_path):
    from lmckit.resume import ResumeError, load_resume_state, save_resume_state

    model, a, b = digits_pair
    path = tmp_path / "curve.resume"
    kwargs = {"resume": path, "resume_every": 0, "progress": stop_after(2)}
    with pytest.raises(Stop):
        interpolate(model, a, b, loaders(digits), lambdas=5, **kwargs)
    with pytest.raises(ResumeError, match="params_b"):
        interpolate(model, a, a, loaders(digits), lambdas=5, resume=path)
    with pytest.raises(ResumeError, match=r"interpolate\.lambdas"):
        interpolate(model, a, b, loaders(digits), lambdas=6, resume=path)
    shuffled = {**loaders(digits), "test": digits.loader("test", batch_size=500, shuffle=True)}
    with pytest.raises(ResumeError, match="other labels for split 'test'"):
        interpolate(model, a, b, shuffled, lambdas=5, resume=path)
    # a file whose record was edited is refused, not half-trusted
    with pytest.raises(Stop):
        interpolate(model, a, b, loaders(digits), lambdas=5, **kwargs)
    with safe_open(str(path), framework="pt") as f:
        fingerprint = json.loads(f.metadata()["fingerprint"])
    tensors, info = load_resume_state(path, fingerprint)
    for edit, why in (
        ({"epoch": 9}, "records 9 of 5 points done"),
        ({"unit": None}, "records 1 of 5 points done"),
        ({"seconds": "soon"}, "records 'soon' seconds"),
    ):
        save_resume_state(path, tensors, {**info, **edit}, fingerprint)
        with pytest.raises(ResumeError, match=why):
            interpolate(model, a, b, loaders(digits), lambdas=5, resume=path)
    save_resume_state(
        path,
        {k: v for k, v in tensors.items() if k != "logits/test/0"},
        info,
        fingerprint,
    )
    with pytest.raises(ResumeError, match="lacks logits/test/0"):
        interpolate(model, a, b, loaders(digits), lambdas=5, resume=path)
