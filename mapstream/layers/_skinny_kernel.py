"""The Triton kernels of `skinny.skinny_linear` (imported only when Triton runs them).

y = x Wᵀ + b for a few rows of x: every weight is read once and used for every row, so the
work is reading W. Each program owns BLOCK_N outputs and one of SPLIT_K slices of the
reduction; with SPLIT_K > 1 the slices' fp32 partial sums go to a scratch buffer and a second
kernel adds them in a fixed order (deterministic, no atomics), then the bias.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _skinny_fwd(
    X, W, BIAS, Y, PART,
    n_rows, n_out, n_in, k_per_split, stride_xm, stride_wn, stride_ym,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    K_TILES: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # Program (n block, k slice): rows 0..n_rows-1 (ROWS: n_rows rounded up to a power of two)
    # of x against BLOCK_N rows of W over columns [k0, k0 + k_per_split); each W tile is loaded
    # once for all rows. fp32 multiply-adds (exact for fp32 inputs, no TF32).
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, ROWS)
    n_ok = n < n_out
    m_ok = m < n_rows
    k_start = tl.program_id(1) * k_per_split
    kk = tl.arange(0, BLOCK_K)
    w_rows = W + n.to(tl.int64)[:, None] * stride_wn
    x_rows = X + m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # A compile-time trip count (k_per_split = K_TILES * BLOCK_K): the shapes are a model's.
    for t in tl.range(0, K_TILES):
        cols = k_start + t * BLOCK_K + kk
        col_ok = cols < n_in  # the last slice may run past the end
        w = tl.load(w_rows + cols[None, :], mask=n_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_rows + cols[None, :], mask=m_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], 2)
    ok = m_ok[:, None] & n_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(BIAS + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + m.to(tl.int64)[:, None] * stride_ym + n[None, :], acc.to(Y.dtype.element_ty), mask=ok)
    else:
        part = (tl.program_id(1) * n_rows + m).to(tl.int64)[:, None] * n_out
        tl.store(PART + part + n[None, :], acc, mask=ok)


@triton.jit
def _skinny_sum(PART, BIAS, Y, n_rows, n_out, stride_ym, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    # Row program_id(1), outputs of block program_id(0): the slices' partial sums in slice order.
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n_ok = n < n_out
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(PART + (s * n_rows + m).to(tl.int64) * n_out + n, mask=n_ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(Y + m * stride_ym + n, acc.to(Y.dtype.element_ty), mask=n_ok)
