"""Transformers for the zoo: a ViT for small images, a pre-LN encoder classifier and a small
decoder-only language model.

Both are pre-LN (``x + attn(LN(x))``, ``x + mlp(LN(x))``) with separate query, key and value
projections, so their permutation spec — traced with :func:`lmckit.tracing.trace`, not written
by hand — has one group for the residual stream, one per MLP hidden layer, and one per
attention layer permuting whole heads (blocks of the head dimension in Q, K, V and O).

* :class:`ViT` (Dosovitskiy et al. 2021, small): ``patch × patch`` patches embedded by a
  strided convolution, a learned CLS token and learned positions, ``depth`` blocks, a final
  LayerNorm and a linear head on the CLS token. For 28×28 Fashion-MNIST: patch 7, 16
  patches + CLS.
* :class:`GPT`: a decoder-only language model (GPT-2's layout at a small size): token
  embeddings and learned positions, ``depth`` causal blocks, a final LayerNorm and a linear
  head giving next-token logits at every position.
* :class:`TransformerClassifier`: the rows of an image (or any ``(length, features)``
  sequence) as tokens, a linear embedding, learned positions, ``depth`` blocks, mean pooling
  and a linear head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ModelConfigError, ParamsError
from lmckit.options import check_arguments
from lmckit.perm import PermutationSpec

_TRACED_SPECS: dict[tuple[str, str, tuple[int, ...]], PermutationSpec] = {}
_TRACED_SPECS_KEPT = 16


def _plain(value: object) -> bool:
    return isinstance(value, (bool, int, float, str)) or (
        isinstance(value, tuple) and all(isinstance(v, (bool, int, float, str)) for v in value)
    )


class Attention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` and output ``o``;
    ``causal``: each position attends to itself and the positions before it only."""

    def __init__(self, dim: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        n, length, dim = x.shape

        def split(t: Tensor) -> Tensor:  # (N, L, D) → (N, heads, L, D / heads)
            return t.view(n, length, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(y.transpose(1, 2).reshape(n, length, dim))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(LN(x))`` then ``x + mlp(LN(x))`` (GELU)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, causal: bool = False) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, causal)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, mlp_dim), nn.Linear(mlp_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _check(dim: int, heads: int, depth: int, mlp_dim: int, **more: int) -> None:
    sizes = {"dim": dim, "heads": heads, "depth": depth, "mlp_dim": mlp_dim, **more}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
    if dim % heads:
        raise ModelConfigError(f"dim {dim} is not divisible by heads {heads}")


class _Transformer(nn.Module):
    """What both models share: the blocks, the final norm and head, the spec by tracing."""

    config: dict
    example_shape: tuple[int, ...]

    def _add_trunk(
        self, dim: int, depth: int, heads: int, mlp_dim: int, num_classes: int, causal=False
    ):
        """The blocks, the final norm and the head (after the model's own embedding, so the
        initialisation draws in that order)."""
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_dim, causal) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def permutation_spec(self) -> PermutationSpec:
        """Traced from the model's own graph (and verified): see :mod:`lmckit.tracing`. A
        trace takes about half a second and an experiment asks for the spec of every model
        it loads, so specs are kept per architecture: the module tree as ``repr`` prints it
        (every layer's type and shape), every module's plain settings (heads, causal) and
        the example input's shape."""
        from lmckit.tracing import trace

        settings = tuple(
            (name, tuple(sorted((k, repr(v)) for k, v in vars(m).items() if _plain(v))))
            for name, m in self.named_modules()
        )
        key = (repr(self), repr(settings), tuple(self.example_shape))
        spec = _TRACED_SPECS.get(key)
        if spec is None:
            device = next(self.parameters()).device
            spec = trace(self, self.example_input().to(device))
            if len(_TRACED_SPECS) >= _TRACED_SPECS_KEPT:
                _TRACED_SPECS.pop(next(iter(_TRACED_SPECS)))
            _TRACED_SPECS[key] = spec
        return spec

    def example_input(self) -> Tensor:
        """Two seeded example inputs, as the model takes them."""
        return torch.randn(2, *self.example_shape, generator=torch.Generator().manual_seed(0))


class ViT(_Transformer):
    """Vision transformer.

    Args:
        image_size: input height and width (square images).
        patch_size: side of a patch (must divide ``image_size``).
        in_channels, num_classes: input channels, output logits.
        dim, depth, heads, mlp_dim: width of the residual stream, number of blocks,
            attention heads (must divide ``dim``), MLP hidden width.

    Input ``(N, in_channels, image_size, image_size)``; output ``(N, num_classes)``.
    """

    def __init__(
        self,
        image_size: int = 28,
        patch_size: int = 7,
        in_channels: int = 1,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_dim: int = 128,
    ) -> None:
        try:
            check_arguments(ViT.__init__, locals(), where="ViT: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        _check(dim, heads, depth, mlp_dim)
        if image_size % patch_size:
            raise ModelConfigError(f"patch_size {patch_size} does not divide {image_size}")
        tokens = (image_size // patch_size) ** 2 + 1
        self.patch = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens, dim))
        self._add_trunk(dim, depth, heads, mlp_dim, num_classes)
        self.example_shape = (in_channels, image_size, image_size)
        self.config = {
            "name": "vit",
            "image_size": image_size,
            "patch_size": patch_size,
            "in_channels": in_channels,
            "num_classes": num_classes,
            "dim": dim,
            "depth": depth,
            "heads": heads,
            "mlp_dim": mlp_dim,
        }

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # (N, patches, dim)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class TransformerClassifier(_Transformer):
    """Pre-LN transformer encoder over a sequence of ``length`` tokens of ``in_dim``
    features (an image's rows: ``(N, 1, H, W)`` is read as ``H`` tokens of ``W``), mean
    pooled into a linear head. Output ``(N, num_classes)``."""

    def __init__(
        self,
        in_dim: int = 28,
        length: int = 28,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_dim: int = 128,
    ) -> None:
        try:
            check_arguments(TransformerClassifier.__init__, locals(), where="Transformer: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        _check(dim, heads, depth, mlp_dim)
        self.embed = nn.Linear(in_dim, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(1, length, dim))
        self._add_trunk(dim, depth, heads, mlp_dim, num_classes)
        self.example_shape = (length, in_dim)
        self.config = {
            "name": "transformer",
            "in_dim": in_dim,
            "length": length,
            "num_classes": num_classes,
            "dim": dim,
            "depth": depth,
            "heads": heads,
            "mlp_dim": mlp_dim,
        }

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(len(x), *self.example_shape)  # (N, 1, H, W) → (N, H, W)
        x = self.embed(x) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


class LanguageModel(_Transformer):
    """What the zoo's language models share: ``config`` holds ``vocab_size`` and ``context``;
    the input is ``(N, L)`` token ids with ``L ≤ context``."""

    def example_input(self) -> Tensor:
        """Two seeded sequences of random token ids ``(2, context)``."""
        vocab, length = self.config["vocab_size"], self.config["context"]
        return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(0))

    def _check_tokens(self, x: Tensor) -> int:
        """The length of ``x``; a ``ValueError`` naming what is wrong with it."""
        if x.ndim != 2 or x.dtype.is_floating_point or x.dtype == torch.bool:
            raise ValueError(
                f"{type(self).__name__} takes (N, L) integer token ids, got {x.dtype} "
                f"{tuple(x.shape)}"
            )
        context = self.config["context"]
        if x.shape[1] > context:
            raise ValueError(f"{x.shape[1]} tokens exceed the context of {context}")
        return x.shape[1]


class GPT(LanguageModel):
    """Decoder-only language model (GPT-2's pre-LN layout, small): ``tokens`` embedded and
    added to learned positions, ``depth`` causal blocks, a final LayerNorm and an untied
    linear head.

    Args:
        vocab_size: number of token ids (256 for bytes).
        context: sequence length the positions are learned for (inputs may be shorter).
        dim, depth, heads, mlp_dim: residual stream width, blocks, heads (must divide
            ``dim``), MLP hidden width.

    Input ``(N, L)`` token ids, ``L ≤ context``; output ``(N, L, vocab_size)``: at position
    ``t`` the logits of token ``t + 1`` given tokens ``0 … t``. Losses over it are per token
    (:func:`lmckit.functional.per_token`), so the mean loss is the log-perplexity.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        context: int = 128,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_dim: int = 512,
    ) -> None:
        try:
            check_arguments(GPT.__init__, locals(), where="GPT: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        _check(dim, heads, depth, mlp_dim, vocab_size=vocab_size, context=context)
        self.tokens = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.tokens.weight, std=0.02)
        self.pos = nn.Parameter(0.02 * torch.randn(1, context, dim))
        self._add_trunk(dim, depth, heads, mlp_dim, vocab_size, causal=True)
        self.example_shape = (context,)
        self.config = {
            "name": "gpt",
            "vocab_size": vocab_size,
            "context": context,
            "dim": dim,
            "depth": depth,
            "heads": heads,
            "mlp_dim": mlp_dim,
        }

    def forward(self, x: Tensor) -> Tensor:
        length = self._check_tokens(x)
        x = self.tokens(x) + self.pos[:, :length]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
