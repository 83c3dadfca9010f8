"""Bad input to the Python API: every case an LmcError whose message names the culprit,
never a traceback from deep inside torch."""

import warnings

import pytest
import torch

from lmckit import LmcError, Permutation, PermutationSpec
from lmckit.analysis import distance_ratios, multi_model_metrics, plane_landscape, sharpness
from lmckit.analysis.spectral import singular_values
from lmckit.data import TensorLoader, load_dataset
from lmckit.evaluate import (
    bn_reset,
    calibration_metrics,
    evaluate,
    fit_temperature,
    interpolate,
    predict,
    repair,
)
from lmckit.match import activation_matching, sinkhorn_matching, ste_matching, weight_matching
from lmckit.merge import ccmm, merge_many, star, ste_mm
from lmckit.models import build_model, permutation_spec
from lmckit.params import average_params, lerp_params, params_distance
from lmckit.tracing import trace
from lmckit.train import TrainConfig, train

torch.manual_seed(0)
NET = build_model("mlp", in_dim=64, hidden=[8, 8], out_dim=10)
SPEC = permutation_spec(NET)
A = NET.state_dict()
B = build_model("mlp", in_dim=64, hidden=[8, 8], out_dim=10).state_dict()
BN = build_model("mlp", in_dim=64, hidden=[8], norm="batch")
BNP = BN.state_dict()
DIGITS = load_dataset("digits")
SYNTHETIC = load_dataset("synthetic")
WRONG_X = TensorLoader(torch.randn(10, 7), torch.zeros(10, dtype=torch.long), batch_size=5)
TEST = DIGITS.loader("test")
MISFIT = "a batch of shape (5, 7) does not fit MLP"
EMPTY = PermutationSpec(groups={}, axes={k: (None,) * v.ndim for k, v in A.items()})
META = {k: v.to("meta") for k, v in A.items()}
NAN = {k: v.clone() for k, v in A.items()}
NAN["layers.0.weight"][0, 0] = float("nan")
NAN_NET = build_model("mlp", in_dim=64, hidden=[8, 8], out_dim=10)
NAN_NET.load_state_dict(NAN)
with warnings.catch_warnings():  # torch: "Initializing zero-element tensors is a no-op"
    warnings.simplefilter("ignore", UserWarning)
    ZERO_WIDTH = torch.nn.Sequential(torch.nn.Linear(4, 0), torch.nn.Linear(0, 2))
HUGE = {k: v.clone() for k, v in A.items()}
HUGE["layers.0.weight"][0, 0] = 3e38  # finite, but its products overflow float32
LABEL_12 = TensorLoader(torch.randn(10, 64), torch.full((10,), 12), batch_size=5)

CASES = {
    "wm-spec-none": (lambda: weight_matching(None, A, B), "spec must be a PermutationSpec"),
    "wm-params-list": (lambda: weight_matching(SPEC, [A], B), "params_a must be a dict"),
    "wm-seed-str": (lambda: weight_matching(SPEC, A, B, seed="x"), "seed must be an integer"),
    "wm-seed-negative": (lambda: weight_matching(SPEC, A, B, seed=-1), "seed must be"),
    "wm-lap-backend": (lambda: weight_matching(SPEC, A, B, lap_backend="foo"), "backend"),
    "wm-duals": (lambda: weight_matching(SPEC, A, B, duals={"h": 3}), "duals must be a table of"),
    "wm-init-dict": (lambda: weight_matching(SPEC, A, B, init={}), "init must be a Permutation"),
    "am-data-misfit": (
        lambda: activation_matching(SPEC, A, B, model=NET, data=WRONG_X),
        MISFIT,
    ),
    "am-data-int": (lambda: activation_matching(SPEC, A, B, model=NET, data=5), "got int"),
    "am-batch-size": (
        lambda: activation_matching(SPEC, A, B, model=NET, data=DIGITS, batch_size=0),
        "batch_size",
    ),
    "ste-data-misfit": (
        lambda: ste_matching(SPEC, A, B, model=NET, data=SYNTHETIC),
        "does not fit MLP",
    ),
    "ste-eval-batches": (
        lambda: ste_matching(SPEC, A, B, model=NET, data=DIGITS, eval_batches=0),
        "eval_batches",
    ),
    "sinkhorn-iters": (lambda: sinkhorn_matching(SPEC, A, B, sinkhorn_iters=0), "sinkhorn_iters"),
    "sinkhorn-tau": (lambda: sinkhorn_matching(SPEC, A, B, tau="x"), "tau"),
    "star-reference": (lambda: star(SPEC, [A, B], reference="0"), "reference"),
    "merge-many-rounds": (lambda: merge_many(SPEC, [A, B], max_rounds=0), "max_rounds"),
    "ccmm-tol": (lambda: ccmm(SPEC, [A, B], tol=float("nan")), "tol"),
    "ste-mm-data": (lambda: ste_mm(SPEC, [A, B], model=NET), "needs data="),
    "ste-mm-lr": (lambda: ste_mm(SPEC, [A, B], model=NET, data=DIGITS, lr=0), "lr"),
    "interpolate-loaders-list": (lambda: interpolate(NET, A, B, [TEST]), "needs loaders"),
    "interpolate-loader-int": (lambda: interpolate(NET, A, B, {"test": 5}), "got int"),
    "interpolate-data-misfit": (lambda: interpolate(NET, A, B, {"test": WRONG_X}), MISFIT),
    "interpolate-fraction": (
        lambda: interpolate(NET, A, B, {"test": TEST}, calibrated=True, calibration_fraction=0),
        "fraction",
    ),
    "interpolate-mismatch": (lambda: interpolate(NET, A, BNP, {"test": TEST}), "different keys"),
    "evaluate-data-misfit": (lambda: evaluate(NET, A, WRONG_X), MISFIT),
    "evaluate-loader-int": (lambda: evaluate(NET, A, 3), "iterable of (x, y) batches"),
    "evaluate-dataset": (lambda: evaluate(NET, A, DIGITS), "data.loader('test')"),
    "predict-model-str": (lambda: predict("m", A, TEST), "model must be a torch.nn.Module"),
    "bn-reset-misfit": (lambda: bn_reset(BN, BNP, WRONG_X), "does not fit MLP"),
    "bn-reset-no-batches": (lambda: bn_reset(BN, BNP, DIGITS, n_batches=0), "no batches"),
    "bn-reset-negative-batches": (
        lambda: bn_reset(BN, BNP, DIGITS, n_batches=-1),
        "n_batches must be an integer ≥ 0, got -1",
    ),
    "repair-lambda": (lambda: repair(NET, A, B, "x", DIGITS), "lam must be a number in [0.0, 1.0]"),
    "repair-lambda-outside": (lambda: repair(NET, A, B, 2, DIGITS), "lam must be a number in"),
    "repair-misfit": (lambda: repair(NET, A, B, 0.5, WRONG_X), MISFIT),
    "lerp-mismatch": (lambda: lerp_params(A, BNP, 0.5), "different keys"),
    "average-mismatch": (lambda: average_params([A, BNP]), "only in model 0"),
    "distance-mismatch": (lambda: params_distance(A, BNP), "different keys"),
    "temperature-shapes": (
        lambda: fit_temperature(torch.randn(5, 3), torch.zeros(4, dtype=torch.long)),
        "logits (N, C) and labels (N,)",
    ),
    "ece-shapes": (
        lambda: calibration_metrics(torch.randn(5, 3), torch.zeros(4, dtype=torch.long)),
        "logits (N, C) and labels (N,)",
    ),
    "sharpness-misfit": (lambda: sharpness(NET, A, WRONG_X), MISFIT),
    "landscape-equal": (lambda: plane_landscape(NET, [A, A, A], TEST), "collinear or equal"),
    "multi-perms-none": (lambda: multi_model_metrics(NET, [A, B], None, TEST), "one permutation"),
    "geometry-empty": (lambda: distance_ratios([]), "at least 2 models"),
    "apply-list": (lambda: Permutation.identity(SPEC).apply([1]), "dict of tensors"),
    "from-dict-none": (lambda: Permutation.from_dict(None, SPEC), "expected a mapping"),
    "spec-axes-string": (lambda: PermutationSpec({"h": 3}, {"w": "h"}), "axes['w'] must be"),
    "spec-groups-list": (lambda: PermutationSpec([3], {}), "must be mappings"),
    "spec-size-str": (lambda: PermutationSpec({"h": "x"}, {"w": ("h",)}), "integer size"),
    "model-hidden-str": (lambda: build_model("mlp", hidden="abc"), "hidden must be a list of"),
    "model-hidden-digits": (lambda: build_model("mlp", hidden="16"), "hidden must be a list of"),
    "model-width-negative": (lambda: build_model("vgg", width_multiplier=-1), "width_multiplier"),
    "dataset-name-int": (lambda: load_dataset(42), "must be a string"),
    "wm-running-stats-str": (
        lambda: weight_matching(SPEC, A, B, include_running_stats="yes"),
        "include_running_stats must be true or false",
    ),
    "sinkhorn-tau-bool": (lambda: sinkhorn_matching(SPEC, A, B, tau=True), "tau must be a pos"),
    # a save interval without a file to save to would be ignored
    "train-resume-every-alone": (
        lambda: train(
            build_model("mlp", in_dim=64, hidden=[4]), DIGITS, TrainConfig(epochs=1), resume_every=5
        ),
        "train: resume_every applies only with resume=FILE",
    ),
    "ste-mm-resume-every-alone": (
        lambda: ste_mm(SPEC, [A, B], model=NET, data=DIGITS, resume_every=5),
        "ste_mm: resume_every applies only with resume=FILE",
    ),
    "interpolate-resume-every-alone": (
        lambda: interpolate(NET, A, B, {"test": TEST}, lambdas=3, resume_every=5),
        "interpolate: resume_every applies only with resume=FILE",
    ),
    "train-data-misfit": (
        lambda: train(build_model("mlp", in_dim=64, hidden=[4]), SYNTHETIC, TrainConfig(epochs=1)),
        "does not fit MLP",
    ),
    # values that are not values: NaN, meta tensors, labels the model has no class for
    "wm-empty-spec": (lambda: weight_matching(EMPTY, A, B), "no permutation groups"),
    "sinkhorn-empty-spec": (lambda: sinkhorn_matching(EMPTY, A, B), "no permutation groups"),
    "ccmm-empty-spec": (lambda: ccmm(EMPTY, [A, B]), "no permutation groups"),
    "merge-many-empty-spec": (lambda: merge_many(EMPTY, [A, B]), "no permutation groups"),
    "wm-meta": (lambda: weight_matching(SPEC, META, B), "meta device"),
    "evaluate-meta": (lambda: evaluate(NET, META, TEST), "meta device"),
    "evaluate-nan": (lambda: evaluate(NET, NAN, TEST), "NaN/infinite"),
    "interpolate-nan": (lambda: interpolate(NET, A, NAN, {"test": TEST}), "params_b"),
    "temperature-nan": (
        lambda: fit_temperature(torch.full((4, 3), float("nan")), torch.zeros(4, dtype=torch.long)),
        "non-finite",
    ),
    "temperature-float-labels": (
        lambda: fit_temperature(torch.randn(4, 3), torch.zeros(4)),
        "integer class indices",
    ),
    "ece-bins": (
        lambda: calibration_metrics(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), 0),
        "n_bins",
    ),
    "ste-labels-out-of-range": (
        lambda: ste_matching(SPEC, A, B, model=NET, data=LABEL_12),
        "labels range over [12, 12]",
    ),
    "ste-mm-labels-out-of-range": (
        lambda: ste_mm(SPEC, [A, B], model=NET, data=LABEL_12),
        "labels range over [12, 12]",
    ),
    "singular-values-nan": (lambda: singular_values(NAN), "NaN/infinite"),
    "trace-nan-input": (
        lambda: trace(NET, torch.full((2, 64), float("nan"))),
        "example inputs hold NaN",
    ),
    "trace-misfit-input": (lambda: trace(NET, torch.randn(2, 7)), "do not fit MLP"),
    "trace-nan-model": (lambda: trace(NAN_NET, torch.randn(2, 64)), "NaN/infinite"),
    "trace-width-zero": (lambda: trace(ZERO_WIDTH, torch.randn(2, 4)), "a layer of width 0"),
    "wm-overflowing-products": (
        lambda: weight_matching(SPEC, HUGE, B),
        "'layers.0.weight' holds values up to 3e+38, so its products with the other",
    ),
    "wm-progress-not-callable": (
        lambda: weight_matching(SPEC, A, B, progress=3),
        "progress must be a function or none",
    ),
    "am-batches-of-ints": (
        lambda: activation_matching(SPEC, A, B, model=NET, data=[1, 2]),
        "data[0] is int 1; each batch must be (inputs, labels) tensors",
    ),
    "interpolate-class-beyond-the-outputs": (
        lambda: interpolate(NET, A, B, {"test": TEST}, class_groups={"x": [99]}),
        "class_groups['x'] must list classes in [0, 10)",
    ),
    "load-checkpoint-int": (lambda: _load_checkpoint(3), "path must be"),
    "load-folder-none": (lambda: _load_model_folder(None), "folder must be"),
    "train-a-string": (lambda: train("net", DIGITS, TrainConfig(epochs=1)), "model must be"),
    # options that do not apply are errors, never ignored
    "wm-data": (lambda: weight_matching(SPEC, A, B, data=DIGITS), "takes no data="),
    "interpolate-fraction-uncalibrated": (
        lambda: interpolate(NET, A, B, {"test": TEST}, calibration_fraction=0.3),
        "calibration_fraction applies to calibrated=True only",
    ),
    "interpolate-bn-batches-without-reset": (
        lambda: interpolate(NET, A, B, {"test": TEST}, bn_reset_batches=3),
        "bn_reset_batches applies to a BN reset only",
    ),
    "star-option-of-another-matcher": (
        lambda: star(SPEC, [A, B], epochs=3),
        "method 'wm-fast' takes no option(s) ['epochs']",
    ),
    # arguments of the wrong kind: one line naming them, not a Python error from inside
    "transform-no-spec": (lambda: _transform(None, {}), "needs the PermutationSpec"),
    "transform-maps-not-a-dict": (lambda: _transform(SPEC, [1]), "needs maps as {group: tensor}"),
    "load-checkpoint-bogus-device": (
        lambda: _load_checkpoint("x", device="tpu:3"),
        "unknown device 'tpu:3'",
    ),
    "folder-max-memory-negative": (
        lambda: _load_model_folder("x", max_memory=-1),
        "max_memory must be a positive number of bytes",
    ),
    "folder-max-memory-bool": (
        lambda: _load_model_folder("x", max_memory=True),
        "max_memory must be an integer or none, got True",
    ),
    "write-folder-from-a-path": (
        lambda: _write_model_folder("out", "some/folder"),
        "the source must be a Checkpoint of a model folder",
    ),
}


def _transform(*args):
    from lmckit.transform import Transform

    return Transform(*args)


def _load_checkpoint(*args, **kwargs):
    from lmckit.checkpoint import load_checkpoint

    return load_checkpoint(*args, **kwargs)


def _load_model_folder(*args, **kwargs):
    from lmckit.model_folder import load_model_folder

    return load_model_folder(*args, **kwargs)


def _write_model_folder(*args, **kwargs):
    from lmckit.model_folder import write_model_folder

    return write_model_folder(*args, **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_an_lmc_error_naming_the_culprit(case):
    call, culprit = CASES[case]
    with pytest.raises(LmcError) as exc:
        call()
    assert culprit in str(exc.value)
    assert "\n" not in str(exc.value)
