"""Device parity: the library's main operations with every input on LMCKIT_TEST_DEVICE
give what they give on CPU. On a CPU-only machine both sides run on CPU and this checks
only that nothing assumes another device; on a GPU machine (LMCKIT_TEST_DEVICE=cuda) it
checks that results agree across devices and stay on the inputs' device."""

import pytest
import torch

from lmckit.analysis import alignment, taylor_barrier
from lmckit.evaluate import bn_reset, interpolate
from lmckit.match import ProfiledWeightMatcher, ste_matching, weight_matching
from lmckit.match.weight_matcher import DeltaPolicy
from lmckit.merge import merge_many
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation
from lmckit.train import TrainConfig, train
from tests.zoo import nontrivial


def on(params, device):
    return {k: v.to(device) for k, v in params.items()}


@pytest.fixture(scope="module")
def pair(digits_pair):
    model, a, b = digits_pair
    return model, permutation_spec(model), a, b


def test_weight_matching_finds_the_same_permutation(pair, device):
    _, spec, a, b = pair
    cpu = weight_matching(spec, a, b, seed=0)
    moved = weight_matching(spec, on(a, device), on(b, device), seed=0)
    assert moved.perm == cpu.perm


def test_weight_matching_overlaps_products_and_laps_on_any_device(device):
    """Four hidden layers, so that a sweep's order often puts two non-neighbours in a row:
    their products are formed while the LAP before them runs (on a GPU queued, on a CPU
    beside the LAP's thread), with the same outcome as on CPU."""
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=20, hidden=[48, 40, 32, 24], out_dim=5) for _ in "ab"]
    spec = permutation_spec(models[0])
    a, b = (m.state_dict() for m in models)
    cpu = weight_matching(spec, a, b, seed=0)
    moved = weight_matching(spec, on(a, device), on(b, device), seed=0)
    assert moved.perm == cpu.perm and moved.iterations == cpu.iterations
    assert moved.info["formed_ahead"] > 0


def test_small_cost_matrices_are_formed_anew_on_a_gpu_and_updated_on_a_cpu(device):
    """On a GPU an update's fixed costs exceed forming a small matrix again
    (``DeltaPolicy.gpu_min_flops``); forced updates there choose the same."""
    torch.manual_seed(0)
    models = [build_model("mlp", in_dim=20, hidden=[48, 40, 32, 24], out_dim=5) for _ in "ab"]
    spec = permutation_spec(models[0])
    a, b = (on(m.state_dict(), device) for m in models)
    default = ProfiledWeightMatcher(spec, b).match(a, seed=0)
    formed_anew = default.info["gemm_flops"] == default.info["full_recompute_flops"]
    assert formed_anew == (torch.device(device).type == "cuda")
    forced = ProfiledWeightMatcher(spec, b, delta=DeltaPolicy(gpu_min_flops=0)).match(a, seed=0)
    assert forced.info["gemm_flops"] < forced.info["full_recompute_flops"]
    assert forced.perm == default.perm and forced.history == pytest.approx(default.history)


def test_interpolation_curves_agree(pair, digits, device):
    model, _, a, b = pair
    loaders = {"test": digits.loader("test", batch_size=360)}
    cpu = interpolate(model, a, b, loaders, lambdas=3)
    moved = interpolate(model.to(device), on(a, device), on(b, device), loaders, lambdas=3)
    model.to("cpu")
    for metric in ("loss", "accuracy"):
        torch.testing.assert_close(
            torch.tensor(moved.splits["test"][metric]),
            torch.tensor(cpu.splits["test"][metric]),
            rtol=1e-4,
            atol=1e-4,
        )


def test_ste_and_merge_many_run_and_return_valid_permutations(pair, digits, device):
    model, spec, a, b = pair
    result = ste_matching(
        spec, on(a, device), on(b, device), model=model.to(device), data=digits, epochs=1
    )
    merged = merge_many(spec, [on(a, device), on(b, device)])
    model.to("cpu")
    assert isinstance(result.perm, Permutation) and len(merged.perms) == 2
    assert all(t.device.type == torch.device(device).type for t in merged.merged.values())


def test_bn_reset_statistics_agree(digits, device):
    torch.manual_seed(0)
    model = nontrivial(build_model("mlp", in_dim=64, hidden=[32, 32], norm="batch"))
    params = model.state_dict()
    cpu = bn_reset(model, params, digits)
    moved = bn_reset(model.to(device), on(params, device), digits)
    model.to("cpu")
    for k, v in cpu.items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(moved[k].cpu(), v, rtol=1e-4, atol=1e-5)


def test_analyses_agree(pair, digits, device):
    model, spec, a, b = pair
    perm = weight_matching(spec, a, b, seed=0).perm
    r_cpu = alignment(spec, a, b, perm, gamma=0.3).total
    r_dev = alignment(spec, on(a, device), on(b, device), perm, gamma=0.3).total
    assert r_dev == pytest.approx(r_cpu, abs=1e-6)
    loader = digits.loader("test", batch_size=360)
    t_cpu = taylor_barrier(model, a, perm.apply(b), loader)
    t_dev = taylor_barrier(model.to(device), on(a, device), on(perm.apply(b), device), loader)
    model.to("cpu")
    assert t_dev.predicted[0] == pytest.approx(t_cpu.predicted[0], rel=1e-3, abs=1e-5)
    assert t_dev.actual[0] == pytest.approx(t_cpu.actual[0], rel=1e-3, abs=1e-5)


def test_training_runs_on_the_device(digits, device):
    model = build_model("mlp", in_dim=64, hidden=[16], out_dim=10).to(device)
    result = train(
        model, digits, TrainConfig(epochs=1, batch_size=64, seed=0), evaluate_each_epoch=False
    )
    assert next(model.parameters()).device.type == torch.device(device).type
    assert 0.0 <= result.metrics_dict()["test_accuracy"] <= 1.0


def test_layerwise_flatness_and_random_merges_agree(pair, digits, device):
    from lmckit.analysis import flatness, layerwise, random_permutation_merges

    model, spec, a, b = pair
    loader = digits.loader("test", batch_size=360)
    cpu = layerwise(model, a, b, loader)
    flat_cpu = flatness(model, a, b, loader, lambdas=[0.0, 1.0], seed=2)
    rand_cpu = random_permutation_merges(model, spec, a, b, loader, n=1)
    try:
        model.to(device)
        dev = layerwise(model, on(a, device), on(b, device), loader)
        flat_dev = flatness(model, on(a, device), on(b, device), loader, lambdas=[0.0, 1.0], seed=2)
        rand_dev = random_permutation_merges(model, spec, on(a, device), on(b, device), loader, n=1)
    finally:
        model.to("cpu")
    for key in ("lewc", "weak_additivity", "commutativity", "reciprocal_ab"):
        pairs = [(d, c) for d, c in zip(dev.column(key), cpu.column(key), strict=True)]
        assert all((d is None) == (c is None) for d, c in pairs), key
        known = [(d, c) for d, c in pairs if c is not None]
        assert [d for d, _ in known] == pytest.approx([c for _, c in known], rel=1e-4, abs=1e-6)
    assert flat_dev.loss == pytest.approx(flat_cpu.loss, rel=1e-4)
    assert rand_dev.merges["random0"]["accuracy"] == pytest.approx(
        rand_cpu.merges["random0"]["accuracy"], abs=1e-3
    )


def test_sophia_trains_on_the_device(digits, device):
    model = build_model("mlp", in_dim=64, hidden=[16], out_dim=10).to(device)
    cfg = TrainConfig(epochs=1, batch_size=64, seed=0, optimizer="sophia")
    result = train(model, digits, cfg, evaluate_each_epoch=False)
    assert next(model.parameters()).device.type == torch.device(device).type
    assert 0.0 <= result.metrics_dict()["test_accuracy"] <= 1.0
