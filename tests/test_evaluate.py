"""Interpolation, barriers, BN reset, REPAIR, calibration, plots."""

import json

import pytest
import torch

from lmckit.data import load_dataset
from lmckit.errors import ParamsError
from lmckit.evaluate import (
    barriers,
    bn_reset,
    calibration_metrics,
    evaluate,
    fit_temperature,
    interpolate,
    lerp_params,
    repair,
)
from lmckit.match import weight_matching
from lmckit.models import permutation_spec
from lmckit.plots import plot_barriers, plot_interpolation
from lmckit.train import TrainConfig, init_model, train


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def trained(config, seed, data, epochs=6):
    model = init_model("mlp", {"in_dim": 64, "out_dim": 10, **config}, seed)
    train(
        model,
        data,
        TrainConfig(epochs=epochs, batch_size=64, lr=3e-3, seed=seed),
        evaluate_each_epoch=False,
    )
    return model


@pytest.fixture(scope="module")
def pair(digits):
    a = trained({"hidden": [64, 64]}, 0, digits)
    b = trained({"hidden": [64, 64]}, 1, digits)
    return a, a.state_dict(), b.state_dict()


def loaders(data):
    return {
        "train": data.loader("train", batch_size=500, shuffle=False),
        "test": data.loader("test", batch_size=500),
    }


def test_lerp_is_exact_at_endpoints_and_for_identical_models(pair):
    _, a, b = pair
    for k in a:
        assert torch.equal(lerp_params(a, b, 0.0)[k], a[k])
        assert torch.equal(lerp_params(a, b, 1.0)[k], b[k])
        assert torch.equal(lerp_params(a, a, 0.37)[k], a[k])


def test_barrier_of_a_model_with_itself_is_exactly_zero(pair, digits):
    model, a, _ = pair
    curve = interpolate(model, a, a, 7, loaders(digits), calibrated=True, ensemble=True)
    for split in ("train", "test"):
        for metric in ("loss", "accuracy", "calibrated_loss"):
            assert curve.barriers[split][metric] == {"rebasin": 0.0, "convex": 0.0}


def test_endpoints_reproduce_the_models_metrics(pair, digits):
    model, a, b = pair
    curve = interpolate(model, a, b, 5, loaders(digits), ensemble=True)
    for split, loader in loaders(digits).items():
        ma, mb = evaluate(model, a, loader), evaluate(model, b, loader)
        assert curve.splits[split]["loss"][0] == pytest.approx(ma.loss, rel=1e-6)
        assert curve.splits[split]["accuracy"][0] == ma.accuracy
        assert curve.splits[split]["loss"][-1] == pytest.approx(mb.loss, rel=1e-6)
        assert curve.splits[split]["accuracy"][-1] == mb.accuracy
        assert curve.splits[split]["ensemble_accuracy"][0] == ma.accuracy
    assert curve.lambdas == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_matching_lowers_the_barrier(pair, digits):
    model, a, b = pair
    spec = permutation_spec(model)
    naive = interpolate(model, a, b, 9, loaders(digits))
    matched = interpolate(model, a, weight_matching(spec, a, b).perm.apply(b), 9, loaders(digits))
    assert matched.barriers["test"]["loss"]["rebasin"] < naive.barriers["test"]["loss"]["rebasin"]


def test_barrier_definitions():
    lams = [0.0, 0.5, 1.0]
    assert barriers(lams, [1.0, 3.0, 2.0], higher_is_better=False) == {
        "rebasin": 1.5,
        "convex": 1.5,
    }
    up = barriers(lams, [0.0, 1.0, 4.0], higher_is_better=False)
    assert (
        up["rebasin"] == 2.0 and up["convex"] == 0.0
    )  # a straight rising line has no convex barrier
    acc = barriers(lams, [0.9, 0.5, 0.8], higher_is_better=True)
    assert acc["rebasin"] == pytest.approx(0.85 - 0.5) and acc["convex"] == pytest.approx(0.35)


def test_bn_reset_restores_a_model_with_corrupted_statistics(digits):
    model = trained({"hidden": [64, 64], "norm": "batch"}, 0, digits)
    params = model.state_dict()
    test = digits.loader("test", batch_size=360)
    good = evaluate(model, params, test).accuracy
    broken = dict(params)
    for k in params:
        if k.endswith("running_mean"):
            broken[k] = params[k] + 3.0
        if k.endswith("running_var"):
            broken[k] = params[k] * 25
    bad = evaluate(model, broken, test).accuracy
    fixed = bn_reset(model, broken, digits.loader("train", batch_size=128))
    assert bad < good - 0.2
    assert evaluate(model, fixed, test).accuracy >= good - 0.02
    assert torch.equal(fixed["layers.0.weight"], params["layers.0.weight"])
    assert torch.equal(broken["norms.0.running_mean"], params["norms.0.running_mean"] + 3.0)


def test_repair_restores_interpolated_channel_statistics(pair, digits):
    from lmckit.evaluate import _channel_stats

    model, a, b = pair
    spec = permutation_spec(model)
    b = weight_matching(spec, a, b).perm.apply(b)
    loader = digits.loader("train", batch_size=500, shuffle=False)
    fixed = repair(model, a, b, 0.5, loader)
    for layer in ("layers.0", "layers.1"):
        ma, sa = _channel_stats(model, a, loader, layer, None)
        mb, sb = _channel_stats(model, b, loader, layer, None)
        mf, sf = _channel_stats(model, fixed, loader, layer, None)
        assert torch.allclose(mf, (ma + mb) / 2, atol=1e-3)
        assert torch.allclose(sf, (sa + sb) / 2, atol=1e-3, rtol=1e-3)
    bn_model = init_model("mlp", {"in_dim": 64, "hidden": [8], "norm": "batch"}, 0)
    with pytest.raises(ParamsError, match="use bn_reset"):
        repair(bn_model, bn_model.state_dict(), bn_model.state_dict(), 0.5, loader)


def test_fit_temperature_recovers_the_generating_temperature():
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(20000, 5, generator=g)
    beta = 0.4
    labels = torch.multinomial((beta * z).softmax(-1), 1, generator=g).squeeze(1)
    assert fit_temperature(z, labels) == pytest.approx(beta, rel=0.05)


def test_calibration_metrics():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5000, 4, generator=g)
    labels = torch.multinomial(z.softmax(-1), 1, generator=g).squeeze(1)
    calibrated = calibration_metrics(z, labels)
    overconfident = calibration_metrics(10 * z, labels)
    assert calibrated["ece"] < 0.03 < overconfident["ece"]
    assert sum(b["count"] for b in calibrated["bins"]) == 5000


def test_interpolate_needs_loaders(pair):
    model, a, b = pair
    with pytest.raises(ParamsError, match="needs loaders"):
        interpolate(model, a, b, 3, {})
    with pytest.raises(ParamsError, match="from 0 to 1"):
        interpolate(model, a, b, [0.2, 0.5, 1.0], {"test": [(torch.zeros(1, 64), torch.zeros(1))]})


def test_plots_write_png_and_data(pair, digits, tmp_path):
    model, a, b = pair
    curve = interpolate(model, a, b, 5, loaders(digits), ensemble=True, calibrated=True)
    png = plot_interpolation({"naive": curve}, tmp_path / "curve.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "curve.json").read_text())
    assert data["naive"]["lambdas"] == curve.lambdas
    rows = (tmp_path / "curve.csv").read_text().splitlines()
    assert rows[0] == "curve,split,metric,lambda,value" and len(rows) > 5 * 2 * 4
    bars = plot_barriers({"naive": {"loss": 1.0, "accuracy": 0.1}}, tmp_path / "bars.png")
    assert (
        bars.exists() and json.loads((tmp_path / "bars.json").read_text())["naive"]["loss"] == 1.0
    )


def test_demo_falls_back_to_digits_and_says_so(monkeypatch):
    import lmckit.experiments.demo as demo

    monkeypatch.setattr(demo, "fashion_mnist_available", lambda: False)
    said = []
    data = demo.choose_dataset(None, said.append)
    assert data.name == "digits"
    assert "apt-get install dataset-fashion-mnist" in said[0] and "digits" in said[0]


def test_predict_and_evaluate_agree(pair, digits):
    from lmckit.errors import DataError
    from lmckit.evaluate import predict

    model, a, _ = pair
    test = digits.loader("test", batch_size=100)
    logits, labels = predict(model, a, test)
    assert logits.shape == (360, 10) and labels.shape == (360,)
    metrics = evaluate(model, a, test)
    assert metrics.accuracy == (logits.argmax(1) == labels).double().mean().item()
    assert metrics.loss == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item())
    assert evaluate(model, None, test) == metrics  # the module's own weights are `a`
    with pytest.raises(DataError, match="empty loader"):
        evaluate(model, a, [])
    with pytest.raises(DataError, match="empty loader"):
        predict(model, a, [])
