"""Loss, accuracy and logits of any parameter set, and the checks on what is evaluated."""

import pytest
import torch

from lmckit.errors import DataError, ParamsError
from lmckit.metrics import evaluate, predict


def test_predict_and_evaluate_agree(digits_pair, digits):
    model, a, _ = digits_pair
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


def test_labels_and_params_that_do_not_fit_are_named(digits_pair):
    model, a, _ = digits_pair
    x = torch.randn(4, 64)
    with pytest.raises(DataError, match=r"labels range over \[0, 12\] but the model has 10"):
        evaluate(model, a, [(x, torch.tensor([0, 1, 2, 12]))])
    with pytest.raises(DataError, match="labels of shape"):
        evaluate(model, a, [(x, torch.zeros(4, 2, dtype=torch.long))])
    with pytest.raises(ParamsError, match="missing"):
        evaluate(model, {k: v for k, v in a.items() if k != "layers.0.bias"}, [(x, x[:, 0])])
