"""The Triton kernel of `frame_write.write_frame_kv` (imported only when Triton runs it)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _write_frame_kv(
    KV, K, V, START, start, n_tokens,
    s_kv, s_kv_h, s_kv_t, s_k_h, s_k_t, s_v_h, s_v_t,
    START_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # Program (token block, head, k or v): BLOCK_T rows of that head's keys (program_id(2) = 0)
    # or values (1), stored at tokens start + row of KV[program_id(2), head].
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1).to(tl.int64)
    which = tl.program_id(2)
    d = tl.arange(0, HEAD_DIM)
    ok = tok < n_tokens
    if START_IN_MEMORY:
        first = tl.load(START).to(tl.int64)
    else:
        first = tl.cast(start, tl.int64)  # Triton passes a start of 1 as a constant, not a tensor
    if which == 0:
        rows = tl.load(K + head * s_k_h + tok.to(tl.int64)[:, None] * s_k_t + d[None, :], mask=ok[:, None])
    else:
        rows = tl.load(V + head * s_v_h + tok.to(tl.int64)[:, None] * s_v_t + d[None, :], mask=ok[:, None])
    dst = KV + which.to(tl.int64) * s_kv + head * s_kv_h + (first + tok.to(tl.int64))[:, None] * s_kv_t + d[None, :]
    tl.store(dst, rows.to(KV.dtype.element_ty), mask=ok[:, None])
