"""Temperature calibration and ECE against generated data with a known temperature."""

import pytest
import torch

from lmckit.errors import ParamsError
from lmckit.evaluate import calibrated_loss, calibration_metrics, fit_temperature


def sample(beta, n=20000, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, classes, generator=g)
    labels = torch.multinomial((beta * z).softmax(-1), 1, generator=g).squeeze(1)
    return z, labels


def test_fit_temperature_recovers_the_generating_temperature():
    z, labels = sample(0.4)
    assert fit_temperature(z, labels) == pytest.approx(0.4, rel=0.05)


def test_calibrated_loss_is_fitted_on_held_out_examples_only():
    z, labels = sample(0.4, n=5000)
    result = calibrated_loss(z, labels, fraction=0.2, seed=3)
    held, rest = result["held"], result["rest"]
    assert len(set(held.tolist()) & set(rest.tolist())) == 0
    assert sorted(held.tolist() + rest.tolist()) == list(range(5000))
    assert len(held) == 1000
    beta = fit_temperature(z[held], labels[held])
    assert result["temperature"] == pytest.approx(1 / beta)
    # changing the evaluation examples' labels cannot change the fitted temperature
    scrambled = labels.clone()
    scrambled[rest] = (scrambled[rest] + 1) % 5
    assert (
        calibrated_loss(z, scrambled, fraction=0.2, seed=3)["temperature"] == result["temperature"]
    )
    with pytest.raises(ParamsError, match="fraction"):
        calibrated_loss(z, labels, fraction=1.0)


def test_calibration_metrics():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5000, 4, generator=g)
    labels = torch.multinomial(z.softmax(-1), 1, generator=g).squeeze(1)
    calibrated = calibration_metrics(z, labels)
    overconfident = calibration_metrics(10 * z, labels)
    assert calibrated["ece"] < 0.03 < overconfident["ece"]
    assert sum(b["count"] for b in calibrated["bins"]) == 5000


def test_ece_is_the_count_weighted_gap_of_the_bins():
    """Four examples, two confidence bins, worked out by hand."""
    import math

    def logit(p):  # two classes: softmax([z, 0]) gives class 0 probability p
        return [math.log(p / (1 - p)), 0.0]

    logits = torch.tensor([logit(0.9), logit(0.9), logit(0.9), logit(0.62)], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 0])  # the 0.9 bin is right 2 of 3 times, the 0.62 bin 1/1
    expected = 3 / 4 * abs(0.9 - 2 / 3) + 1 / 4 * abs(0.62 - 1.0)
    result = calibration_metrics(logits, labels)
    assert result["ece"] == pytest.approx(expected)
    counts = [b["count"] for b in result["bins"] if b["count"]]
    assert sorted(counts) == [1, 3]
