"""The zoo's decoder-only language model: causal, traced to the stream, heads and MLPs,
permutation-invariant in float64, planted permutations recovered by WM and AM; its outputs
scored per token everywhere (naive per-position sums as the reference)."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lmckit.data import TensorLoader
from lmckit.data.text import load_code_corpus
from lmckit.errors import DataError, ModelConfigError
from lmckit.evaluate import interpolate
from lmckit.match import activation_matching
from lmckit.metrics import evaluate, predict
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation
from lmckit.train import TrainConfig, train
from lmckit.workflows.training import model_config_for
from tests.data.test_text import write_tree
from tests.zoo import moving_permutation, nontrivial, planted_recovery

SMALL = {"vocab_size": 50, "context": 12, "dim": 16, "depth": 2, "heads": 4, "mlp_dim": 24}


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    model = nontrivial(build_model("gpt", **SMALL))
    return model, permutation_spec(model)


def tokens(n=6, length=12, seed=0):
    return torch.randint(0, 50, (n, length), generator=torch.Generator().manual_seed(seed))


def test_a_position_sees_only_itself_and_the_past(gpt):
    model, _ = gpt
    x = tokens()
    changed = x.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 50
    with torch.no_grad():
        out, out_changed = model(x), model(changed)
    assert out.shape == (6, 12, 50)
    assert torch.allclose(out[:, :7], out_changed[:, :7], atol=1e-6)
    assert not torch.allclose(out[:, 7:], out_changed[:, 7:], atol=1e-3)
    with torch.no_grad():  # a shorter input is the prefix of a longer one
        assert torch.allclose(model(x[:, :5]), out[:, :5], atol=1e-6)


def test_groups_are_the_stream_the_heads_and_the_mlps(gpt):
    _, spec = gpt
    stream = spec.axes["head.weight"][1]
    assert spec.axes["tokens.weight"] == (None, stream) and spec.axes["pos"][2] == stream
    assert spec.axes["norm.weight"] == spec.axes["blocks.1.norm2.bias"] == (stream,)
    assert sorted(spec.groups.values()) == sorted([16] + [16, 16, 24] * 2)
    for i in range(2):
        qk = spec.axes[f"blocks.{i}.attn.q.weight"][0]
        vo = spec.axes[f"blocks.{i}.attn.o.weight"][1]
        assert spec.heads[qk] == spec.heads[vo] == (qk, 4)


def test_a_random_permutation_leaves_every_next_token_logit_unchanged(gpt):
    model, spec = gpt
    twin = build_model("gpt", **SMALL).double().eval()
    params = {k: v.double() for k, v in model.state_dict().items()}
    permuted = moving_permutation(spec, 3).apply(params)
    out = torch.func.functional_call(twin, params, (tokens(),))
    assert torch.allclose(out, torch.func.functional_call(twin, permuted, (tokens(),)), atol=1e-10)
    assert not torch.allclose(params["blocks.0.fc1.weight"], permuted["blocks.0.fc1.weight"])


def test_weight_matching_recovers_a_planted_permutation(gpt):
    model, spec = gpt
    planted_recovery(model, spec, restarts=5)


def test_activation_matching_recovers_a_planted_permutation_from_token_activations(gpt):
    """Every position is a sample of each unit: B = π⁻¹(A) has exactly A's activations
    permuted, so correlation matching must return π."""
    model, spec = gpt
    a = {k: v.clone() for k, v in model.state_dict().items()}
    truth = moving_permutation(spec, 5)
    b = truth.inverse().apply(a)
    batches = [(tokens(16, seed=s), tokens(16, seed=s)) for s in range(3)]
    assert activation_matching(spec, a, b, model=model, data=batches).perm == truth


def test_losses_and_accuracies_are_per_token(gpt):
    model, _ = gpt
    x, y = tokens(10, seed=1), tokens(10, seed=2)
    metrics = evaluate(model, None, TensorLoader(x, y, batch_size=4))
    with torch.no_grad():
        out = model.eval()(x)
    nll = [F.cross_entropy(out[i, t], y[i, t]).item() for i in range(10) for t in range(12)]
    hits = [int(out[i, t].argmax() == y[i, t]) for i in range(10) for t in range(12)]
    assert metrics.count == 120
    assert math.isclose(metrics.loss, sum(nll) / 120, rel_tol=1e-5)
    assert math.isclose(metrics.accuracy, sum(hits) / 120)
    logits, labels = predict(model, None, TensorLoader(x, y, batch_size=4))
    assert logits.shape == (120, 50) and torch.equal(labels, y.flatten())


def test_interpolation_scores_tokens_and_calibrates_a_temperature(gpt):
    model, _ = gpt
    a = {k: v.clone() for k, v in model.state_dict().items()}
    b = {k: v.clone() for k, v in nontrivial(build_model("gpt", **SMALL), 2).state_dict().items()}
    loader = TensorLoader(tokens(10, seed=1), tokens(10, seed=2), batch_size=5)
    curve = interpolate(model, a, b, {"test": loader}, lambdas=3, calibrated=True)
    start = evaluate(model, a, loader).loss
    assert math.isclose(curve.splits["test"]["loss"][0], start, rel_tol=1e-5)
    assert all(math.isfinite(v) for v in curve.splits["test"]["calibrated_loss"])


def test_a_gpt_learns_the_code_corpus(tmp_path):
    write_tree(tmp_path)
    data = load_code_corpus(tmp_path, context=32)
    config = model_config_for("gpt", data, width_multiplier=0.25)
    assert config == {"vocab_size": 256, "context": 32, "dim": 32, "mlp_dim": 128}
    torch.manual_seed(0)
    model = build_model("gpt", **config)
    result = train(model, data, TrainConfig(epochs=3, batch_size=16, optimizer="adamw", lr=3e-3))
    # the baselines: the training split's byte frequencies (their entropy; the most frequent
    # byte's share of the test split)
    p = torch.bincount(data.train_y.flatten(), minlength=256).double()
    p = p[p > 0] / p.sum()
    entropy = -(p * p.log()).sum().item()
    majority = torch.bincount(data.test_y.flatten()).max().item() / data.test_y.numel()
    assert result.history[-1].train_loss < 0.5 * entropy
    assert result.test.accuracy > 2 * majority
    assert result.test.count == data.test_y.numel()


def test_bad_inputs_and_configurations_are_named(gpt, digits):
    model, _ = gpt
    loader = TensorLoader(torch.randn(4, 12), torch.zeros(4, 12, dtype=torch.long), batch_size=4)
    with pytest.raises(DataError, match="integer token ids"):
        evaluate(model, None, loader)
    with pytest.raises(DataError, match="exceed the context of 12"):
        evaluate(model, None, TensorLoader(tokens(4, 13), tokens(4, 13), batch_size=4))
    with pytest.raises(ModelConfigError, match="needs a text dataset"):
        model_config_for("gpt", digits)
    text = replace(digits, train_x=tokens(4), train_y=tokens(4), test_x=tokens(4), test_y=tokens(4))
    for other in ("mlp", "vit", "transformer", "resnet20"):
        with pytest.raises(ModelConfigError, match=r"holds token ids .* train gpt or llama on it"):
            model_config_for(other, text)
    with pytest.raises(ModelConfigError, match="vocab_size must be a positive integer"):
        build_model("gpt", vocab_size=0)
    with pytest.raises(ModelConfigError, match="not divisible by heads"):
        build_model("gpt", dim=10, heads=4)
    permuted_labels = TensorLoader(tokens(4), tokens(4)[:, :5], batch_size=4)
    with pytest.raises(DataError, match="labels of shape"):
        evaluate(model, None, permuted_labels)
    assert isinstance(Permutation.identity(permutation_spec(model)), Permutation)


def test_curvatures_along_a_line_match_finite_differences(gpt):
    """Taylor barriers and sharpness need second derivatives through attention (the fused
    CPU kernel has none): f'(0) and f''(0) of the per-token loss along a random direction
    against central differences, float64."""
    from lmckit.analysis.sharpness import sharpness
    from lmckit.analysis.taylor import line_derivatives

    model, _ = gpt
    twin = build_model("gpt", **SMALL).double()
    params = {k: v.double() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(4)
    direction = {
        k: 0.05 * torch.randn(p.shape, generator=g, dtype=torch.float64)
        for k, p in twin.named_parameters()
    }
    batches = [(tokens(4, seed=1), tokens(4, seed=2))]
    f0, f1, f2 = line_derivatives(twin, params, direction, batches)

    def loss(eps: float) -> float:  # float64 throughout (evaluate() reports float32)
        moved = {k: v + eps * direction[k] if k in direction else v for k, v in params.items()}
        ((x, y),) = batches
        with torch.no_grad():
            out = torch.func.functional_call(twin.eval(), moved, (x,))
        return F.cross_entropy(out.reshape(-1, 50), y.reshape(-1)).item()

    h = 1e-4
    assert f0 == pytest.approx(loss(0.0), rel=1e-12)
    assert f1 == pytest.approx((loss(h) - loss(-h)) / (2 * h), rel=1e-6)
    assert f2 == pytest.approx((loss(h) - 2 * loss(0.0) + loss(-h)) / h**2, rel=1e-4)
    assert sharpness(twin, params, batches, probes=2).probes == 2


def test_the_cli_trains_and_interpolates_gpts_and_prints_perplexities(tmp_path, capsys):
    import json

    from lmckit.cli import main

    write_tree(tmp_path / "tree")
    out = tmp_path / "models"
    common = ["--data-dir", str(tmp_path / "tree"), "-q"]
    train = ["train", "--model", "gpt", "--dataset", "python-stdlib", "--epochs", "1"]
    assert (
        main(
            [*train, "--width-multiplier", "0.125", "--seeds", "0", "1", "--out", str(out), *common]
        )
        == 0
    )
    a, b = (str(out / f"gpt-python-stdlib-seed{s}.safetensors") for s in (0, 1))
    assert main(["interpolate", a, b, "--lambdas", "3", "--out", str(tmp_path / "i"), *common]) == 0
    printed = capsys.readouterr().out.splitlines()
    header = next(line for line in printed if line.startswith("curve"))
    row = next(line for line in printed if line.startswith("naive")).split()
    assert header.endswith("ppl(λ=½)  ppl ends")
    losses = json.loads((tmp_path / "i" / "interpolation.json").read_text())["naive"]["splits"]
    losses = losses["test"]["loss"]
    assert float(row[-2]) == pytest.approx(math.exp(losses[1]), rel=1e-3)
    assert float(row[-1]) == pytest.approx(
        (math.exp(losses[0]) + math.exp(losses[-1])) / 2, rel=1e-3
    )
    # the checkpoint records its dataset: spec reads the example input from it (token ids
    # over the model's context), as it formerly asked for --input-shape and --tokens
    capsys.readouterr()
    assert main(["spec", a]) == 0
    printed = capsys.readouterr().out
    context = json.loads((out / "gpt-python-stdlib-seed0.json").read_text())["model"]["context"]
    assert f"example input: {context} (token ids below 256)" in printed
    assert "verified in eval and train mode" in printed
