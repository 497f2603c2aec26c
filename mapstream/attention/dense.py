"""Attention of a frame's tokens over themselves: the ViT's blocks and the frame blocks.

`dense_attention(q, k, v)` is `F.scaled_dot_product_attention(q, k, v)` (no mask, default
scale). For one frame in half precision on CUDA — every streaming step — it runs our flash
kernel (`triton_flash`, pointer loads) instead: inside a captured graph cuDNN's kernel
leaves the GPU idle before it starts, and its [B, H, N, D] output needs a layout copy before
the output projection, 48 calls a frame; ours takes about as long a call but needs neither,
writing token-major [N, H, D], the projection's layout.
It is registered as the custom op `mapstream::dense_attention`, so torch.compile traces it
into the compiled blocks. Everything else is PyTorch's SDPA: CPU, fp32 (also fp32 q, k under
autocast, which SDPA rounds to the autocast dtype itself), batches of frames such as the
scale phase.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .fused import HAS_TRITON, our_kernels_may_serve

__all__ = ["dense_attention"]

def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v for q, k, v [B, H, N, D] -> [B, H, N, D]."""
    if _kernel_ok(q, k, v):
        return _dense_op(q[0], k[0], v[0]).transpose(0, 1).unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v)


def _kernel_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    if not (our_kernels_may_serve(q) and _kernel_takes(q, k, v)):
        return False
    return torch.cuda.get_device_capability(q.device) >= (8, 0)


def _kernel_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """The shapes and dtypes the kernel computes, whatever the device: one frame, half
    precision, equal heads and head dims, K and V of one length, unit last strides."""
    if not (q.dim() == 4 and q.shape[0] == 1):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or not (k.dtype == v.dtype == q.dtype):
        return False
    if k.shape != v.shape or k.shape[0] != 1 or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
        return False
    return q.shape[3] in (16, 32, 64, 128) and k.shape[2] > 0 and all(t.stride(-1) == 1 for t in (q, k, v))


def _register_op():
    from torch.library import triton_op, wrap_triton

    from .triton_flash import KernelConfig, flash_attention

    @triton_op("mapstream::dense_attention", mutates_args=())
    def dense_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [H, N, D], k/v [H, T, D] -> token-major [N, H, D]."""
        out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])
        flash_attention(q, k, v, out=out, config=KernelConfig(), launch=wrap_triton)
        return out

    return dense_op


_dense_op = _register_op() if HAS_TRITON else None
