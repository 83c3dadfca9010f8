"""The zoo's transformers: specs traced from their own graphs, with the residual stream, one
group of whole heads per attention layer and one per MLP; invariance, WM recovery, training
and checkpoints."""

import pytest
import torch

from lmckit.checkpoint import load_checkpoint, save_checkpoint
from lmckit.errors import ModelConfigError
from lmckit.models import build_model, permutation_spec
from lmckit.perm import Permutation
from lmckit.train import TrainConfig, train
from lmckit.workflows.training import model_config_for
from tests.zoo import planted_recovery

SMALL = {
    "vit": ({"dim": 16, "depth": 2, "heads": 4, "mlp_dim": 24}, (1, 28, 28)),
    "transformer": ({"in_dim": 8, "length": 8, "dim": 12, "depth": 2, "heads": 3}, (8, 8)),
}


@pytest.fixture(scope="module", params=list(SMALL))
def zoo_transformer(request):
    torch.manual_seed(0)
    config, shape = SMALL[request.param]
    model = build_model(request.param, **config)
    return model, config, shape, permutation_spec(model)


def test_groups_are_the_stream_the_heads_and_the_mlps(zoo_transformer):
    _, config, _, spec = zoo_transformer
    dim, heads, depth = config["dim"], config["heads"], config["depth"]
    mlp = config.get("mlp_dim", 128)
    sizes = sorted(spec.groups.values())
    assert sizes == sorted([dim] + [dim, dim] * depth + [mlp] * depth)
    for i in range(depth):
        attn = {p: spec.axes[f"blocks.{i}.attn.{p}.weight"] for p in "qkvo"}
        qk, vo = attn["q"][0], attn["v"][0]
        assert attn["k"][0] == qk and attn["o"][1] == vo and qk != vo
        # head-structured: heads shared by both groups, one permutation inside each head
        assert spec.heads[qk] == spec.heads[vo] == (qk, heads)
        assert not any(k.startswith(f"blocks.{i}.attn.") for k in spec.blocks)
    stream = spec.axes["head.weight"][1]
    assert spec.groups[stream] == dim and spec.axes["norm.weight"] == (stream,)


def test_a_random_permutation_leaves_the_outputs_unchanged(zoo_transformer):
    model, _, shape, spec = zoo_transformer
    x = torch.randn(5, *shape, dtype=torch.float64)
    twin = build_model(model.config["name"], **{k: v for k, v in model.config.items()})
    twin.load_state_dict(model.state_dict())
    twin.double().eval()
    params = twin.state_dict()
    permuted = Permutation.random(spec, 1).apply(params)
    out = torch.func.functional_call(twin, params, (x,))
    assert torch.allclose(out, torch.func.functional_call(twin, permuted, (x,)), atol=1e-10)
    assert not torch.allclose(params["blocks.0.attn.q.weight"], permuted["blocks.0.attn.q.weight"])


def test_a_float64_model_traces_to_the_same_spec(zoo_transformer, monkeypatch):
    """The tracer's example batch is float32; a model converted to float64 is traced from
    it cast to the model's dtype (it used to fail with a dtype mismatch inside export)."""
    import lmckit.models.transformer as transformer

    monkeypatch.setattr(transformer, "_TRACED_SPECS", {})  # trace, not recall
    model, config, _, spec = zoo_transformer
    twin = build_model(model.config["name"], **config)
    twin.load_state_dict(model.state_dict())
    assert permutation_spec(twin.double()) == spec


def test_specs_are_traced_once_per_architecture(monkeypatch):
    """A second model of one architecture gets the first one's spec without a trace; one
    that differs only in its head count (which no layer's shape shows) is traced anew."""
    import lmckit.models.transformer as transformer
    import lmckit.tracing

    traced = []
    real = lmckit.tracing.trace
    monkeypatch.setattr(transformer, "_TRACED_SPECS", {})
    monkeypatch.setattr(lmckit.tracing, "trace", lambda *a, **k: traced.append(1) or real(*a, **k))
    config = {"vocab_size": 20, "context": 8, "dim": 16, "depth": 1, "mlp_dim": 24}
    first = permutation_spec(build_model("gpt", heads=4, **config))
    assert permutation_spec(build_model("gpt", heads=4, **config)) is first
    assert len(traced) == 1
    other = permutation_spec(build_model("gpt", heads=2, **config))
    assert len(traced) == 2 and other.heads != first.heads
    assert {h for _, h in other.heads.values()} == {2}


def test_weight_matching_recovers_a_planted_permutation(zoo_transformer):
    """On the small random-weight encoder classifier a single WM start stops in a local
    optimum for every planted permutation tried (seeds 7-11, L2 ≈ 12 left); the best of 5
    starts finds each exactly."""
    model, _, _, spec = zoo_transformer
    planted_recovery(model, spec, restarts=5)


def test_configs_fit_the_data_and_the_classifier_trains(digits):
    config = model_config_for("transformer", digits, width_multiplier=0.25)
    assert config == {"in_dim": 8, "length": 8, "num_classes": 10, "dim": 16, "mlp_dim": 32}
    with pytest.raises(ModelConfigError, match="multiple of 7"):
        model_config_for("vit", digits)
    torch.manual_seed(0)
    model = build_model("transformer", **config)
    result = train(model, digits, TrainConfig(epochs=3, optimizer="adam", lr=3e-3, batch_size=64))
    assert result.test.accuracy > 0.5  # chance is 0.1


def test_checkpoints_round_trip(tmp_path):
    model = build_model("vit", **SMALL["vit"][0])
    save_checkpoint(tmp_path / "vit", model)
    loaded = load_checkpoint(tmp_path / "vit")
    assert loaded.model.config == model.config
    x = torch.randn(2, 1, 28, 28)
    model.eval()
    assert torch.allclose(loaded.model.eval()(x), model(x))


def test_bad_configurations_are_named():
    with pytest.raises(ModelConfigError, match="not divisible by heads"):
        build_model("vit", dim=10, heads=4)
    with pytest.raises(ModelConfigError, match="patch_size 5 does not divide 28"):
        build_model("vit", patch_size=5)
    with pytest.raises(ModelConfigError, match="depth must be a positive integer"):
        build_model("transformer", depth=0)
