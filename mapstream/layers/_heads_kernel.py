"""The Triton kernel of `heads.qkv_heads` (imported only when Triton runs it).

Each of q, k, v is read from the projection once, with whole-row vector loads; the
LayerNorm and the rotation happen in registers (the rotation pairs channels by reshaping
the row, not by loading it a second time in partner order). Loading each row four times
through gathered addresses in 64-token tiles would need more registers than a thread has
with the 3D RoPE, and spill.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _layer_norm(x, W, B, eps, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, ROUND_TO: tl.constexpr,
                ROUND: tl.constexpr):
    """LayerNorm over the last dim of x [T, D] (fp32); with ROUND its result is rounded to
    ROUND_TO, as the module computing in that dtype returns it."""
    if HAS_NORM:
        d = tl.arange(0, HEAD_DIM)
        mean = tl.sum(x, 1) / HEAD_DIM
        centred = x - mean[:, None]
        rstd = tl.math.rsqrt(tl.sum(centred * centred, 1) / HEAD_DIM + eps)
        w = tl.load(W + d).to(tl.float32)
        b = tl.load(B + d).to(tl.float32)
        x = centred * rstd[:, None] * w[None, :] + b[None, :]
        if ROUND:
            x = x.to(ROUND_TO).to(tl.float32)
    return x


@triton.jit
def _rotate(x, cos, sin, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
            AXES: tl.constexpr):
    """Rotary.apply on x [T, D] with the table cos, sin [T, D/2] (pair-major): pair p holds
    channels (2p, 2p+1) when INTERLEAVED, else channels (j, j + F) of each of the AXES
    blocks of 2F channels; the pair (a, b) becomes (a cos - b sin, b cos + a sin)."""
    if INTERLEAVED:
        a, b = tl.split(tl.reshape(x, (BLOCK_T, HEAD_DIM // 2, 2)))
        return tl.reshape(tl.join(a * cos - b * sin, b * cos + a * sin), (BLOCK_T, HEAD_DIM))
    else:
        half: tl.constexpr = HEAD_DIM // (2 * AXES)
        a, b = tl.split(tl.permute(tl.reshape(x, (BLOCK_T, AXES, 2, half)), (0, 1, 3, 2)))
        c = tl.reshape(cos, (BLOCK_T, AXES, half))
        s = tl.reshape(sin, (BLOCK_T, AXES, half))
        out = tl.permute(tl.join(a * c - b * s, b * c + a * s), (0, 1, 3, 2))
        return tl.reshape(out, (BLOCK_T, HEAD_DIM))


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
    src = QKV + batch * s_qkv_b + (tok.to(tl.int64) * s_qkv_t + head * HEAD_DIM)[:, None] + d[None, :]
    dst = ((batch * n_heads + head) * n_tokens + tok.to(tl.int64))[:, None] * HEAD_DIM + d[None, :]
    out_ty = Q.dtype.element_ty
    width = n_heads * HEAD_DIM
    tl.store(V + dst, tl.load(src + 2 * width, mask=row_ok[:, None]), mask=row_ok[:, None])
    q = tl.load(src, mask=row_ok[:, None], other=0.0).to(tl.float32)
    k = tl.load(src + width, mask=row_ok[:, None], other=0.0).to(tl.float32)
    q = _layer_norm(q, QW, QB, q_eps, HEAD_DIM, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
    k = _layer_norm(k, KW, KB, k_eps, HEAD_DIM, HAS_NORM, out_ty, ROUND_INTERMEDIATES)
    if HAS_ROPE:
        pair = tl.arange(0, HEAD_DIM // 2)
        table = batch * s_cos_b + (tok.to(tl.int64) * s_cos_t)[:, None] + pair[None, :]
        cos = tl.load(COS + table, mask=row_ok[:, None], other=0.0).to(tl.float32)
        sin = tl.load(SIN + table, mask=row_ok[:, None], other=0.0).to(tl.float32)
        if ROUND_INTERMEDIATES:  # Rotary.apply rounds the table to the tensor's dtype
            cos = cos.to(out_ty).to(tl.float32)
            sin = sin.to(out_ty).to(tl.float32)
        q = _rotate(q, cos, sin, BLOCK_T, HEAD_DIM, INTERLEAVED, AXES)
        k = _rotate(k, cos, sin, BLOCK_T, HEAD_DIM, INTERLEAVED, AXES)
    tl.store(Q + dst, q.to(out_ty), mask=row_ok[:, None])
    tl.store(K + dst, k.to(out_ty), mask=row_ok[:, None])
