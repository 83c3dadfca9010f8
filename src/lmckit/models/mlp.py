"""Multi-layer perceptron: the papers' 3×512 ReLU MLP and the width study's variants."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ModelConfigError, ParamsError
from lmckit.models._builder import SpecBuilder
from lmckit.models.norms import check_norm, make_norm
from lmckit.options import check_arguments
from lmckit.perm import PermutationSpec


class MLP(nn.Module):
    """``in_dim → hidden[0] → … → hidden[-1] → out_dim`` with ReLU (inputs are flattened).

    Each hidden layer is ``Linear → [norm] → ReLU``. With ``skip=True`` every hidden layer
    after the first adds its input to its output (``h ← h + ReLU(norm(W h + b))``), as in the
    width study's skip-connection MLP; all hidden layers then share one residual stream and
    hence one permutation group, so their widths must be equal.

    Args:
        in_dim: number of input features (inputs of shape ``(N, ...)`` are flattened).
        hidden: widths of the hidden layers.
        out_dim: number of outputs (logits).
        bias: whether the Linear layers have biases.
        norm: ``None``, ``"batch"`` (BatchNorm1d) or ``"layer"`` (LayerNorm) after each
            hidden Linear.
        skip: residual connections between hidden layers.

    Permutation groups: ``hidden{i}`` per hidden layer, or a single ``stream`` with ``skip``.
    """

    def __init__(
        self,
        in_dim: int = 784,
        hidden: Sequence[int] = (512, 512, 512),
        out_dim: int = 10,
        bias: bool = True,
        norm: str | None = None,
        skip: bool = False,
    ) -> None:
        try:
            check_arguments(MLP.__init__, locals(), where="MLP: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        hidden = [int(h) for h in hidden]
        check_norm(norm)
        if not hidden or min(hidden) < 1 or in_dim < 1 or out_dim < 1:
            raise ModelConfigError(
                f"MLP needs in_dim, out_dim ≥ 1 and at least one hidden width ≥ 1; got "
                f"in_dim={in_dim}, hidden={hidden}, out_dim={out_dim}"
            )
        if skip and len(set(hidden)) > 1:
            raise ModelConfigError(f"skip=True needs equal hidden widths, got {hidden}")
        self.config = {
            "name": "mlp",
            "in_dim": int(in_dim),
            "hidden": hidden,
            "out_dim": int(out_dim),
            "bias": bool(bias),
            "norm": norm,
            "skip": bool(skip),
        }
        widths = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(
            nn.Linear(widths[i], widths[i + 1], bias=bias) for i in range(len(widths) - 1)
        )
        norms = [make_norm(norm, h, conv=False) for h in hidden]
        self.norms = nn.ModuleList(norms) if norm is not None else None
        self.skip = skip
        # Identity taps mark each hidden representation for activation matching; they hold
        # no state, so the state_dict is unchanged.
        self.taps = nn.ModuleList(nn.Identity() for _ in hidden)

    def forward(self, x: Tensor) -> Tensor:
        h = x.flatten(1)
        for i, layer in enumerate(self.layers[:-1]):
            z = layer(h)
            if self.norms is not None:
                z = self.norms[i](z)
            z = F.relu(z)
            h = self.taps[i](h + z if self.skip and i > 0 else z)
        return self.layers[-1](h)

    def activation_taps(self) -> dict[str, list[str]]:
        """Group -> modules whose outputs ``(N, n)`` are that group's post-ReLU units."""
        spec_groups = list(self.permutation_spec().groups)
        if self.skip:
            return {spec_groups[0]: [f"taps.{i}" for i in range(len(self.taps))]}
        return {g: [f"taps.{i}"] for i, g in enumerate(spec_groups)}

    def layerwise_layers(self) -> list[dict]:
        """Per weight layer (``lmckit.analysis.layerwise``): its output tap, ReLU input and
        Linear module; the logits last."""
        n = len(self.layers) - 1
        layers = [
            {
                "name": f"layer{i + 1}",
                "depth": i + 1,
                "post": f"taps.{i}",
                "pre": f"norms.{i}" if self.norms is not None else f"layers.{i}",
                "linear": f"layers.{i}",
            }
            for i in range(n)
        ]
        return [*layers, {"name": "logits", "depth": n + 1, "post": "", "linear": f"layers.{n}"}]

    def permutation_spec(self) -> PermutationSpec:
        """This MLP's spec, built from its configuration."""
        b = SpecBuilder()
        n_hidden = len(self.layers) - 1
        names = [
            b.group("stream" if self.skip else f"hidden{i}", layer.out_features)
            for i, layer in enumerate(self.layers[:-1])
        ]
        for i, layer in enumerate(self.layers):
            out = names[i] if i < n_hidden else None
            inp = names[i - 1] if i > 0 else None
            b.dense(f"layers.{i}", layer, out=out, inp=inp)
            if self.norms is not None and i < n_hidden:
                b.norm(f"norms.{i}", self.norms[i], names[i])
        return b.build()
