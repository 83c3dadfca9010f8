"""A small Llama-style decoder for the zoo: the layout of today's open language models.

:class:`Llama` is what Llama, Mistral and Qwen2 share, at a size that trains on two CPU cores:
token embeddings without learned positions, ``depth`` pre-norm blocks of grouped-query
attention with rotary position embeddings (rotate-half pairs ``(j, j + d/2)`` over the whole
head, base ``rope_base``) and a SwiGLU MLP (``down(silu(gate(x)) * up(x))``), RMSNorm
everywhere (a gain, no bias, no mean), no biases in any projection, a final RMSNorm and an
untied head. Written with the same ops as Hugging Face's ``LlamaForCausalLM`` (rotate-half,
``repeat_kv`` by expand and reshape) so that its traced spec is what a user's Llama gets: the
residual stream (orthogonal once the RMSNorm gains are folded), each MLP's hidden units, and per
attention layer the key/value heads with their query heads, the rotary query/key pairs (scaled
rotations) and each key/value head's value dimensions (see :mod:`lmckit.tracing`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmckit.errors import ModelConfigError, ParamsError
from lmckit.models.transformer import LanguageModel, _check
from lmckit.options import check_arguments


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x²) + eps)`` over the last axis (Zhang & Sennrich 2019), as
    Llama computes it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GroupedQueryAttention(nn.Module):
    """Causal attention of ``heads`` query heads on ``kv_heads`` key/value heads (each shared
    by ``heads / kv_heads`` consecutive query heads), rotary embeddings on queries and keys."""

    def __init__(self, dim: int, heads: int, kv_heads: int, context: int, rope_base: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        inverse = rope_base ** -(torch.arange(0, self.head_dim, 2).double() / self.head_dim)
        angles = torch.outer(torch.arange(context).double(), inverse)
        angles = torch.cat((angles, angles), dim=-1)  # (context, head_dim), rotate-half layout
        # not part of the state: rebuilt from the configuration, so checkpoints hold weights
        # only; kept in float64 and cast to the input's precision, so that a float64 twin
        # (the tracer's check) computes them exactly
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        n, length, dim = x.shape
        d, group = self.head_dim, self.heads // self.kv_heads
        q = self.q(x).view(n, length, self.heads, d).transpose(1, 2)
        k = self.k(x).view(n, length, self.kv_heads, d).transpose(1, 2)
        v = self.v(x).view(n, length, self.kv_heads, d).transpose(1, 2)
        cos, sin = self.cos[:length].to(x.dtype), self.sin[:length].to(x.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k[:, :, None].expand(n, self.kv_heads, group, length, d)
        v = v[:, :, None].expand(n, self.kv_heads, group, length, d)
        k = k.reshape(n, self.heads, length, d)
        v = v.reshape(n, self.heads, length, d)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(n, length, dim))


class LlamaBlock(nn.Module):
    """``x + attn(RMSNorm(x))`` then ``x + down(silu(gate(h)) * up(h))``, ``h = RMSNorm(x)``."""

    def __init__(
        self, dim: int, heads: int, kv_heads: int, mlp_dim: int, context: int, rope_base: float
    ) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = GroupedQueryAttention(dim, heads, kv_heads, context, rope_base)
        self.norm2 = RMSNorm(dim)
        self.gate = nn.Linear(dim, mlp_dim, bias=False)
        self.up = nn.Linear(dim, mlp_dim, bias=False)
        self.down = nn.Linear(mlp_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(LanguageModel):
    """Llama-style decoder-only language model (grouped-query rotary attention, SwiGLU,
    RMSNorm), small.

    Args:
        vocab_size: number of token ids (256 for bytes).
        context: longest sequence (the rotary tables are built for it).
        dim, depth: residual stream width, blocks.
        heads, kv_heads: query heads (must divide ``dim``; the head size ``dim / heads`` must
            be even for the rotary pairs) and key/value heads (must divide ``heads``).
        mlp_dim: SwiGLU hidden width.
        rope_base: the rotary base (pair ``j`` of a head turns by ``t · base^(−2j/d)`` at
            position ``t``).

    Input ``(N, L)`` token ids, ``L ≤ context``; output ``(N, L, vocab_size)``: at position
    ``t`` the logits of token ``t + 1`` given tokens ``0 … t``.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        context: int = 128,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        kv_heads: int = 2,
        mlp_dim: int = 344,
        rope_base: float = 10000.0,
    ) -> None:
        try:
            check_arguments(Llama.__init__, locals(), where="Llama: ")
        except ParamsError as exc:
            raise ModelConfigError(str(exc)) from None
        super().__init__()
        _check(
            dim, heads, depth, mlp_dim, kv_heads=kv_heads, vocab_size=vocab_size, context=context
        )
        if heads % kv_heads:
            raise ModelConfigError(f"kv_heads {kv_heads} does not divide heads {heads}")
        if (dim // heads) % 2:
            raise ModelConfigError(
                f"the head size dim / heads = {dim // heads} must be even (rotary pairs)"
            )
        if isinstance(rope_base, bool) or not rope_base > 1:
            raise ModelConfigError(f"rope_base must be a number above 1, got {rope_base!r}")
        self.tokens = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.tokens.weight, std=0.02)
        self.blocks = nn.ModuleList(
            LlamaBlock(dim, heads, kv_heads, mlp_dim, context, float(rope_base))
            for _ in range(depth)
        )
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.example_shape = (context,)
        self.config = {
            "name": "llama",
            "vocab_size": vocab_size,
            "context": context,
            "dim": dim,
            "depth": depth,
            "heads": heads,
            "kv_heads": kv_heads,
            "mlp_dim": mlp_dim,
            "rope_base": float(rope_base),
        }

    def forward(self, x: Tensor) -> Tensor:
        self._check_tokens(x)
        x = self.tokens(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
