"""Activations read off the traced graph (GraphTaps), and activation matching through them
on models without activation_taps(): the zoo's transformers, a user's model with direct
sums and BatchNorm."""

import pytest
import torch
from torch import nn

from lmckit.data import TensorLoader
from lmckit.errors import ParamsError, SpecError
from lmckit.match import activation_matching
from lmckit.models import build_model, permutation_spec
from lmckit.params import params_distance
from lmckit.perm import PermutationSpec
from lmckit.tracing import GraphTaps, trace
from tests.tracing.test_trace import DigitsSums
from tests.zoo import moving_permutation, nontrivial


def planted_by_activations(model, spec, x, taps=None):
    """AM on (A, π⁻¹(A)) over batches of x: must return π (every activation of B is A's,
    permuted, so each correlation matrix has its ones where π says)."""
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    truth = moving_permutation(spec, 3)
    b = truth.inverse().apply(a)
    data = TensorLoader(x, torch.zeros(len(x), dtype=torch.long), batch_size=24)
    result = activation_matching(spec, a, b, model=model, data=data, taps=taps)
    assert result.perm == truth
    assert params_distance(a, result.perm.apply(b)) < 1e-5 * params_distance(a, b)
    return result


def test_graph_activations_equal_the_module_taps_of_the_zoo_mlp():
    """The zoo MLP marks its post-ReLU features with Identity taps; the graph's sites are
    the ReLU outputs themselves — the same tensors, read another way."""
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=12, hidden=(7, 5), out_dim=3)
    spec = permutation_spec(model)
    x = torch.randn(6, 12)
    graph = GraphTaps(model, spec, x[:2])
    params = model.state_dict()
    got = graph(params, x)
    captured = {}
    hooks = [
        model.taps[i].register_forward_hook(lambda _m, _i, out, i=i: captured.__setitem__(i, out))
        for i in range(2)
    ]
    model.eval()(x)
    for h in hooks:
        h.remove()
    for i, g in enumerate(spec.groups):
        (site,) = graph.taps()[g]
        assert torch.equal(got[site], captured[i])
    # other parameters give other activations: the graph runs the given ones
    doubled = {k: 2 * v for k, v in params.items()}
    assert not torch.equal(graph(doubled, x)[site], got[site])


def test_a_last_smaller_batch_gets_its_own_graph():
    torch.manual_seed(0)
    model = build_model("mlp", in_dim=12, hidden=(7,), out_dim=3)
    spec = permutation_spec(model)
    graph = GraphTaps(model, spec, torch.randn(2, 12))
    params = model.state_dict()
    assert next(iter(graph(params, torch.randn(10, 12)).values())).shape == (10, 7)
    assert next(iter(graph(params, torch.randn(3, 12)).values())).shape == (3, 7)


@pytest.mark.parametrize("name", ["transformer", "vit"])
def test_activation_matching_on_zoo_transformers_recovers_a_planted_permutation(name):
    torch.manual_seed(0)
    if name == "transformer":
        model = build_model("transformer", in_dim=8, length=8, dim=12, depth=2, heads=3)
        x = torch.randn(72, 8, 8)
    else:
        model = build_model(
            "vit", image_size=14, patch_size=7, in_channels=1, dim=12, depth=1, heads=3
        )
        x = torch.randn(72, 1, 14, 14)
    model = nontrivial(model)
    spec = permutation_spec(model)
    assert spec.heads and not hasattr(model, "activation_taps")
    planted_by_activations(model, spec, x)


def test_activation_matching_on_a_users_model_with_direct_sums_and_batchnorm():
    torch.manual_seed(0)
    model = nontrivial(DigitsSums())
    spec = trace(model, torch.randn(4, 1, 8, 8))
    result = planted_by_activations(model, spec, torch.randn(72, 1, 8, 8))
    assert result.iterations == 3


class EncoderClassifier(nn.Module):
    """A user's classifier on ``nn.TransformerEncoder`` (``nn.MultiheadAttention``: fused
    in_proj, batch merged with the heads) followed by a GroupNorm'd head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 12)
        layer = nn.TransformerEncoderLayer(12, 3, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.hidden, self.norm = nn.Linear(12, 8), nn.GroupNorm(2, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.encoder(self.embed(x)).mean(1)
        return self.out(torch.relu(self.norm(self.hidden(h))))


def test_activation_matching_through_multihead_attention_and_groupnorm():
    torch.manual_seed(0)
    model = nontrivial(EncoderClassifier())
    spec = trace(model, torch.randn(4, 6, 8))
    assert len(spec.heads) == 3  # q/k and v/o of the attention, the GroupNorm's groups
    planted_by_activations(model, spec, torch.randn(96, 6, 8))


def test_a_spec_other_than_the_traced_one_is_refused():
    torch.manual_seed(0)
    model = build_model("transformer", in_dim=8, length=8, dim=12, depth=1, heads=3)
    whole_heads = trace(model, torch.randn(2, 8, 8), inside_blocks=False)
    with pytest.raises(SpecError, match="traces to another permutation spec"):
        GraphTaps(model, whole_heads, torch.randn(2, 8, 8))
    a = model.state_dict()
    data = TensorLoader(torch.randn(8, 8, 8), torch.zeros(8, dtype=torch.long), batch_size=4)
    with pytest.raises(ParamsError, match=r"no activation_taps.*pass taps="):
        activation_matching(whole_heads, a, a, model=model, data=data)


def test_a_group_no_activation_carries_is_named():
    """A hand-written spec may name a group the graph never materialises one unit per
    entry; a model whose only group lives in a weight-only product has no site."""

    class WeightOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.u, self.v = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(4, 3))

        def forward(self, x):
            return x @ (self.u @ self.v)  # the 4 inner units never meet the data

    model = WeightOnly()
    spec = trace(model, torch.randn(2, 3))
    assert spec == PermutationSpec(
        groups={"u[1]": 4}, axes={"u": (None, "u[1]"), "v": ("u[1]", None)}
    )
    with pytest.raises(
        SpecError, match=r"no activation of the traced graph carries the groups \['u\[1\]'\]"
    ):
        GraphTaps(model, spec, torch.randn(2, 3))
