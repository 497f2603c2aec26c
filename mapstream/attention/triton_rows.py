"""Attention of a few query rows over a key range, in fp32 arithmetic (Triton, CUDA).

Made for the camera head's cache attention: one query a frame over one cached token per
frame (a few hundred to a few thousand keys, head dim 128). In a captured step its key range
must come from device memory; PyTorch offers no fused kernel for that, and the masked
attention written with tensor ops costs about ten kernels a call, and the gaps between
them, 16 calls a frame. This is one kernel a call, or two when the keys are many:

The camera cache keeps every frame, so its key count grows with the stream. One program per
(query, head) walking the keys one tile after the other waits for a load a tile, so its
time grows with the keys. With `splits` > 1 each (query, head) shares its keys among
`splits` programs (equal parts of the visible range, worked out in the kernel, so a captured
graph follows the range as it grows) and a second kernel merges their partial softmaxes,
which keeps a call short as the stream grows.

The products are fp32 multiply-adds, not tensor-core dots: there are too few rows for the
tensor cores to matter, and fp32 inputs (the reference precision of the heads) stay exact
instead of being rounded to TF32. Inputs of any float dtype are read as they are stored.

`TRITON_INTERPRET=1` runs it on CPU tensors (used by the tests).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._kernel_args import check_qkv, key_bounds

__all__ = ["rows_attention"]


@triton.jit
def _rows_fwd(
    Q, K, V, O, M, L, RANGE,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
    kv_lo, kv_hi, scale,
    RANGE_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
):
    """Program (row, head, share): softmax of its share of the keys. With one share, the
    normalized output into O [H, Nq, D]; else the unnormalized accumulator into O
    [SPLITS, H, Nq, D] and its running max and sum into M, L [SPLITS, H, Nq] (an empty
    share leaves max -inf and sum 0, which the merge weighs as nothing)."""
    row = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    share = tl.program_id(2)
    if RANGE_IN_MEMORY:
        lo = tl.load(RANGE).to(tl.int32)
        hi = tl.load(RANGE + 1).to(tl.int32)
    else:
        lo = kv_lo
        hi = kv_hi
    if SPLITS > 1:
        size = tl.cdiv(hi - lo, SPLITS)
        lo = lo + share * size
        hi = tl.minimum(hi, lo + size)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + head * stride_qh + row * stride_qn + offs_d).to(tl.float32) * scale
    k_rows = K + head * stride_kh + offs_d[None, :]
    v_rows = V + head * stride_vh + offs_d[None, :]
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    l = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        ok = keys < hi
        k = tl.load(k_rows + keys[:, None] * stride_kn, mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_rows + keys[:, None] * stride_vn, mask=ok[:, None], other=0.0).to(tl.float32)
        l = l * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m = m_new
    if SPLITS == 1:
        tl.store(O + head * stride_oh + row * stride_on + offs_d, (acc / l).to(O.dtype.element_ty))
    else:
        n_q = tl.num_programs(0)
        part = (share * tl.num_programs(1) + head) * n_q + row
        tl.store(O + part * HEAD_DIM + offs_d, acc)
        tl.store(M + part + tl.arange(0, 1), m)
        tl.store(L + part + tl.arange(0, 1), l)


@triton.jit
def _rows_merge(
    O, M, L, OUT, stride_oh, stride_on,
    HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
):
    """Program (row, head): the shares' partial softmaxes of `_rows_fwd` weighed by
    exp(their max - the overall max), in share order."""
    row = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    n_q = tl.num_programs(0)
    heads = tl.num_programs(1)
    shares = tl.arange(0, SPLITS)
    parts = (shares * heads + head) * n_q + row
    m = tl.load(M + parts)
    l = tl.load(L + parts)
    top = tl.max(m, 0)
    w = tl.exp(m - top)  # an empty share: exp(-inf) = 0
    acc = tl.load(O + parts[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(OUT + head * stride_oh + row * stride_on + tl.arange(0, HEAD_DIM), out.to(OUT.dtype.element_ty))


MAX_SPLITS = 16


def default_splits(num_keys: int, block_n: int) -> int:
    """Shares a (query, head)'s keys are split into, from the key storage's length (fixed
    while a graph holds it; the shares themselves follow the visible range): one tile's
    worth of storage or less takes one program; beyond, a power of two up to MAX_SPLITS."""
    tiles = triton.cdiv(num_keys, block_n)
    return 1 if tiles <= 1 else min(MAX_SPLITS, triton.next_power_of_2(tiles))


def rows_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv_range: torch.Tensor | tuple[int, int] | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v over keys [lo, hi) of k/v, computed in fp32.

    q [H, Nq, D], k/v [H, T, D] (any strides with a unit last stride; any float dtypes).
    kv_range: (lo, hi) ints, an int tensor [2] on the device (read by the kernel, so a
    captured graph follows it), or None for all T keys; the range must not be empty.
    splits: programs sharing each (query, head)'s keys, a power of two up to MAX_SPLITS;
    None picks `default_splits` from T. Returns [H, Nq, D] in q's dtype.
    """
    heads, n_q, dim = q.shape
    check_qkv(q, k, v)
    in_memory, lo, hi = key_bounds(k, kv_range)
    # Keys a tile: enough to keep loads wide, few enough that a tile of fp32 K stays in registers.
    block_n = max(16, min(64, 8192 // dim))
    splits = default_splits(k.shape[1], block_n) if splits is None else splits
    if splits < 1 or splits > MAX_SPLITS or splits & (splits - 1):
        raise ValueError(f"splits={splits}: needs a power of two from 1 to {MAX_SPLITS}")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    rng = kv_range if in_memory else out
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    meta = dict(RANGE_IN_MEMORY=in_memory, HEAD_DIM=dim, BLOCK_N=block_n, SPLITS=splits, num_warps=4)
    if splits == 1:
        _rows_fwd[(n_q, heads, 1)](
            q, k, v, out, out, out, rng, *strides, out.stride(0), out.stride(1), lo, hi, 1.0 / math.sqrt(dim), **meta
        )
        return out
    acc = torch.empty(splits, heads, n_q, dim, device=q.device, dtype=torch.float32)
    m, l = (torch.empty(splits, heads, n_q, device=q.device, dtype=torch.float32) for _ in range(2))
    _rows_fwd[(n_q, heads, splits)](
        q, k, v, acc, m, l, rng, *strides, 0, 0, lo, hi, 1.0 / math.sqrt(dim), **meta
    )
    _rows_merge[(n_q, heads)](acc, m, l, out, out.stride(0), out.stride(1), HEAD_DIM=dim, SPLITS=splits, num_warps=4)
    return out
