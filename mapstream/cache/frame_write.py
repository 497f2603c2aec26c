"""Writing one step's keys and values into a cache layer:

    kv[0, :, s : s + P] = k      kv[1, :, s : s + P] = v      (kv [2, H, T, D]; k, v [H, P, D])

PyTorch does it as two strided copies (or two `index_copy_` when s lives on the device, in
captured graphs), whose non-contiguous destination keeps them off its vectorized copy
kernel, twice per layer and step, for the aggregator's frames and the camera head's single
token alike. On CUDA one Triton kernel
writes both with whole-row vector stores; elsewhere, and inside `plain_pytorch()`, the
PyTorch copies, which the kernel is tested against.

`start` is the first token index as an int, or a device tensor holding the P consecutive
indices (only its first is read by the kernel), which a captured graph can follow.
"""
from __future__ import annotations

import torch

from ..attention.fused import our_kernels_may_serve
from .fp8 import pack_rows

__all__ = ["write_frame_kv"]


def write_frame_kv(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor) -> None:
    """Store k, v [H, P, D] at tokens start .. start + P - 1 of the layer storage kv [2, H, T, D]
    (converted to kv's dtype; a uint8 storage [2, H, T, D + 4] takes them as packed FP8 rows,
    `mapstream.cache.fp8`)."""
    if kv.dtype == torch.uint8 and k.dtype != torch.uint8:
        k, v = pack_rows(k), pack_rows(v)
    if kv.dim() != 4 or kv.shape[0] != 2 or k.shape != v.shape or k.dim() != 3 or k.shape[::2] != kv.shape[1::2]:
        raise ValueError(f"cannot write k {list(k.shape)}, v {list(v.shape)} into a layer of shape {list(kv.shape)}")
    if our_kernels_may_serve(kv) and _kernel_takes(kv, k, v, start):
        _launch(kv, k, v, start)
    elif isinstance(start, int):
        kv[0, :, start : start + k.shape[1]] = k
        kv[1, :, start : start + k.shape[1]] = v
    else:
        kv[0].index_copy_(1, start, k.to(kv.dtype))
        kv[1].index_copy_(1, start, v.to(kv.dtype))


def _kernel_takes(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start) -> bool:
    """What the kernel writes, whatever the device: unit last strides, a power-of-two head dim,
    k and v of one dtype, a start index given as an int or an integer tensor of P indices."""
    dim = k.shape[-1]
    if dim < 1 or dim & (dim - 1) or any(t.stride(-1) != 1 for t in (kv, k, v)) or k.dtype != v.dtype:
        return False
    if isinstance(start, torch.Tensor):
        return start.dtype in (torch.int32, torch.int64) and start.numel() == k.shape[1] and start.device == kv.device
    return True


def _launch(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor) -> None:
    import triton

    from ._frame_write_kernel import _write_frame_kv

    heads, tokens, dim = k.shape
    in_memory = isinstance(start, torch.Tensor)
    block_t = max(1, min(64, 4096 // dim, triton.next_power_of_2(tokens)))
    _write_frame_kv[(triton.cdiv(tokens, block_t), heads, 2)](
        kv, k, v, start if in_memory else kv, 0 if in_memory else start, tokens,
        kv.stride(0), kv.stride(1), kv.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        START_IN_MEMORY=in_memory, HEAD_DIM=dim, BLOCK_T=block_t, num_warps=4,
    )
