"""From the fused q/k/v projection to attention heads.

    qkv [B, N, 3 * H * D] -> q, k, v [B, H, N, D], q and k LayerNormed per head, then rotated

On CUDA one Triton kernel (`_heads_kernel.py`) does it in one pass over the projection,
where the compiled trunk would run five kernels a block (split, the two norms, the RoPE
products, a layout copy) for work that one pass over a frame's 6 MB covers. Elsewhere, and
for what the kernel does not
take (`_kernel_takes`), it is the plain PyTorch composition, the definition the kernel is
tested against.

Arithmetic as the modules': LayerNorm statistics in fp32, its result rounded to the tensor's
dtype; the rotation table rounded to that dtype, the rotation computed in fp32 and rounded
once (PyTorch's eager bf16 rounds each product too, so eager and fused differ by an ulp).
Under autocast (the sessions' bf16 mode) the modules keep the norms and the rotation in fp32
and q, k reach their consumers as fp32, each of which rounds them to the autocast dtype; the
kernel computes in fp32 and returns them already rounded to that dtype.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..attention.fused import HAS_TRITON, our_kernels_may_serve
from .rope import Rotary

__all__ = ["qkv_heads"]

def qkv_heads(
    qkv: torch.Tensor,
    num_heads: int,
    q_norm: nn.LayerNorm | None = None,
    k_norm: nn.LayerNorm | None = None,
    rotary: Rotary | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, H, N, D] of the projection qkv [B, N, 3 * H * D]: q, k normalised by
    q_norm / k_norm (LayerNorms over D), then rotated by `rotary` (if given)."""
    if _fused_ok(qkv, num_heads, q_norm, k_norm, rotary):
        # Under autocast the norms and the rotation run in fp32 and every consumer of q and k
        # (SDPA, the cache, our kernels) rounds them to the autocast dtype: the kernel does
        # the same arithmetic and rounds once, returning that dtype.
        return _qkv_heads_op(
            qkv,
            None if q_norm is None else q_norm.weight, None if q_norm is None else q_norm.bias,
            None if k_norm is None else k_norm.weight, None if k_norm is None else k_norm.bias,
            None if rotary is None else rotary.cos, None if rotary is None else rotary.sin,
            num_heads, q_norm.eps if q_norm is not None else 0.0, k_norm.eps if k_norm is not None else 0.0,
            rotary is not None and rotary.interleaved, 1 if rotary is None else rotary.axes,
            not torch.is_autocast_enabled("cuda"),
        )
    head_dim = qkv.shape[-1] // (3 * num_heads)
    q, k, v = qkv.unflatten(-1, (3, num_heads, head_dim)).permute(2, 0, 3, 1, 4).unbind(0)
    if q_norm is not None:
        q = q_norm(q)
    if k_norm is not None:
        k = k_norm(k)
    if rotary is not None:
        q, k = rotary.apply(q), rotary.apply(k)
    return q, k, v


def _table_strides(table: torch.Tensor, tokens: int) -> tuple[int, int] | None:
    """(batch stride, token stride) of a rotation table [N, D/2] or [B, 1, N, D/2]."""
    if table.stride(-1) != 1 or table.shape[-2] != tokens:
        return None
    if table.dim() == 2:
        return 0, table.stride(0)
    if table.dim() == 4 and table.shape[1] == 1:
        # One table for every batch row broadcasts (batch stride 0).
        return (table.stride(0) if table.shape[0] > 1 else 0), table.stride(2)
    return None


def _fused_ok(qkv, num_heads, q_norm, k_norm, rotary) -> bool:
    """Whether the Triton kernel computes this case (and there is more to do than a view)."""
    return our_kernels_may_serve(qkv) and _kernel_takes(qkv, num_heads, q_norm, k_norm, rotary)


def _kernel_takes(qkv, num_heads, q_norm, k_norm, rotary) -> bool:
    """The shapes, dtypes and modules the kernel computes, whatever the device."""
    if not (qkv.dim() == 3 and qkv.stride(-1) == 1):
        return False
    if qkv.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if torch.is_autocast_enabled("cuda") and qkv.dtype != torch.get_autocast_dtype("cuda"):
        return False
    head_dim, rest = divmod(qkv.shape[-1], 3 * num_heads)
    if rest or head_dim & (head_dim - 1) or head_dim < 16:
        return False
    if (q_norm is None) != (k_norm is None) or (q_norm is None and rotary is None):
        return False
    for norm in (q_norm, k_norm):
        if norm is not None and (
            norm.weight is None or norm.bias is None or tuple(norm.normalized_shape) != (head_dim,)
            or norm.weight.dtype not in (qkv.dtype, torch.float32)
        ):
            return False
    if rotary is not None:
        strides = _table_strides(rotary.cos, qkv.shape[1])
        if strides is None or strides != _table_strides(rotary.sin, qkv.shape[1]):
            return False
        if rotary.cos.shape[-1] * 2 != head_dim or (not rotary.interleaved and head_dim % (2 * rotary.axes)):
            return False
        if rotary.cos.dim() == 4 and rotary.cos.shape[0] not in (1, qkv.shape[0]):
            return False
    return True


def launch_qkv_heads(
    qkv: torch.Tensor,
    q_weight: Optional[torch.Tensor], q_bias: Optional[torch.Tensor],
    k_weight: Optional[torch.Tensor], k_bias: Optional[torch.Tensor],
    cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
    num_heads: int, q_eps: float, k_eps: float, interleaved: bool, axes: int, round_intermediates: bool = True,
    *, launch=None, block_t: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Allocate q, k, v and run the kernel (`launch` wraps it for torch.compile).
    round_intermediates: round the LayerNorm's result and the rotation table to qkv's dtype
    (as the modules do in that dtype); False: fp32 until the one rounding at the end.
    block_t: tokens a program (a power of two; None: `_block_tokens`)."""
    import triton

    from ._heads_kernel import _qkv_heads_fwd

    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    q, k, v = (qkv.new_empty(batch, num_heads, tokens, head_dim) for _ in range(3))
    has_norm = q_weight is not None
    s_cos_b, s_cos_t = _table_strides(cos, tokens) if cos is not None else (0, 0)
    block_t = block_t or _block_tokens(head_dim)
    grid = (triton.cdiv(tokens, block_t), num_heads, batch)
    kernel = _qkv_heads_fwd if launch is None else launch(_qkv_heads_fwd)
    kernel[grid](
        qkv, q, k, v,
        q_weight if has_norm else qkv, q_bias if has_norm else qkv,
        k_weight if has_norm else qkv, k_bias if has_norm else qkv,
        cos if cos is not None else qkv, sin if sin is not None else qkv,
        tokens, num_heads, q_eps, k_eps, qkv.stride(0), qkv.stride(1), s_cos_b, s_cos_t,
        HEAD_DIM=head_dim, BLOCK_T=block_t, HAS_NORM=has_norm, HAS_ROPE=cos is not None,
        INTERLEAVED=interleaved, AXES=axes, ROUND_INTERMEDIATES=round_intermediates, num_warps=4,
    )
    return q, k, v


def _block_tokens(head_dim: int) -> int:
    """Tokens a program: 32 rows of 64 channels keep a thread's share of q, k and the table at
    16 values each (about 70 registers on sm90, no spills) and give a 977-token frame of 16
    heads ~500 programs, enough to keep every multiprocessor's loads in flight."""
    return max(8, 2048 // head_dim)


def _register_op():
    """`launch_qkv_heads` as the custom op mapstream::qkv_heads, so torch.compile traces the
    kernel into the compiled graph instead of breaking the graph around it."""
    from torch.library import triton_op, wrap_triton

    @triton_op("mapstream::qkv_heads", mutates_args=())
    def qkv_heads_op(
        qkv: torch.Tensor,
        q_weight: Optional[torch.Tensor], q_bias: Optional[torch.Tensor],
        k_weight: Optional[torch.Tensor], k_bias: Optional[torch.Tensor],
        cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
        num_heads: int, q_eps: float, k_eps: float, interleaved: bool, axes: int, round_intermediates: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return launch_qkv_heads(
            qkv, q_weight, q_bias, k_weight, k_bias, cos, sin, num_heads, q_eps, k_eps, interleaved, axes,
            round_intermediates, launch=wrap_triton,
        )

    return qkv_heads_op


_qkv_heads_op = _register_op() if HAS_TRITON else None
