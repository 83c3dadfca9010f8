"""The tracer reads a linear map the same whichever way the code spells it: ``F.linear``,
``h @ w.t()``, ``h @ w.T``, ``h @ w.mT``, ``h @ w.transpose(0, 1)``, ``h @ w.permute(1, 0)``,
``torch.matmul``, ``torch.addmm``, or a weight stored ``(in, out)`` read as ``h @ w``. A
LayerNorm'd residual stream read by any of them is found orthogonal (mean-free), its gain
folded into that reader — and a random element of the group found keeps the outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmckit.tracing import symmetry_kinds, trace
from lmckit.transform import Transform, fold_norms

FORMS = {
    "F.linear": lambda h, w, b: nn.functional.linear(h, w, b),
    "h @ w.t()": lambda h, w, b: h @ w.t() + b,
    "h @ w.T": lambda h, w, b: h @ w.T + b,
    "h @ w.mT": lambda h, w, b: h @ w.mT + b,
    "h @ w.transpose(0, 1)": lambda h, w, b: h @ w.transpose(0, 1) + b,
    "h @ w.transpose(-1, -2)": lambda h, w, b: h @ w.transpose(-1, -2) + b,
    "h @ w.permute(1, 0)": lambda h, w, b: h @ w.permute(1, 0) + b,
    "torch.matmul(h, w.T)": lambda h, w, b: torch.matmul(h, w.T) + b,
    "h @ w.t().t().t()": lambda h, w, b: h @ w.t().t().t() + b,
}


class StreamBlock(nn.Module):
    """embed → pre-LN block whose first layer is written as ``form`` → LN → head."""

    def __init__(self, form: str, dim: int = 8, hidden: int = 16, stored_in_out: bool = False):
        super().__init__()
        self.form, self.stored_in_out = form, stored_in_out
        self.embed = nn.Linear(4, dim)
        self.norm = nn.LayerNorm(dim)
        shape = (dim, hidden) if stored_in_out else (hidden, dim)
        self.w = nn.Parameter(torch.randn(shape) / dim**0.5)
        self.b = nn.Parameter(torch.randn(hidden))
        self.out = nn.Linear(hidden, dim)
        self.final = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        z = self.embed(x)
        h = self.norm(z)
        if self.stored_in_out:
            u = h @ self.w + self.b
        elif self.form == "torch.addmm":
            u = torch.addmm(self.b, h.reshape(-1, h.shape[-1]), self.w.t()).reshape(
                *h.shape[:-1], -1
            )
        else:
            u = FORMS[self.form](h, self.w, self.b)
        z = z + self.out(torch.relu(u))
        return self.head(self.final(z))


def _randomized(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("norm", "final")):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.4 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize(
    "form, stored_in_out",
    [*((f, False) for f in FORMS), ("torch.addmm", False), ("h @ w", True)],
)
@pytest.mark.parametrize("shape", [(5, 4), (2, 5, 4)])
def test_every_spelling_of_a_linear_reader_is_read_alike(form, stored_in_out, shape):
    torch.manual_seed(0)
    model = _randomized(StreamBlock(form, stored_in_out=stored_in_out).double().eval())
    x = torch.randn(*shape, dtype=torch.float64)
    report = symmetry_kinds(model, x, trace(model, x))
    spec = report.spec
    stream = spec.axes["w"][0 if stored_in_out else 1]
    assert spec.kind(stream) == "orthogonal-mean-free", (form, report)
    assert spec.folds["norm.weight"] == (("w", 0 if stored_in_out else 1),)
    params = {k: v.detach() for k, v in model.state_dict().items()}
    folded = fold_norms(spec, params)
    moved = Transform.random(spec, 0).apply(folded)
    with torch.no_grad():
        ref = model(x)
        outs = [torch.func.functional_call(model, p, (x,)) for p in (folded, moved)]
    for out in outs:  # the fold, then a random element of the group, keep the outputs
        assert ((ref - out).abs().max() / ref.abs().max()).item() < 1e-10
