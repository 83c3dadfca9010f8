"""No public matcher, merger, evaluation or analysis function changes what it is given:
the module's train/eval modes (of every submodule), its tensors, their ``requires_grad``
flags and gradients, and the parameter dicts passed in."""

import pytest
import torch

from lmckit.analysis import (
    alignment,
    exact_weighted_hessian_trace,
    l2_distances,
    multi_model_metrics,
    operator_spectra,
    plane_landscape,
    sharpness,
    singular_vector_cosines,
    taylor_barrier,
    three_models,
)
from lmckit.evaluate import (
    bn_reset,
    channel_statistics,
    evaluate,
    interpolate,
    predict,
    repair,
)
from lmckit.match import (
    WeightMatcher,
    activation_matching,
    sinkhorn_matching,
    ste_matching,
    weight_matching,
    weight_matching_reference,
)
from lmckit.merge import ccmm, merge_many, star, ste_mm
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation

FAST = {"epochs": 1, "batch_size": 512}


def held_out(data):
    return data.loader("test", batch_size=180)


CALLS = {
    "weight_matching": lambda m, s, p, d: weight_matching(s, p[0], p[1], restarts=2),
    "weight_matching_reference": lambda m, s, p, d: weight_matching_reference(s, p[0], p[1]),
    "WeightMatcher.match": lambda m, s, p, d: WeightMatcher(s, p[1]).match(p[0]),
    "activation_matching": lambda m, s, p, d: activation_matching(s, p[0], p[1], model=m, data=d),
    "ste_matching": lambda m, s, p, d: ste_matching(s, p[0], p[1], model=m, data=d, **FAST),
    "sinkhorn_matching[l2]": lambda m, s, p, d: sinkhorn_matching(s, p[0], p[1], steps=5),
    "sinkhorn_matching[mid]": lambda m, s, p, d: sinkhorn_matching(
        s, p[0], p[1], objective="mid", model=m, data=d, **FAST
    ),
    "star[wm]": lambda m, s, p, d: star(s, p, model=m, data=d),
    "star[ste]": lambda m, s, p, d: star(s, p, model=m, data=d, method="ste", **FAST),
    "merge_many": lambda m, s, p, d: merge_many(s, p, model=m, data=d),
    "ste_mm": lambda m, s, p, d: ste_mm(s, p, model=m, data=d, **FAST),
    "ccmm": lambda m, s, p, d: ccmm(s, p, model=m, data=d, max_iter=3),
    "evaluate": lambda m, s, p, d: evaluate(m, p[0], held_out(d)),
    "evaluate[own weights]": lambda m, s, p, d: evaluate(m, None, held_out(d)),
    "predict": lambda m, s, p, d: predict(m, p[0], held_out(d)),
    "interpolate": lambda m, s, p, d: interpolate(
        m, p[0], p[1], {"test": held_out(d)}, lambdas=3, calibrated=True, ensemble=True
    ),
    "interpolate[bn_reset]": lambda m, s, p, d: interpolate(
        m, p[0], p[1], {"test": held_out(d)}, lambdas=3, bn_reset_data=d
    ),
    "bn_reset": lambda m, s, p, d: bn_reset(m, p[0], d),
    "multi_model_metrics": lambda m, s, p, d: multi_model_metrics(
        m, p, [Permutation.identity(s)] * 3, held_out(d), bn_reset_data=d
    ),
    "plane_landscape": lambda m, s, p, d: plane_landscape(
        m, p, held_out(d), resolution=2, bn_reset_data=d
    ),
    "sharpness": lambda m, s, p, d: sharpness(m, p[0], held_out(d), probes=2, n_batches=1),
    "exact_weighted_hessian_trace": lambda m, s, p, d: exact_weighted_hessian_trace(
        m, p[0], held_out(d), n_batches=1
    ),
    "alignment": lambda m, s, p, d: alignment(s, p[0], p[1], Permutation.random(s, 0), gamma=0.3),
    "singular_vector_cosines": lambda m, s, p, d: singular_vector_cosines(s, p[0], p[1], k=4),
    "l2_distances": lambda m, s, p, d: l2_distances(p[0], p[1], Permutation.random(s, 0)),
    "operator_spectra": lambda m, s, p, d: operator_spectra(m, p[0], d.test_x[:2]),
    "taylor_barrier": lambda m, s, p, d: taylor_barrier(m, p[0], p[1], held_out(d), n_batches=1),
    "three_models": lambda m, s, p, d: three_models(
        s,
        m,
        p[0],
        p[1],
        p[2],
        Permutation.identity(s),
        Permutation.identity(s),
        held_out(d),
        bn_reset_data=d,
    ),
}
# REPAIR is for networks without normalisation layers.
REPAIR_CALLS = {
    "repair": lambda m, s, p, d: repair(m, p[0], p[1], 0.5, d),
    "channel_statistics": lambda m, s, p, d: channel_statistics(m, p[0], d, ["layers.0"]),
    "interpolate[repair]": lambda m, s, p, d: interpolate(
        m, p[0], p[1], {"test": held_out(d)}, lambdas=3, repair_data=d
    ),
}


def set_mode(model, mode):
    if mode == "mixed":
        model.train()
        for m in list(model.modules())[1::2]:
            m.eval()
    else:
        model.train(mode == "train")


def snapshot(model, params_list):
    return {
        "modes": [m.training for m in model.modules()],
        "module": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [p.grad for p in model.parameters()],
        "inputs": [{k: v.detach().clone() for k, v in p.items()} for p in params_list],
        "input_flags": [{k: v.requires_grad for k, v in p.items()} for p in params_list],
    }


def check(case, calls, norm, mode, digits):
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=64, hidden=[16, 12], norm=norm) for _ in range(3)]
    model = models[0]
    spec = permutation_spec(model)
    # the first dict is the module's own live state_dict: anything written to it shows
    params = [model.state_dict(keep_vars=True), *(m.state_dict() for m in models[1:])]
    set_mode(model, mode)
    before = snapshot(model, params)
    calls[case](model, spec, params, digits)
    after = snapshot(model, params)
    assert after["modes"] == before["modes"], "module modes changed"
    assert after["requires_grad"] == before["requires_grad"], "requires_grad changed"
    assert all(g is None for g in after["grads"]), "gradients were written to the module"
    for k, v in before["module"].items():
        assert torch.equal(after["module"][k], v), f"module tensor {k} changed"
    for i, (x, y) in enumerate(zip(before["inputs"], after["inputs"], strict=True)):
        for k in x:
            assert torch.equal(x[k], y[k]), f"input {i} tensor {k} changed"
    assert after["input_flags"] == before["input_flags"]


@pytest.mark.parametrize("mode", ["train", "eval", "mixed"])
@pytest.mark.parametrize("case", list(CALLS))
def test_functions_leave_batchnorm_models_and_inputs_as_they_were(case, mode, digits):
    check(case, CALLS, "batch", mode, digits)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("case", list(REPAIR_CALLS))
def test_repair_leaves_models_and_inputs_as_they_were(case, mode, digits):
    check(case, REPAIR_CALLS, None, mode, digits)
