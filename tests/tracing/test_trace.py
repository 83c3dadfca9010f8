"""lmckit.tracing.trace: specs read off the export graph, checked against the zoo's hand-built
specs, against planted permutations, and against rules made wrong on purpose."""

import sys

import pytest
import torch
from torch import nn

from lmckit.errors import SpecError
from lmckit.models import build_model, permutation_spec
from lmckit.params import params_distance
from lmckit.perm import Permutation
from lmckit.tracing import trace, trace_report
from tests.zoo import SMALL_ZOO, SMALL_ZOO_IDS, nontrivial, planted_recovery

rules = sys.modules["lmckit.tracing.rules"]
aten = torch.ops.aten


def partition(spec):
    """A spec up to the names of its groups."""
    groups = {frozenset(spec.group_axes(g)): spec.groups[g] for g in spec.groups}
    return groups, spec.self_maps


def example(shape, batch=4):
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("name", "config", "shape"), SMALL_ZOO, ids=SMALL_ZOO_IDS)
def test_the_zoo_specs_equal_the_traced_ones(name, config, shape):
    model = nontrivial(build_model(name, **config))
    report = trace_report(model, example(shape))
    assert partition(report.spec) == partition(permutation_spec(model))
    assert report.checked_modes == ("eval", "train")
    assert report.unknown_ops == ()


class TinyTransformer(nn.Module):
    """Token embedding tied to the output head, learned positions, two pre-LN
    ``nn.TransformerEncoderLayer`` blocks."""

    def __init__(self, vocab=11, d=16, heads=4, length=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(length, d))
        layer = nn.TransformerEncoderLayer(
            d, heads, 32, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.norm(self.encoder(self.embed(tokens) + self.pos)))


def test_a_transformer_with_tied_weights_keeps_them_together():
    model = TinyTransformer()
    report = trace_report(model, torch.randint(0, 11, (3, 6)))
    spec = report.spec
    stream = spec.axes["embed.weight"][1]
    assert stream is not None and spec.axes["head.weight"] == (None, stream)
    assert report.aliases == {"head.weight": "embed.weight"}
    assert spec.axes["pos"] == (None, stream)
    assert spec.axes["encoder.layers.0.linear1.weight"][1] == stream
    hidden = spec.axes["encoder.layers.0.linear1.weight"][0]
    assert hidden is not None and spec.axes["encoder.layers.0.linear2.weight"] == (stream, hidden)
    assert report.frozen["embed.weight"][0] == "embedding rows are looked up by token id"
    # dropout is on in train mode, so train mode is checked with the dropout modules off
    # (attention's too, which nn.MultiheadAttention passes down to its functional form)
    assert report.checked_modes == ("eval", "train")
    planted_recovery(model, spec)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_fused_in_proj_is_query_key_value_heads(batch_first):
    """``nn.MultiheadAttention`` unflattens its fused in_proj into (3, E), reads q, k, v
    with select, and merges the batch with the heads: the in_proj rows are query ⊕ key ⊕
    value, query and key one head-structured group, value and the out_proj's input
    another, under one permutation of the heads."""
    model = TinyTransformer()
    if not batch_first:
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1)  # (L, N, E), post-LN
        model.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    report = trace_report(model, torch.randint(0, 11, (3, 6)))
    spec = report.spec
    for i in range(2):
        attn = f"encoder.layers.{i}.self_attn"
        qk, qk_again, vo = spec.axes[f"{attn}.in_proj_weight"][0]
        assert qk == qk_again != vo and spec.groups[qk] == spec.groups[vo] == 16
        assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 4
        assert spec.axes[f"{attn}.in_proj_bias"] == ((qk, qk, vo),)
        assert spec.axes[f"{attn}.out_proj.weight"][1] == vo
        assert all(why is None for why in report.frozen[f"{attn}.in_proj_weight"])
    assert report.checked_modes == ("eval", "train")
    planted_recovery(model, spec)


class TimmAttention(nn.Module):
    """timm's ViT attention: one qkv linear reshaped to (B, N, 3, H, d), permuted to
    (3, B, H, N, d) and unbound into q, k, v."""

    def __init__(self, d=12, heads=3):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Linear(d, 2)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.mlp(x + self.proj(y.transpose(1, 2).reshape(b, n, d)))


def test_a_fused_projection_unbound_in_three_is_a_direct_sum_of_its_head_groups():
    model = TimmAttention()
    spec = trace(model, torch.randn(2, 4, 12))
    qk, qk_again, vo = spec.axes["qkv.weight"][0]
    assert qk == qk_again != vo and spec.groups[qk] == spec.groups[vo] == 12
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 3
    assert spec.axes["proj.weight"][1] == vo
    planted_recovery(model, spec)


class SummedParts(nn.Module):
    """The (3, E) axis of an unflattened projection summed over, not read part by part:
    the sum is symmetric in the parts, which move as whole blocks — not a direct sum."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3 * 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x).unflatten(-1, (3, 6)).sum(-2)))


def test_an_unflattened_axis_read_whole_is_not_a_direct_sum():
    spec = trace(SummedParts(), torch.randn(3, 4))
    parts = spec.axes["a.weight"][0]
    assert isinstance(parts, str) and spec.groups[parts] == 3
    assert spec.blocks["a.weight"] == (6, 1) and spec.axes["a.bias"] == (parts,)


@pytest.mark.parametrize(("name", "config", "shape"), SMALL_ZOO, ids=SMALL_ZOO_IDS)
def test_planted_permutations_of_traced_zoo_specs_are_recovered(name, config, shape):
    model = nontrivial(build_model(name, **config))
    planted_recovery(model, trace(model, example(shape)))


class FlattenCNN(nn.Module):
    """A LeNet-style net: the last convolution's ``C×7×7`` map flattened into a linear."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 6, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.fc1, self.fc2 = nn.Linear(6 * 7 * 7, 32), nn.Linear(32, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.norm(self.c2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_a_flatten_into_a_linear_makes_blocks_of_the_channels():
    model = nontrivial(FlattenCNN())
    spec = trace(model, torch.randn(4, 1, 28, 28))
    channels = spec.axes["c2.weight"][0]
    assert spec.groups[channels] == 6
    assert spec.axes["fc1.weight"] == (spec.axes["fc1.weight"][0], channels)
    assert spec.blocks["fc1.weight"] == (1, 49)
    assert spec.axes["norm.running_mean"] == (channels,)
    planted_recovery(model, spec)


class Heads(nn.Module):
    """Separate q/k/v projections split into heads, scaled dot-product attention, heads
    merged back into an output projection."""

    def __init__(self, d=12, heads=3):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape

        def split(t):
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        y = nn.functional.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), dropout_p=0.2
        )
        return self.o(y.transpose(1, 2).reshape(b, n, d))


def test_attention_heads_and_the_dimensions_inside_them_are_traced():
    """One permutation of the heads shared by Q, K, V and O; inside each head one
    permutation of the query/key dimensions and another of the value/output dimensions
    (Verma & Elbayad 2024) — and nothing that moves a dimension to another head."""
    model = Heads()
    x = torch.randn(2, 5, 12)
    report = trace_report(model, x)
    spec = report.spec
    qk, vo = spec.axes["q.weight"][0], spec.axes["v.weight"][0]
    assert qk != vo and spec.groups[qk] == spec.groups[vo] == 12
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 3
    assert spec.axes["k.weight"] == (qk, None) and spec.axes["k.bias"] == (qk,)
    assert spec.axes["o.weight"] == (None, vo) and not spec.blocks
    assert "12 units = 3 heads × 4, heads shared with v.weight[0]" in str(report)
    # train mode is verified with attention dropout off (dropout_p=0.2 in the model)
    assert report.checked_modes == ("eval", "train")
    planted_recovery(model, spec)
    # the structure is needed: the same dimensions shuffled across heads change the output
    state = model.state_dict()
    shuffled = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    moved = {k: v[shuffled] if k.startswith(("q.", "k.")) else v for k, v in state.items()}
    out = torch.func.functional_call(model.eval(), moved, (x,))
    assert not torch.allclose(out, model(x), atol=1e-4)


class CumsumInTheMiddle(nn.Module):
    """A cumulative sum over the hidden units: no permutation of them commutes with it."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(5, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.cumsum(torch.relu(self.a(x)), dim=-1))))


def test_an_op_without_a_rule_freezes_its_axes_and_is_named():
    report = trace_report(CumsumInTheMiddle(), torch.randn(4, 5))
    assert report.unknown_ops == ("aten.cumsum.default",)
    spec = report.spec
    assert spec.axes["a.weight"] == (None, None)
    assert spec.axes["b.weight"][1] is None
    assert report.frozen["a.weight"][0] == "operator aten.cumsum.default has no rule"
    hidden = spec.axes["b.weight"][0]  # the units after the cumsum still permute
    assert hidden is not None and spec.axes["c.weight"] == (None, hidden)
    assert report.checked_modes == ("eval", "train")
    with pytest.raises(SpecError, match=r"aten\.cumsum\.default.*strict"):
        trace(CumsumInTheMiddle(), torch.randn(4, 5), strict=True)


class Padded(nn.Module):
    """A conv net that pads its feature maps (TF-style "same" padding, as MobileNetV2 does)
    and, with ``channel_pad``, also pads its channels."""

    def __init__(self, mode: str, channel_pad: bool = False):
        super().__init__()
        self.mode, self.channel_pad = mode, channel_pad
        self.a = nn.Conv2d(2, 6, 3)
        self.b = nn.Conv2d(6 + (2 if channel_pad else 0), 5, 3)
        self.c = nn.Linear(5, 3)

    def forward(self, x):
        h = torch.nn.functional.pad(torch.relu(self.a(x)), (1, 2, 0, 1), mode=self.mode)
        if self.channel_pad:
            h = torch.nn.functional.pad(h, (0, 0, 0, 0, 1, 1), value=0.5)
        return self.c(torch.relu(self.b(h)).mean(dim=(2, 3)))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_padding_keeps_the_channels_it_does_not_pad(mode):
    """Padding used to have no rule and froze every channel it touched (MobileNetV2: 38 % of
    the parameters in permuted tensors)."""
    torch.manual_seed(0)
    model = Padded(mode)
    report = trace_report(model, torch.randn(3, 2, 8, 8))
    assert report.unknown_ops == () and report.checked_modes == ("eval", "train")
    hidden = report.spec.axes["a.weight"][0]
    assert hidden is not None and report.spec.axes["b.weight"][1] == hidden
    planted_recovery(model, report.spec)


def test_a_padded_channel_axis_is_frozen_with_its_reason():
    report = trace_report(Padded("constant", channel_pad=True), torch.randn(3, 2, 8, 8))
    assert report.spec.axes["a.weight"][0] is None
    assert report.frozen["a.weight"][0] == "padded axis"
    assert report.spec.axes["b.weight"][0] is not None  # the next layer's units still move


class Pointwise(nn.Module):
    """Elementwise ops that no hand-written table listed (``atan``, ``min`` of two tensors,
    ``logaddexp``, ``hypot``)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(5, 8), nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x):
        h, g = self.a(x), self.b(x)
        return self.c(torch.atan(torch.min(h, g)) + torch.logaddexp(h, g) * torch.hypot(h, g))


def test_every_op_pytorch_tags_pointwise_relates_its_axes_elementwise():
    report = trace_report(Pointwise(), torch.randn(4, 5))
    assert report.unknown_ops == () and report.checked_modes == ("eval", "train")
    hidden = report.spec.axes["a.weight"][0]
    assert hidden is not None and report.spec.axes["b.weight"][0] == hidden
    assert report.spec.axes["c.weight"] == (None, hidden)
    planted_recovery(Pointwise(), trace(Pointwise(), torch.randn(4, 5)))


class FiveEightThree(nn.Module):
    """Two linear layers around 8 hidden units, for models that differ only in what their
    forward does with them."""

    def __init__(self):
        super().__init__()
        self.a, self.c = nn.Linear(5, 8), nn.Linear(8, 3)


class MadeInForward(FiveEightThree):
    """Adds tensors made inside forward: constant ones (zeros, ones, full, new_ones, as
    T5's cross-attention does with its zero position bias) or, with ``ramp``, an arange."""

    def __init__(self, ramp: bool = False):
        super().__init__()
        self.ramp = ramp

    def forward(self, x):
        h = torch.relu(self.a(x))
        n = h.shape[-1]
        h = h + torch.zeros(n) + torch.full((1, n), 0.5) + h.new_ones(h.shape) * torch.ones(n)
        if self.ramp:
            h = h + torch.arange(n, dtype=h.dtype)
        return self.c(h)


def test_constant_tensors_made_in_forward_let_the_axes_move_and_a_ramp_does_not():
    report = trace_report(MadeInForward(), torch.randn(4, 5))
    assert report.unknown_ops == ()
    hidden = report.spec.axes["a.weight"][0]
    assert hidden is not None and report.spec.axes["c.weight"] == (None, hidden)
    ramp = trace_report(MadeInForward(ramp=True), torch.randn(4, 5))
    assert ramp.spec.axes["a.weight"][0] is None
    assert ramp.frozen["a.weight"][0].endswith("creates a tensor inside forward")


class ShapeProbe(FiveEightThree):
    """Selects one unit only to read a shape (BART does this with its embeddings); with
    ``read``, the selected values are used."""

    def __init__(self, read: bool = False):
        super().__init__()
        self.read = read

    def forward(self, x):
        h = torch.relu(self.a(x))
        probe = h[:, -1]
        out = self.c(h) + torch.zeros(probe.shape[0], 1)
        return out + probe[:, None] if self.read else out


def test_a_value_read_only_for_its_shape_constrains_nothing():
    report = trace_report(ShapeProbe(), torch.randn(4, 5))
    assert report.spec.axes["a.weight"][0] is not None
    read = trace_report(ShapeProbe(read=True), torch.randn(4, 5))
    assert read.frozen["a.weight"][0] == "indexed by select"


class WritesInPlace(FiveEightThree):
    """Makes a buffer at the default dtype in forward and adds into it through a view: an
    in-place op whose result nobody reads, which must still relate its axes."""

    def forward(self, x):
        h = torch.relu(self.a(x))
        buf = torch.zeros(h.shape)
        buf.view(-1, 8).add_(h)
        return self.c(buf)


def test_an_in_place_write_relates_axes_and_default_dtype_tensors_follow_the_check():
    """(The float64 check used to end in a raw dtype error on ``torch.zeros(shape)``.)"""
    report = trace_report(WritesInPlace(), torch.randn(4, 5))
    hidden = report.spec.axes["a.weight"][0]
    assert hidden is not None and report.spec.axes["c.weight"] == (None, hidden)
    assert report.checked_modes == ("eval", "train")
    assert torch.get_default_dtype() == torch.float32  # restored


class OnlyFloat32(FiveEightThree):
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("this model runs in float32 only")
        return self.c(torch.relu(self.a(x)))


def test_a_model_that_cannot_run_in_float64_is_checked_at_float32_unless_asked_not_to():
    report = trace_report(OnlyFloat32(), torch.randn(4, 5))
    assert report.precision == "float32" and report.checked_modes == ("eval", "train")
    assert report.spec.groups  # its hidden units, verified at float32's rounding
    with pytest.raises(SpecError, match=r"float64 copy of OnlyFloat32.*float32 only"):
        trace_report(OnlyFloat32(), torch.randn(4, 5), precision="float64")
    assert torch.get_default_dtype() == torch.float32


class TwoOutputs(FiveEightThree):
    """Returns its prediction and a hidden representation."""

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.c(h), h


def test_outputs_says_which_outputs_are_the_function():
    x = torch.randn(4, 5)
    every = trace_report(TwoOutputs(), x)  # a returned representation is an output too
    assert every.spec.axes["a.weight"][0] is None
    assert every.frozen["a.weight"][0] == "model output"
    first = trace_report(TwoOutputs(), x, outputs=lambda out: out[0])
    hidden = first.spec.axes["a.weight"][0]
    assert hidden is not None and first.spec.axes["c.weight"] == (None, hidden)
    assert first.checked_modes == ("eval", "train")
    with pytest.raises(SpecError, match="selected none of the model's outputs"):
        trace_report(TwoOutputs(), x, outputs=lambda out: [])
    with pytest.raises(SpecError, match="outputs must be a function of the model's output"):
        trace_report(TwoOutputs(), x, outputs="logits")
    with pytest.raises(SpecError, match="could not select from the model's output"):
        trace_report(TwoOutputs(), x, outputs=lambda out: out["logits"])


class Concatenated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(5, 6), nn.Linear(5, 6), nn.Linear(12, 3)

    def forward(self, x):
        return self.c(torch.cat([torch.relu(self.a(x)), torch.tanh(self.b(x))], dim=-1))


def test_a_wrong_rule_is_caught_by_the_verification(monkeypatch):
    """A plausible bug — ``cumsum`` listed among the elementwise ops — gives a spec whose
    hidden group changes the outputs: an error naming the group, never a returned spec."""
    monkeypatch.setitem(rules.RULES, aten.cumsum.default, rules.elementwise)
    with pytest.raises(SpecError, match=r"traced group 'a\.weight\[0\]'.*changes the model"):
        trace(CumsumInTheMiddle(), torch.randn(4, 5))


def test_a_rule_joining_axes_of_different_lengths_is_caught(monkeypatch):
    """``cat`` treated as elementwise joins a part's axis (6) to the joined axis (12)."""
    spec = trace(Concatenated(), torch.randn(4, 5))
    # the real rule makes the joined axis the direct sum of the branches' groups
    assert spec.axes["c.weight"] == (None, ("a.weight[0]", "b.weight[0]"))

    def cat_as_elementwise(node, ax):
        for part in node.args[0]:
            for i in range(len(ax.shape(part))):
                ax.same(part, i, node, i)

    for op in rules._ops("cat"):
        monkeypatch.setitem(rules.RULES, op, cat_as_elementwise)
    with pytest.raises(SpecError, match=r"aten\.cat\.default: a rule joined axis 1 .*length 6"):
        trace(Concatenated(), torch.randn(4, 5))


def test_a_wrong_linear_rule_is_caught(monkeypatch):
    """Another plausible bug: the weight's output axis joined to the input's last axis."""

    def swapped(node, ax):
        x, w = node.args[0], node.args[1]
        n = len(ax.shape(x))
        for i in range(n - 1):
            ax.same(x, i, node, i)
        ax.same(x, n - 1, w, 0)
        ax.same(w, 1, node, n - 1)

    monkeypatch.setitem(rules.RULES, aten.linear.default, swapped)
    with pytest.raises(SpecError, match=r"group '0\.weight\[1\]'.*changes the model's outputs"):
        trace(nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)), torch.randn(4, 6))
    # where the lengths differ the rule is caught before any verification
    with pytest.raises(SpecError, match=r"aten\.linear\.default: a rule joined axis 1 of"):
        trace(nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)), torch.randn(4, 6))


def test_the_model_is_left_as_it_was():
    model = nontrivial(build_model("resnet20", width_multiplier=1, in_channels=1))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trace(model, example((1, 16, 16)))
    assert model.training and all(m.training for m in model.modules())
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bad_inputs_are_named():
    with pytest.raises(SpecError, match=r"needs a torch\.nn\.Module"):
        trace("mlp", torch.randn(2, 3))

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: export refuses
                return self.a(x)
            return x

    with pytest.raises(SpecError, match=r"torch\.export could not trace Branchy"):
        trace(Branchy(), torch.randn(2, 3))


def test_the_report_reads_and_serialises():
    report = trace_report(CumsumInTheMiddle(), torch.randn(4, 5))
    text = str(report)
    assert "1 groups" in text and "aten.cumsum.default" in text and "model output" in text
    data = report.to_dict()
    assert data["groups"]["b.weight[0]"]["size"] == 8
    assert "b.weight[0]" in data["groups"]["b.weight[0]"]["members"]
    assert data["frozen"]["c.weight[0]"] == "model output"
    total = sum(p.numel() for p in CumsumInTheMiddle().parameters())
    permuted = 8 * 8 + 8 + 3 * 8  # b.weight, b.bias, c.weight
    assert report.permuted_fraction == pytest.approx(permuted / total)


class DigitsCNN(nn.Module):
    """For 8×8 digits: conv → BN → pool → flatten ``6×4×4`` → linear (a blocked axis)."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.fc1, self.fc2 = nn.Linear(6 * 16, 12), nn.Linear(12, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class DigitsSums(nn.Module):
    """For 8×8 digits: two conv branches concatenated → BN → pool → flatten (a direct sum
    of blocked axes) → linear → split unequally, rejoined → linear."""

    def __init__(self):
        super().__init__()
        self.conv_a, self.conv_b = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(1, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.fc1, self.fc2 = nn.Linear(6 * 16, 12), nn.Linear(12, 10)

    def forward(self, x):
        x = torch.cat([self.conv_a(x), self.conv_b(x)], 1)
        x = nn.functional.max_pool2d(torch.relu(self.norm(x)), 2)
        left, right = self.fc1(x.flatten(1)).split([5, 7], dim=1)
        return self.fc2(torch.cat([torch.relu(left), torch.tanh(right)], 1))


@pytest.fixture(scope="module", params=["blocked", "direct sums"])
def blocked_copies(request):
    if request.param == "blocked":
        model = nontrivial(DigitsCNN())
        spec = trace(model, torch.randn(4, 1, 8, 8))
    else:
        model = nontrivial(DigitsSums())
        spec = trace(model, torch.randn(4, 1, 8, 8))
        a, b = spec.axes["conv_a.weight"][0], spec.axes["conv_b.weight"][0]
        left, right = spec.axes["fc2.weight"][1]
        assert spec.axes["fc1.weight"] == ((left, right), (a, b))
        assert spec.axes["norm.running_var"] == ((a, b),)
    assert spec.blocks["fc1.weight"] == (1, 16)
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    copies = [Permutation.random(spec, s).apply(a) for s in (11, 12)] + [a]
    return model, spec, copies


@pytest.mark.parametrize("method", ["wm", "wm-fast", "ste", "sinkhorn", "sinkhorn-mid"])
def test_every_matcher_runs_on_a_blocked_spec(method, blocked_copies, digits):
    """Planted permutations are recovered by the weight-based matchers and STE; the
    midpoint-loss Sinkhorn optimises a data loss with other optima on an untrained net, so
    it is only run."""
    from lmckit.match import METHODS

    model, spec, (b, _, a) = blocked_copies
    options = {"epochs": 1} if "epochs" in METHODS[method].options() else {}
    data = digits if METHODS[method].needs_data else None  # WM refuses data it never reads
    result = METHODS[method](spec, a, b, model=model, data=data, **options)
    assert result.perm.spec == spec
    if method != "sinkhorn-mid":
        assert params_distance(a, result.perm.apply(b)) < 1e-5 * params_distance(a, b)


@pytest.mark.parametrize("method", ["star-wm", "star-ste", "merge-many", "ste-mm", "ccmm"])
def test_every_merger_merges_planted_copies_of_a_blocked_spec_back(method, blocked_copies, digits):
    from lmckit.merge import METHODS

    model, spec, copies = blocked_copies
    options = {"epochs": 1} if "epochs" in METHODS[method].options() else {}
    result = METHODS[method](spec, copies, model=model, data=digits, **options)
    merged = {k: v for k, v in result.merged.items() if "running" not in k}
    reference = {k: v for k, v in copies[-1].items() if "running" not in k}
    assert params_distance(merged, reference) < 1e-5


class Grouped(nn.Module):
    """GroupNorm with 4 groups of 4 channels, then a convolution of 2 groups."""

    def __init__(self):
        super().__init__()
        self.c1, self.gn = nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.c2, self.gn2 = nn.Conv2d(16, 8, 3, padding=1, groups=2), nn.GroupNorm(2, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.gn(self.c1(x)))
        return self.fc(torch.relu(self.gn2(self.c2(x))).mean((2, 3)))


def test_groupnorm_and_grouped_convolutions_move_whole_groups():
    """GroupNorm alone would allow its 4 groups to move (blocks of 4 channels); the grouped
    convolution reads input group j into output group j, so its 2 groups move alike on its
    input and output: one group of 2 units, blocks of 8 channels before it and 4 after."""
    model = nontrivial(Grouped())
    report = trace_report(model, torch.randn(4, 3, 6, 6))
    spec = report.spec
    (group,) = spec.groups
    assert spec.groups[group] == 2
    assert spec.axes["c1.weight"][0] == spec.axes["c2.weight"][0] == group
    assert spec.blocks["c1.weight"] == (8, 1, 1, 1) and spec.blocks["gn.weight"] == (8,)
    assert spec.blocks["c2.weight"] == (4, 1, 1, 1) and spec.blocks["fc.weight"] == (1, 4)
    assert report.frozen["c2.weight"][1].startswith("inside a group of a grouped convolution")
    planted_recovery(model, spec)


@pytest.mark.parametrize("conv", [False, True], ids=["linear", "conv"])
def test_groupnorm_alone_moves_its_groups_and_the_channels_inside_them(conv):
    """Each group's statistics are symmetric in its channels: 3 groups × 4 channels as a
    head-structured group (groups move whole, channels inside each group by their own
    permutation) — and channels moved across groups change the function."""
    if conv:
        layers = [nn.Conv2d(2, 12, 3, padding=1), nn.GroupNorm(3, 12), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Conv2d(12, 2, 3), nn.Flatten())
        x = torch.randn(4, 2, 5, 5)
    else:
        model = nn.Sequential(nn.Linear(5, 12), nn.GroupNorm(3, 12), nn.Linear(12, 2))
        x = torch.randn(4, 5)
    model = nontrivial(model)
    spec = trace(model, x)
    after = "3.weight" if conv else "2.weight"  # the layer reading the normalised channels
    (group,) = spec.groups
    assert spec.groups[group] == 12 and spec.heads[group][1] == 3 and not spec.blocks
    assert spec.axes["1.weight"] == (group,) and spec.axes[after][1] == group
    planted_recovery(model, spec)
    across = torch.tensor([4, 1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11])  # units of groups 0 and 1
    moved = {}
    for k, v in model.state_dict().items():
        moved[k] = v[across] if k[:2] in ("0.", "1.") else v[:, across] if k == after else v
    out = torch.func.functional_call(model.eval(), moved, (x,))
    assert not torch.allclose(out, model(x), atol=1e-4)


class FusedQKV(nn.Module):
    """GPT-2's layout: one projection to ``3·d``, split into query, key and value."""

    def __init__(self, d=12, heads=3):
        super().__init__()
        self.heads = heads
        self.inp, self.qkv, self.o = nn.Linear(5, d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        x = self.inp(x)
        b, n, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)

        def split(t):
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        y = nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.out((x + self.o(y.transpose(1, 2).reshape(b, n, d))).mean(1))


def test_a_fused_projection_split_in_three_is_a_direct_sum_of_its_head_groups():
    """The split makes the fused axis query ⊕ key ⊕ value: query and key move with one
    head-structured group (through the scores), value with another (with the output
    projection), both under one permutation of the heads."""
    model = FusedQKV()
    report = trace_report(model, torch.randn(2, 4, 5))
    spec = report.spec
    qk, qk_again, vo = spec.axes["qkv.weight"][0]
    assert qk == qk_again != vo
    assert spec.groups[qk] == spec.groups[vo] == 12
    assert spec.heads[qk] == spec.heads[vo] and spec.heads[qk][1] == 3
    assert spec.axes["qkv.bias"] == ((qk, qk, vo),)
    assert spec.axes["o.weight"][1] == vo and "qkv.weight" not in spec.blocks
    assert f"direct sum {qk} ⊕ {qk} ⊕ {vo}" in str(report)
    planted_recovery(model, spec)


class Unequal(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 7), nn.Linear(3, 2), nn.Linear(4, 2)

    def forward(self, x):
        left, right = self.a(x).split([3, 4], dim=-1)
        return self.b(torch.relu(left)) + self.c(torch.relu(right))


def test_an_unequal_split_is_a_direct_sum_of_two_groups():
    spec = trace(Unequal(), torch.randn(3, 4))
    left, right = spec.groups.keys()
    assert (spec.groups[left], spec.groups[right]) == (3, 4)
    assert spec.axes["a.weight"] == ((left, right), None)
    assert spec.axes["a.bias"] == ((left, right),)
    assert spec.axes["b.weight"] == (None, left) and spec.axes["c.weight"] == (None, right)
    planted_recovery(Unequal(), spec)


class Branches(nn.Module):
    """Two branches of different widths concatenated with a fixed input slice between
    them, a norm over the concatenation; concatenated conv channels flattened."""

    def __init__(self, mixed: bool = False):
        super().__init__()
        self.mixed = mixed
        self.a, self.b = nn.Linear(5, 3), nn.Linear(5, 4)
        self.norm = nn.LayerNorm(9)
        self.c = nn.Linear(9, 6)
        self.conv_a, self.conv_b = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.d = nn.Linear(5 * 4 * 4 + (6 if mixed else 0), 2)
        self.e = nn.Linear(6, 2)

    def forward(self, x, image):
        h = torch.cat([torch.relu(self.a(x)), x[:, :2], torch.tanh(self.b(x))], dim=-1)
        h = torch.relu(self.c(self.norm(h)))
        maps = torch.cat([torch.relu(self.conv_a(image)), torch.relu(self.conv_b(image))], 1)
        if self.mixed:  # conv channels (blocks of 16) beside linear units (blocks of 1)
            return self.d(torch.cat([maps.flatten(1), h], dim=1)) + self.e(h)
        return self.d(maps.flatten(1)) + self.e(h)


INPUTS = (torch.randn(3, 5), torch.randn(3, 2, 4, 4))


def test_concatenations_are_direct_sums_with_fixed_parts_norms_and_flatten():
    torch.manual_seed(0)
    model = Branches()
    report = trace_report(model, INPUTS)
    spec = report.spec
    a, b, c = (spec.axes[f"{k}.weight"][0] for k in "abc")
    conv_a, conv_b = spec.axes["conv_a.weight"][0], spec.axes["conv_b.weight"][0]
    assert len({a, b, c, conv_a, conv_b}) == 5 and None not in {a, b, c, conv_a, conv_b}
    # the input slice is a fixed segment of 2 entries; the norm's weight is the same sum
    assert spec.axes["c.weight"] == (c, (a, 2, b))
    assert spec.axes["norm.weight"] == spec.axes["norm.bias"] == ((a, 2, b),)
    # the concatenated conv channels flattened: 16 positions per channel
    assert spec.axes["d.weight"] == (None, (conv_a, conv_b))
    assert spec.blocks["d.weight"] == (1, 16)
    assert report.checked_modes == ("eval", "train")
    planted_recovery(model, spec)


def test_a_direct_sum_needing_two_block_lengths_freezes_with_its_parts():
    """One axis holding conv channels (blocks of 16) and linear units (blocks of 1): the
    spec has one block length per axis, so that sum freezes, and its parts with it."""
    torch.manual_seed(0)
    report = trace_report(Branches(mixed=True), INPUTS)
    spec = report.spec
    assert spec.axes["d.weight"] == (None, None)
    assert report.frozen["d.weight"][1] == "a direct sum of groups with different block lengths"
    assert report.frozen["conv_a.weight"][0] == (
        "part of a frozen direct sum (a direct sum of groups with different block lengths)"
    )
    assert spec.axes["c.weight"][0] is None and spec.axes["e.weight"][1] is None
    assert spec.axes["a.weight"][0] is not None  # the first sum is untouched


def test_two_sums_cut_differently_freeze_their_class():
    class Mismatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 3)
            self.c, self.d = nn.Linear(4, 3), nn.Linear(4, 2)
            self.out = nn.Linear(5, 2)

        def forward(self, x):
            first = torch.cat([self.a(x), self.b(x)], -1)  # cut after 2
            second = torch.cat([self.c(x), self.d(x)], -1)  # cut after 3
            return self.out(torch.relu(first + second))

    report = trace_report(Mismatch(), torch.randn(3, 4))
    assert report.spec.axes["out.weight"] == (None, None)
    assert report.frozen["out.weight"][1] == "direct sums (cat/split) with different parts meet"
    assert report.frozen["a.weight"][0].startswith("part of a frozen direct sum")


def test_two_sums_cut_alike_move_their_parts_together():
    class Alike(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 3)
            self.c, self.d = nn.Linear(4, 2), nn.Linear(4, 3)
            self.out = nn.Linear(5, 2)

        def forward(self, x):
            first = torch.cat([self.a(x), self.b(x)], -1)
            second = torch.cat([self.c(x), self.d(x)], -1)
            return self.out(torch.relu(first + second))

    model = Alike()
    spec = trace(model, torch.randn(3, 4))
    assert spec.axes["a.weight"][0] == spec.axes["c.weight"][0]
    assert spec.axes["b.weight"][0] == spec.axes["d.weight"][0]
    assert spec.axes["out.weight"][1] == (spec.axes["a.weight"][0], spec.axes["b.weight"][0])
    planted_recovery(model, spec)


def test_the_check_moves_every_group_even_small_ones():
    """A 2-unit group stays put under half of all random permutations; the check draws
    again until it moves, so a wrong rule on a small group cannot pass by luck."""
    moving = sys.modules["lmckit.tracing.trace"]._moving_permutation
    spec = trace(Grouped(), torch.randn(4, 3, 6, 6))  # one group of 2 units
    for seed in range(20):
        perm = moving(spec, seed)
        assert all(not torch.equal(perm[g], torch.arange(n)) for g, n in spec.groups.items())


def test_vary_constants_varies_constant_tensors_only():
    """Constant floating tensors (a fresh model's gains and biases) are replaced by seeded
    values near them, signs kept; every other tensor is handed on as it is."""
    from lmckit.tracing.trace import vary_constants

    weights = torch.randn(4, 3)
    params = {
        "gain": torch.ones(6), "bias": torch.zeros(6), "var": torch.full((5,), 2.0),
        "w": weights, "count": torch.tensor(7), "ids": torch.zeros(4, dtype=torch.long),
        "one": torch.ones(1),
    }  # fmt: skip
    out = vary_constants(params, 0)
    for name in ("w", "count", "ids", "one"):
        assert out[name] is params[name]
    assert len(set(out["gain"].tolist())) == 6 and ((out["gain"] - 1).abs() <= 0.5).all()
    assert len(set(out["bias"].tolist())) == 6 and (out["bias"].abs() <= 0.1).all()
    assert ((out["var"] >= 1.0) & (out["var"] <= 3.0)).all()
    assert torch.equal(vary_constants(params, 0)["gain"], out["gain"])
    assert not torch.equal(vary_constants(params, 1)["gain"], out["gain"])


def test_sizes_computed_from_the_data_are_refused_by_name():
    """A boolean mask's selection has a size the data decides: the tracer says so instead
    of failing inside torch's symbolic shapes."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x)
            return self.b(h[h[:, 0] > 0])

    torch.manual_seed(0)
    with pytest.raises(SpecError, match="sizes computed from the data"):
        trace_report(Masked(), torch.randn(8, 4))


class _TrainOnlyMix(nn.Module):
    """Adds channel 0 to every channel in train mode only: the eval-mode trace cannot see
    it, so the train-mode check must catch it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x[:, :1] if self.training else x


def _train_only_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), _TrainOnlyMix(), nn.ReLU(), nn.Flatten(),
        nn.Linear(8, 4),
    ).eval()  # fmt: skip


def test_a_train_mode_failure_beside_a_batchnorm_of_two_values_names_the_batchnorm():
    """A BatchNorm that sees 2 values per channel (batch 2 at 1 × 1) makes a train-mode
    failure ambiguous (ResNet-50 on two 32 × 32 images fails on rounding alone): the error
    names the layer and its count, not an op rule. With 4 images the second BatchNorm sees
    4 values (still small); at 8 × 8 with 32 images it sees 32, and the same net's failure
    blames an op rule."""
    net = _train_only_net()
    with pytest.raises(SpecError, match=r"BatchNorm '5' normalises each channel over only 2 "):
        trace_report(net, torch.randn(2, 3, 8, 8))
    with pytest.raises(SpecError, match=r"over only 4 value"):
        trace_report(net, torch.randn(4, 3, 8, 8))
    with pytest.raises(SpecError, match="an op rule is wrong"):
        trace_report(net, torch.randn(32, 3, 8, 8))
