"""FP8 (e4m3) cache rows: each token's key or value of one head, quantised with a scale of its own.

A cache stored in FP8 (`CacheSpec.kv_dtype` "fp8") holds, per layer, K/V and head, one *packed
row* per token: the D values in float8 e4m3 followed by the row's float32 scale, as bytes::

    row (uint8, D + 4):  [ e4m3 x_1 ... e4m3 x_D | float32 scale ]      x_i ~ e4m3_i * scale

so the scale lives with its token: every move the cache makes (eviction to the trajectory,
its thinning, a frame promoted from the spare slot) copies whole rows and carries it along,
with nothing else to keep in step. A row's scale is its largest |x_i| / 448 (e4m3's largest
finite value): each token keeps e4m3's full 3-bit mantissa whatever its magnitude, which
per-page or per-head scales would not give the few tokens (the special tokens) whose keys
are far larger than the patches'. A row takes D + 4 bytes against 2 D in bf16: 0.53 of it
at D = 64.

The functions here are pure tensor maps; they run on any device (the CPU emulates exactly
what a GPU stores; on CUDA the cache unpacks with one Triton kernel,
`fp8_kernel.unpack_range`, to the same result).
"""
from __future__ import annotations

import torch

__all__ = ["FP8_MAX", "SCALE_BYTES", "pack_rows", "packed_width", "unpack_rows", "unpacked_width"]

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
SCALE_BYTES = 4
_TINY = float(torch.finfo(torch.float32).tiny)


def packed_width(head_dim: int) -> int:
    """Bytes of one packed row of `head_dim` values."""
    return head_dim + SCALE_BYTES


def unpacked_width(width: int) -> int:
    """The head dim a packed row of `width` bytes holds."""
    if width <= SCALE_BYTES:
        raise ValueError(f"a packed FP8 row has more than {SCALE_BYTES} bytes, got {width}")
    return width - SCALE_BYTES


def pack_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] (any float dtype) -> packed rows uint8 [..., D + 4]: each row scaled by its
    largest magnitude / 448 and rounded to e4m3 (to nearest), the scale appended as bytes."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(_TINY)
    values = (x / scale).to(FP8)
    return torch.cat((values.view(torch.uint8), scale.contiguous().view(torch.uint8)), dim=-1)


def unpack_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows uint8 [..., D + 4] (any strides with a unit last stride) -> [..., D] in
    `dtype`: each value times its row's scale, multiplied in float32 (float64 for a float64
    result) and rounded to `dtype` once, as the GPU's kernel (`fp8_kernel.unpack_range`) does."""
    if rows.dtype != torch.uint8:
        raise TypeError(f"packed FP8 rows are uint8, got {rows.dtype}")
    dim = unpacked_width(rows.shape[-1])
    values = rows[..., :dim].view(FP8)
    scale = rows[..., dim:]
    if scale.stride(-1) == 1 and scale.storage_offset() % SCALE_BYTES == 0 and all(
            s % SCALE_BYTES == 0 for s in scale.stride()[:-1]):
        scale = scale.view(torch.float32)  # a view: no copy of the scales
    else:
        scale = scale.clone(memory_format=torch.contiguous_format).view(torch.float32)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return (values.to(wide) * scale.to(wide)).to(dtype)
