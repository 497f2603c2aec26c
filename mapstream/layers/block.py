"""The pre-norm transformer block shared by the ViT, the aggregator and the camera head.

    x = x + ls1 * proj(attention(norm1(x)))
    x = x + ls2 * fc2(gelu(fc1(norm2(x))))

The attention step is split in two (`attention_inputs`, `attention_output`) so that a
caller that owns a KV cache can run the attention itself between them; `forward` is plain
self-attention over the tokens it is given. The caller-run form's linear layers each run with
the norm before them or the residual add after them through `row_linear`, which for a single
row (the camera head's token) is one kernel and otherwise exactly the composition above.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..attention.dense import dense_attention
from .heads import qkv_heads
from .linear_gelu import linear_gelu
from .rope import Rotary
from .row_linear import linear_residual, norm_linear

__all__ = ["Attention", "Block", "LayerScale", "Mlp", "layer_norm_bound"]


def layer_norm_bound(norm: nn.LayerNorm) -> float:
    """An upper bound of the Euclidean norm of `norm`'s output over its D features, whatever
    the input: the normalised vector has norm sqrt(D * var / (var + eps)) <= sqrt(D), the
    weight stretches it by at most max|w| and the bias adds at most |b|. A rotation of
    feature pairs afterwards (RoPE) keeps it. Reads the parameters (a device sync when they
    live on a GPU): callers keep the value."""
    dim = norm.normalized_shape[-1]
    bound = dim ** 0.5
    with torch.no_grad():
        if norm.weight is not None:
            bound *= float(norm.weight.detach().abs().max())
        if norm.bias is not None:
            bound += float(norm.bias.detach().float().norm())
    return bound


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """Attention output [B, heads, N, head_dim] -> [B, N, heads * head_dim]."""
    return out.transpose(1, 2).flatten(-2)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float = 1.0) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init_value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, out_dim: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim or dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(linear_gelu(x, self.fc1))


class Attention(nn.Module):
    """Multi-head attention projections with optional per-head q/k LayerNorm.

    Heads are laid out [B, heads, N, head_dim]; q/k are normalised before RoPE.
    """

    def __init__(self, dim: int, num_heads: int, *, qk_norm: bool = False, qk_norm_eps: float = 1e-5) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        if qk_norm:
            self.q_norm = nn.LayerNorm(self.head_dim, eps=qk_norm_eps)
            self.k_norm = nn.LayerNorm(self.head_dim, eps=qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.proj = nn.Linear(dim, dim)

    def key_norm_bound(self) -> float | None:
        """An upper bound of every key's Euclidean norm (keys leave k_norm, then RoPE, which
        keeps norms), or None without qk-norm. A hint for the attention backends."""
        return None if self.k_norm is None else layer_norm_bound(self.k_norm)

    def heads(self, x: torch.Tensor, rotary: Rotary | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, N, dim] -> q, k, v [B, heads, N, head_dim] (q, k normalised and rotated)."""
        return self.split_heads(self.qkv(x), rotary)

    def split_heads(self, qkv: torch.Tensor, rotary: Rotary | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection qkv [B, N, 3 * dim] -> q, k, v [B, heads, N, head_dim]."""
        return qkv_heads(qkv, self.num_heads, self.q_norm, self.k_norm, rotary)

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output [B, heads, N, head_dim] -> projected [B, N, dim]."""
        return self.proj(merge_heads(out))

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        q, k, v = self.heads(x, rotary)
        return self.merge(dense_attention(q, k, v))


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-5,
        qk_norm: bool = False,
        layer_scale_init: float = 1.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm)
        self.ls1 = LayerScale(dim, layer_scale_init)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, layer_scale_init)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rotary))
        return self.feed_forward(x)

    def compile_parts(self, compile: Callable[[Callable], Callable], *, whole: bool) -> None:
        """Use compiled forms of the halves around an attention run by the caller and, with
        `whole`, of the block itself (a block whose attention it runs itself). Called once,
        by the network that owns the block, when it is built to be compiled."""
        self.attention_inputs = compile(self.attention_inputs)
        self.attention_output = compile(self.attention_output)
        if whole:
            self.forward = compile(self.forward)

    def attention_inputs(
        self, x: torch.Tensor, rotary: Rotary | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, heads, N, head_dim] of x [B, N, dim] (for attention run by the caller)."""
        return self.attn.split_heads(norm_linear(x, self.norm1, self.attn.qkv), rotary)

    def attention_output(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Finish the block given the attention result [B, heads, N, head_dim] for x."""
        x = linear_residual(merge_heads(attended), self.attn.proj, x, self.ls1.gamma)
        return self.feed_forward(x)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = norm_linear(x, self.norm2, self.mlp.fc1, gelu=True)
        return linear_residual(hidden, self.mlp.fc2, x, self.ls2.gamma)
