"""The Triton kernel of `heads.qkv_heads` (imported only when Triton runs it)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _row_stats(X, d, row_ok, eps, HEAD_DIM: tl.constexpr):
    """Mean and 1/std over the head dim of the rows at X (LayerNorm's statistics)."""
    x = tl.load(X + d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    mean = tl.sum(x, 1) / HEAD_DIM
    centred = x - mean[:, None]
    return mean, tl.math.rsqrt(tl.sum(centred * centred, 1) / HEAD_DIM + eps)


@triton.jit
def _normed(X, W, B, cols, row_ok, mean, rstd, HAS_NORM: tl.constexpr, ROUND_TO: tl.constexpr,
            ROUND: tl.constexpr):
    """Columns `cols` of the rows at X, LayerNormed with the rows' statistics and (ROUND)
    rounded to the output dtype as the LayerNorm module's result is; fp32 out."""
    x = tl.load(X + cols[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    if HAS_NORM:
        w = tl.load(W + cols).to(tl.float32)
        b = tl.load(B + cols).to(tl.float32)
        x = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
        if ROUND:
            x = x.to(ROUND_TO).to(tl.float32)
    return x


@triton.jit
def _qkv_heads_fwd(
    QKV, Q, K, V, QW, QB, KW, KB, COS, SIN,
    n_tokens, n_heads, q_eps, k_eps,
    s_qkv_b, s_qkv_t, s_cos_b, s_cos_t,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr,
    INTERLEAVED: tl.constexpr, AXES: tl.constexpr, ROUND_INTERMEDIATES: tl.constexpr,
):
    # One program: BLOCK_T tokens of one head of one batch row; reads that head's q, k and v
    # columns of the projection [B, N, 3 * H * D] and writes q, k, v [B, H, N, D].
    # ROUND_INTERMEDIATES: the LayerNorm's result and the rotation table are rounded to the
    # output dtype first (the modules in that dtype); otherwise fp32 throughout (autocast,
    # where the norms and the rotation run in fp32) and rounded once at the store.
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    row_ok = tok < n_tokens
    src = QKV + batch * s_qkv_b + tok.to(tl.int64)[:, None] * s_qkv_t + head * HEAD_DIM
    dst = (batch * n_heads + head) * n_tokens * HEAD_DIM + tok.to(tl.int64)[:, None] * HEAD_DIM + d[None, :]
    out_ty = Q.dtype.element_ty
    v = tl.load(src + 2 * n_heads * HEAD_DIM + d[None, :], mask=row_ok[:, None], other=0.0)
    tl.store(V + dst, v, mask=row_ok[:, None])
    k_src = src + n_heads * HEAD_DIM
    if HAS_NORM:
        q_mean, q_rstd = _row_stats(src, d, row_ok, q_eps, HEAD_DIM)
        k_mean, k_rstd = _row_stats(k_src, d, row_ok, k_eps, HEAD_DIM)
    else:
        q_mean = tl.zeros([BLOCK_T], dtype=tl.float32)
        q_rstd = q_mean
        k_mean = q_mean
        k_rstd = q_mean
    q = _normed(src, QW, QB, d, row_ok, q_mean, q_rstd, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
    k = _normed(k_src, KW, KB, d, row_ok, k_mean, k_rstd, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
    if HAS_ROPE:
        # Channel d is rotated with its partner channel: out = x[d] cos + sign * x[partner] sin
        # with sign -1 on the pair's first channel, +1 on its second (Rotary.apply's pairing).
        if INTERLEAVED:
            pair = d // 2
            first = (d % 2) == 0
            partner = d ^ 1
        else:
            half: tl.constexpr = HEAD_DIM // (2 * AXES)
            axis = d // (2 * half)
            r = d % (2 * half)
            first = r < half
            pair = axis * half + (r % half)
            partner = tl.where(first, d + half, d - half)
        sign = tl.where(first, -1.0, 1.0)
        table = batch * s_cos_b + tok.to(tl.int64)[:, None] * s_cos_t + pair[None, :]
        cos = tl.load(COS + table, mask=row_ok[:, None], other=0.0)
        sin = tl.load(SIN + table, mask=row_ok[:, None], other=0.0)
        if ROUND_INTERMEDIATES:  # Rotary.apply rounds the table to the tensor's dtype
            cos = cos.to(out_ty).to(tl.float32)
            sin = sin.to(out_ty).to(tl.float32)
        sin = sin * sign[None, :]
        q_p = _normed(src, QW, QB, partner, row_ok, q_mean, q_rstd, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
        k_p = _normed(k_src, KW, KB, partner, row_ok, k_mean, k_rstd, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
        q = q * cos + q_p * sin
        k = k * cos + k_p * sin
    tl.store(Q + dst, q.to(out_ty), mask=row_ok[:, None])
    tl.store(K + dst, k.to(out_ty), mask=row_ok[:, None])
