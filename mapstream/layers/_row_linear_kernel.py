"""Triton kernel of `row_linear`: one row through a linear layer, with its LayerNorm before
and its GELU or scaled residual add after. A matrix-vector product reads every weight once
and is bound by memory, so each program takes BLOCK_N output features and streams their
weight rows in BLOCK_K-wide chunks; the row itself (and its LayerNorm) is recomputed by every
program from L2, which costs far less than one extra launch."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_linear_fwd(
    X, W, B, NW, NB, R, G, Y,
    N, K, stride_w, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, NORM_AFFINE: tl.constexpr, ROUND_NORM: tl.constexpr,
    GELU: tl.constexpr, RESIDUAL: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w_rows = W + rows[:, None].to(tl.int64) * stride_w
    # The first chunk's weights do not depend on the LayerNorm: requested before its
    # statistics, their memory latency overlaps the row's reads from L2.
    cols = tl.arange(0, BLOCK_K)
    w_next = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & (cols[None, :] < K), other=0.0)
    mean = 0.0
    rstd = 1.0
    if NORM:
        # Two passes over the row (mean, then the centred variance), as a LayerNorm's fp32
        # statistics; the row is K values read from L2 by every program.
        total = tl.zeros([BLOCK_K], dtype=tl.float32)
        for start in tl.range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            total += tl.load(X + cols, mask=cols < K, other=0.0).to(tl.float32)
        mean = tl.sum(total, 0) / K
        total = tl.zeros([BLOCK_K], dtype=tl.float32)
        for start in tl.range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            d = tl.load(X + cols, mask=cols < K, other=0.0).to(tl.float32) - mean
            total += tl.where(cols < K, d * d, 0.0)
        # fp32 whatever the scalar's type (torch.compile passes Python floats as fp64)
        rstd = 1.0 / tl.sqrt(tl.sum(total, 0) / K + tl.cast(eps, tl.float32))
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    # Each chunk's weights are requested one iteration ahead, so that two chunks' loads are
    # in flight while the products of one are summed (a matrix-vector product has nothing
    # else to hide the memory's latency behind).
    for start in tl.range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        w = w_next
        w_next = tl.load(w_rows + BLOCK_K + cols[None, :],
                         mask=row_ok[:, None] & (cols[None, :] + BLOCK_K < K), other=0.0)
        x = tl.load(X + cols, mask=col_ok, other=0.0).to(tl.float32)
        if NORM:
            x = (x - mean) * rstd
            if NORM_AFFINE:
                x = x * tl.load(NW + cols, mask=col_ok, other=0.0).to(tl.float32)
                x = x + tl.load(NB + cols, mask=col_ok, other=0.0).to(tl.float32)
            if ROUND_NORM:  # a half-precision LayerNorm hands the product its rounded result
                x = x.to(X.dtype.element_ty).to(tl.float32)
            x = tl.where(col_ok, x, 0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, 1) + tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
    if GELU:  # the exact (erf) GELU
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    if RESIDUAL:
        y = tl.load(R + rows, mask=row_ok, other=0.0).to(tl.float32) + \
            tl.load(G + rows, mask=row_ok, other=0.0).to(tl.float32) * y
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)
