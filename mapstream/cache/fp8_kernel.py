"""Packed FP8 rows (`mapstream.cache.fp8`) unpacked on the GPU in one pass.

`unpack_range(rows, kv_range, dtype)` reads rows [lo, hi) of every head (the visible key range,
as ints or read from device memory, so that a captured CUDA graph stays valid while it
changes) and writes their values times their scales in `dtype`, and zeros in the other rows:
attention reads only the range, but a kernel may load a whole tile past its end and weigh
it by zero, which must not meet uninitialised memory (0 x NaN). Each value is multiplied by
its scale in float32 and rounded once, so the result equals the CPU's `unpack_rows` bit for
bit (`manager.readable`, the cache's read, runs this kernel on CUDA tensors).

Attention over the unpacked range then runs at the speed of a bf16 cache: the unpacking
reads D + 4 bytes a row and writes 2 D, once a layer, where a kernel that dequantises
while it attends converts every key tile once for each block of queries.

`TRITON_INTERPRET=1` runs the same kernel on CPU tensors (used by the tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8 import SCALE_BYTES, unpacked_width

__all__ = ["supports", "unpack_range"]

_ROWS_PER_PROGRAM = 64


@triton.jit
def _unpack_rows_kernel(ROWS, OUT, RANGE, lo, hi, total, stride_rh, stride_rt, stride_oh, stride_ot,
                        HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, RANGE_IN_MEMORY: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    head = tl.program_id(1).to(tl.int64)
    if RANGE_IN_MEMORY:
        lo = tl.load(RANGE)
        hi = tl.load(RANGE + 1)
    offs = start + tl.arange(0, BLOCK)
    ok = (offs >= lo) & (offs < hi)
    cols = tl.arange(0, HEAD_DIM)
    out = tl.zeros((BLOCK, HEAD_DIM), dtype=tl.float32)
    if start + BLOCK > lo and start < hi:
        rows = ROWS + head * stride_rh + offs.to(tl.int64) * stride_rt
        values = tl.load((rows[:, None] + cols[None, :]).to(tl.pointer_type(tl.float8e4nv)), mask=ok[:, None],
                         other=0.0)
        scales = tl.load((rows + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=ok, other=0.0)
        out = values.to(tl.float32) * scales[:, None]
    dest = OUT + head * stride_oh + offs.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(dest, out.to(OUT.dtype.element_ty), mask=(offs < total)[:, None])


def supports(rows: torch.Tensor) -> bool:
    """Whether `unpack_range` takes these rows: uint8 [H, T, D + 4] with a unit last stride and
    a power-of-two D."""
    if rows.dtype != torch.uint8 or rows.dim() != 3 or rows.stride(-1) != 1 or rows.shape[-1] <= SCALE_BYTES:
        return False
    dim = unpacked_width(rows.shape[-1])
    return dim & (dim - 1) == 0


def unpack_range(rows: torch.Tensor, kv_range: torch.Tensor | tuple[int, int], dtype: torch.dtype,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed rows uint8 [H, T, D + 4] (unit last stride; any other strides) -> [H, T, D] in
    `dtype` (into `out` when given: unit last stride). Rows [lo, hi) are unpacked, the others
    written as zeros; `kv_range` is (lo, hi) as two ints, or as an int32 tensor of two on the
    rows' device (read by the kernel: graph-safe)."""
    if not supports(rows):
        raise ValueError(f"packed FP8 rows are uint8 [H, T, D + {SCALE_BYTES}] with a unit last stride and a "
                         f"power-of-two D, got {rows.dtype} {list(rows.shape)} strides {rows.stride()}")
    in_memory = isinstance(kv_range, torch.Tensor)
    if in_memory and (kv_range.dtype != torch.int32 or kv_range.numel() != 2 or kv_range.device != rows.device):
        raise ValueError(f"kv_range is two int32 values on {rows.device}, got {kv_range.dtype} "
                         f"{list(kv_range.shape)} on {kv_range.device}")
    heads, total, width = rows.shape
    dim = unpacked_width(width)
    if out is None:
        out = torch.empty(heads, total, dim, dtype=dtype, device=rows.device)
    elif out.shape != (heads, total, dim) or out.dtype != dtype or out.device != rows.device or out.stride(-1) != 1:
        raise ValueError(f"out must be {dtype} [{heads}, {total}, {dim}] on {rows.device} with a unit last stride, "
                         f"got {out.dtype} {list(out.shape)} on {out.device}")
    lo, hi = (0, 0) if in_memory else (int(kv_range[0]), int(kv_range[1]))
    grid = (triton.cdiv(total, _ROWS_PER_PROGRAM), heads)
    _unpack_rows_kernel[grid](rows, out, kv_range if in_memory else rows, lo, hi, total, rows.stride(0), rows.stride(1),
                              out.stride(0), out.stride(1), HEAD_DIM=dim, BLOCK=_ROWS_PER_PROGRAM,
                              RANGE_IN_MEMORY=in_memory)
    return out
