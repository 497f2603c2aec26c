"""Our own flash-attention forward in Triton, shaped for attention over the stream cache.

Why a kernel of our own: the cache attention is one fixed shape (one frame's ~1k queries
over up to ~71k keys, head dim 64, no mask) and dominates a streaming step. cuDNN plans
anew on the host for every key count, which the cache changes every frame, and FlashInfer's
fa2 kernel, an Ampere design, is slower on Hopper. This kernel

- reads K/V straight from the cache arena's strided [H, T, D] views (no gather, no copy);
- can read the visible key range [lo, hi) from device memory, so a captured CUDA graph
  stays valid while the range changes from frame to frame;
- writes its output token-major ([Nq, H, D]), which is the layout the block's output
  projection wants, so the usual transpose + copy disappears.

The loop splits full key tiles (no masking) from the one partial tail tile. Softmax runs in
base 2 with the 1/sqrt(D) scale folded into one fused multiply-add per score. Given a bound
on the keys' norms (`key_norm`), the balanced grid fixes each row's reference point in
advance instead of tracking the running max, and its merge checks the result
(`_merge_or_repair`).

`TRITON_INTERPRET=1` runs the same kernel on CPU tensors (used by the tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._kernel_args import check_qkv, key_bounds

__all__ = ["flash_attention", "KernelConfig", "default_config"]

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch parameters. The defaults and `default_config` are tuned for the
    protocol's shape on Hopper."""

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int = 0
    """Registers a thread may use at most (0: the compiler's choice). A cap lets more programs
    of a large block share a multiprocessor (8 warps at 128 registers: two programs)."""
    tma: bool = False
    """Fetch K/V tiles with the tensor-memory accelerator (sm90)."""
    splits: int = 1
    """Split each row block's keys over this many programs (more programs in flight per
    multiprocessor to hide latency); a second kernel merges their partial results."""
    balance: bool = False
    """Give the programs the device could hold beyond one per row block (and head) a share
    of every row block's keys, so that no multiprocessor idles while the others finish:
    at the protocol's shape 256 row blocks fill 256 of a 132-multiprocessor GPU's 264
    resident slots, and the other 8 would idle through the whole call. Each row block's
    first keys go to its own program, the rest (its tail) to a spare one, which walks the
    tails of several row blocks; the split point gives both equal work. A second kernel
    merges the two."""
    programs_per_sm: int = 2
    """Programs of this configuration a multiprocessor holds at once (shared memory bounds
    the 64x128 tiles at 3 stages to 2 on sm90); with the multiprocessor count, the resident
    slots that `balance` fills."""
    slots: int = 0
    """Resident program slots for `balance`: 0 asks the device (multiprocessors x
    programs_per_sm); a number overrides it (tests under the CPU interpreter)."""
    tail_setup: int = 5
    """Key tiles' worth of work a tail costs `balance` beyond its keys (loading its queries,
    starting the pipeline, storing its partial result); sets the split point. Too small a
    value leaves the spare programs last to finish; from 3 to 6 the two sides end together
    at the protocol's shape, and larger values give the spare programs too little."""


def _launch_options(config: KernelConfig) -> dict:
    """The launch's compile options of `config`."""
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return options


def default_config(device: torch.device) -> KernelConfig:
    """The configuration for `device`: 64x128 tiles, 4 warps, 3 stages (the best of a sweep
    at the protocol's shape on Hopper), with TMA loads and spare slots balanced where the
    GPU has them (sm90+: two programs a multiprocessor)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0):
        return KernelConfig(tma=True, balance=True)
    return KernelConfig()


@triton.jit
def _online_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """Fold one tile of raw scores s [M, N] and its values v [N, D] into (m_i, l_i, acc).
    Scores are kept in base-2 units: m_i is the running max of s * qk_scale."""
    if MASKED:
        s = tl.where(key_ok[None, :], s, float("-inf"))
    # fp32 whatever the caller's scalar is (torch.compile passes Python floats as fp64).
    qk_scale = tl.cast(qk_scale, tl.float32)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _fixed_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """`_online_softmax` with m_i a reference point set before the first tile
    (`_bound_reference`) and never moved: no row max, no rescale, and a tile's P.V adds
    onto the previous one's without waiting for it."""
    if MASKED:
        s = tl.where(key_ok[None, :], s, float("-inf"))
    p = tl.math.exp2(s * tl.cast(qk_scale, tl.float32) - m_i[:, None])
    l_i = l_i + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_i, l_i, acc


@triton.jit
def _key_range(RANGE, kv_lo, kv_hi, RANGE_IN_MEMORY: tl.constexpr):
    if RANGE_IN_MEMORY:
        return tl.load(RANGE).to(tl.int32), tl.load(RANGE + 1).to(tl.int32)
    else:
        return kv_lo, kv_hi


@triton.jit
def _split_range(lo, hi, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr):
    """This program's share of [lo, hi): whole tiles, share program_id(2) of SPLITS (the
    last share takes the partial tile; a share may be empty)."""
    if SPLITS == 1:
        return lo, hi
    else:
        per = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), SPLITS) * BLOCK_N
        start = tl.minimum(hi, lo + tl.program_id(2) * per)
        return start, tl.minimum(hi, start + per)


@triton.jit
def _query_rows(n_q, BLOCK_M: tl.constexpr):
    """This program's query rows (block program_id(0)) and which of them exist. Kept apart
    from `_start_rows` so that the output's addresses derive from no input pointer:
    torch.compile's analysis of which arguments a kernel writes follows function calls
    whole, and would count Q as written (and copy it) if they came out of a call given Q."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return offs_m, offs_m < n_q


@triton.jit
def _start_rows(Q, head, offs_m, row_ok, stride_qh, stride_qn, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The query rows offs_m of `head` and an empty online-softmax state for them."""
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    return q, m_i, l_i, acc


@triton.jit
def _finish_rows(O, acc, l_i, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM: tl.constexpr):
    """Normalise and store this program's rows token-major: O[row, head, :]."""
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = O + offs_m[:, None] * stride_on + tl.program_id(1) * stride_oh + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _store_partial(ACC, ML, acc, m_i, l_i, share, head, n_heads, offs_m, row_ok, n_q, HEAD_DIM: tl.constexpr):
    """One share's unnormalised result: ACC[share, head, row, :] and ML[share, head, row, (m, l)]."""
    rows = (share * n_heads + head).to(tl.int64) * n_q + offs_m
    tl.store(ACC + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :], acc, mask=row_ok[:, None])
    tl.store(ML + rows * 2, m_i, mask=row_ok)
    tl.store(ML + rows * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _merge_splits(
    ACC, ML, O, stride_on, stride_oh, n_q, n_heads,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr,
):
    """out = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s with m = max_s m_s."""
    head = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    num, den = _merged_shares(ACC, ML, head, n_heads, offs_m, row_ok, n_q, HEAD_DIM, BLOCK_M, SPLITS)
    _finish_rows(O, num, den, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM)


@triton.jit
def _merged_shares(ACC, ML, head, n_heads, offs_m, row_ok, n_q,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
    """(sum_s 2^(m_s - m) acc_s, sum_s 2^(m_s - m) l_s) of rows offs_m of `head` over the
    SPLITS shares stored by `_store_partial`, with m = max_s m_s; an empty share has
    m_s = -inf and weighs nothing."""
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for share in tl.static_range(SPLITS):
        rows = (share * n_heads + head).to(tl.int64) * n_q + offs_m
        m = tl.maximum(m, tl.load(ML + rows * 2, mask=row_ok, other=0.0))
    m = tl.where(m == float("-inf"), 0.0, m)  # no keys in any share: weights 0, output 0
    num = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    for share in tl.static_range(SPLITS):
        rows = (share * n_heads + head).to(tl.int64) * n_q + offs_m
        w = tl.math.exp2(tl.load(ML + rows * 2, mask=row_ok, other=0.0) - m)
        den += w * tl.load(ML + rows * 2 + 1, mask=row_ok, other=0.0)
        num += w[:, None] * tl.load(ACC + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    return num, den


@triton.jit
def _flash_fwd(
    Q, K, V, O, RANGE, ACC, ML,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_on, stride_oh,
    n_q, kv_lo, kv_hi, qk_scale,
    RANGE_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
):
    head = tl.program_id(1)
    lo, hi = _key_range(RANGE, kv_lo, kv_hi, RANGE_IN_MEMORY)
    lo, hi = _split_range(lo, hi, BLOCK_N, SPLITS)
    offs_m, row_ok = _query_rows(n_q, BLOCK_M)
    q, m_i, l_i, acc = _start_rows(Q, head, offs_m, row_ok, stride_qh, stride_qn, BLOCK_M, HEAD_DIM)
    q = q.to(K.dtype.element_ty)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    k_tile = K + head.to(tl.int64) * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_tile = V + head.to(tl.int64) * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    all_keys = offs_n >= 0
    for start in tl.range(lo, full_end, BLOCK_N):
        k = tl.load(k_tile + start * stride_kn)
        v = tl.load(v_tile + start * stride_vn)
        s = tl.dot(q, tl.trans(k))
        m_i, l_i, acc = _online_softmax(s, v, all_keys, m_i, l_i, acc, qk_scale, False)
    if full_end < hi:
        key_ok = full_end + offs_n < hi
        k = tl.load(k_tile + full_end * stride_kn, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_tile + full_end * stride_vn, mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        m_i, l_i, acc = _online_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, True)
    if SPLITS == 1:
        _finish_rows(O, acc, l_i, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM)
    else:
        _store_partial(ACC, ML, acc, m_i, l_i, tl.program_id(2), head, tl.num_programs(1), offs_m, row_ok, n_q, HEAD_DIM)


@triton.jit
def _flash_fwd_tma(
    Q, k_desc, v_desc, O, RANGE, ACC, ML,
    stride_qh, stride_qn, stride_on, stride_oh,
    n_q, kv_lo, kv_hi, qk_scale,
    RANGE_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """The same computation with K/V tiles fetched by Hopper's tensor-memory accelerator."""
    head = tl.program_id(1)
    lo, hi = _key_range(RANGE, kv_lo, kv_hi, RANGE_IN_MEMORY)
    lo, hi = _split_range(lo, hi, BLOCK_N, SPLITS)
    offs_m, row_ok = _query_rows(n_q, BLOCK_M)
    q, m_i, l_i, acc = _start_rows(Q, head, offs_m, row_ok, stride_qh, stride_qn, BLOCK_M, HEAD_DIM)
    q = q.to(k_desc.dtype)
    offs_n = tl.arange(0, BLOCK_N)
    full_end = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    all_keys = offs_n >= 0
    for start in tl.range(lo, full_end, BLOCK_N):
        k = k_desc.load([head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k))
        m_i, l_i, acc = _online_softmax(s, v, all_keys, m_i, l_i, acc, qk_scale, False)
    if full_end < hi:
        # Rows past the descriptor's end read as zeros; keys in [hi, end) are masked.
        key_ok = full_end + offs_n < hi
        k = k_desc.load([head, full_end, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([head, full_end, 0]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k))
        m_i, l_i, acc = _online_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, True)
    if SPLITS == 1:
        _finish_rows(O, acc, l_i, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM)
    else:
        _store_partial(ACC, ML, acc, m_i, l_i, tl.program_id(2), head, tl.num_programs(1), offs_m, row_ok, n_q, HEAD_DIM)


@triton.jit
def _tile(X, head, start, offs_n, key_ok, stride_h, stride_n,
          HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, MASKED: tl.constexpr):
    """Rows [start, start + BLOCK_N) of `head` in X, a tensor descriptor (TMA; rows past the
    end read as zeros) or a pointer (masked loads)."""
    if TMA:
        x = X.load([head, start, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        ptrs = X + head.to(tl.int64) * stride_h + (start + offs_n)[:, None] * stride_n + tl.arange(0, HEAD_DIM)[None, :]
        if MASKED:
            x = tl.load(ptrs, mask=key_ok[:, None], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _kv_tile(K, V, head, start, offs_n, key_ok, stride_kh, stride_kn, stride_vh, stride_vn,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, MASKED: tl.constexpr):
    """The K and V tiles of keys [start, start + BLOCK_N) of `head` (`_tile`)."""
    k = _tile(K, head, start, offs_n, key_ok, stride_kh, stride_kn, HEAD_DIM, BLOCK_N, TMA, MASKED)
    v = _tile(V, head, start, offs_n, key_ok, stride_vh, stride_vn, HEAD_DIM, BLOCK_N, TMA, MASKED)
    return k, v


@triton.jit
def _attend_keys(q, K, V, head, k_lo, k_hi, m_i, l_i, acc, qk_scale, stride_kh, stride_kn, stride_vh, stride_vn,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
                 FIXED: tl.constexpr = False):
    """Fold keys [k_lo, k_hi) of `head` into (m_i, l_i, acc): whole tiles, then the
    partial one masked. FIXED: m_i holds fixed reference points (`_fixed_softmax`)."""
    offs_n = tl.arange(0, BLOCK_N)
    full_end = k_lo + ((k_hi - k_lo) // BLOCK_N) * BLOCK_N
    all_keys = offs_n >= 0
    for start in tl.range(k_lo, full_end, BLOCK_N):
        k, v = _kv_tile(K, V, head, start, offs_n, all_keys, stride_kh, stride_kn, stride_vh, stride_vn,
                        HEAD_DIM, BLOCK_N, TMA, False)
        s = tl.dot(q, tl.trans(k))
        if FIXED:
            m_i, l_i, acc = _fixed_softmax(s, v, all_keys, m_i, l_i, acc, qk_scale, False)
        else:
            m_i, l_i, acc = _online_softmax(s, v, all_keys, m_i, l_i, acc, qk_scale, False)
    if full_end < k_hi:
        key_ok = full_end + offs_n < k_hi
        k, v = _kv_tile(K, V, head, full_end, offs_n, key_ok, stride_kh, stride_kn, stride_vh, stride_vn,
                        HEAD_DIM, BLOCK_N, TMA, True)
        s = tl.dot(q, tl.trans(k))
        if FIXED:
            m_i, l_i, acc = _fixed_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, True)
        else:
            m_i, l_i, acc = _online_softmax(s, v, key_ok, m_i, l_i, acc, qk_scale, True)
    return m_i, l_i, acc


@triton.jit
def _attend_rows(Q, K, V, head, offs_m, row_ok, k_lo, k_hi, qk_scale, key_norm,
                 stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
                 FIXED: tl.constexpr):
    """(m_i, l_i, acc) of query rows offs_m of `head` over keys [k_lo, k_hi): with FIXED, each
    row's reference point fixed from key_norm (`_bound_reference`), else the running max."""
    q, m_i, l_i, acc = _start_rows(Q, head, offs_m, row_ok, stride_qh, stride_qn, BLOCK_M, HEAD_DIM)
    if FIXED:
        m_i = _bound_reference(q, key_norm, qk_scale)
    if TMA:
        q = q.to(K.dtype)
    else:
        q = q.to(K.dtype.element_ty)
    return _attend_keys(q, K, V, head, k_lo, k_hi, m_i, l_i, acc, qk_scale,
                        stride_kh, stride_kn, stride_vh, stride_vn, HEAD_DIM, BLOCK_N, TMA, FIXED)


@triton.jit
def _flash_fwd_balanced(
    Q, K, V, RANGE, ACC, ML,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
    n_q, n_heads, kv_lo, kv_hi, qk_scale, tails_per_spare, key_norm,
    RANGE_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr, TAIL_SETUP: tl.constexpr, FIXED: tl.constexpr = False,
):
    """`KernelConfig.balance`: programs 0 .. items-1 (one per row block and head, row blocks
    fastest, so that the programs of a head stream its keys together through L2) take the
    first keys of their row block (share 0); each program after them takes the tails of
    `tails_per_spare` row blocks in turn (share 1). With n key tiles and g tails a spare
    program, the head share of m tiles balances when m = g (n - m + TAIL_SETUP): each tail
    costs TAIL_SETUP tiles more for its queries and pipeline start."""
    pid = tl.program_id(0)
    lo, hi = _key_range(RANGE, kv_lo, kv_hi, RANGE_IN_MEMORY)
    row_blocks = tl.cdiv(n_q, BLOCK_M)
    items = row_blocks * n_heads
    tiles = tl.cdiv(hi - lo, BLOCK_N)
    head_tiles = tl.minimum(tiles, (tails_per_spare * (tiles + TAIL_SETUP)) // (tails_per_spare + 1))
    split = tl.minimum(hi, lo + head_tiles * BLOCK_N)
    tail = pid >= items
    first = tl.where(tail, (pid - items) * tails_per_spare, pid)
    last = tl.where(tail, tl.minimum(first + tails_per_spare, items), pid + 1)
    k_lo = tl.where(tail, split, lo)
    k_hi = tl.where(tail, hi, split)
    share = tail.to(tl.int32)
    for item in range(first, last):
        head = item // row_blocks
        offs_m = (item % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        m_i, l_i, acc = _attend_rows(Q, K, V, head, offs_m, row_ok, k_lo, k_hi, qk_scale, key_norm,
                                     stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
                                     HEAD_DIM, BLOCK_M, BLOCK_N, TMA, FIXED)
        _store_partial(ACC, ML, acc, m_i, l_i, share, head, n_heads, offs_m, row_ok, n_q, HEAD_DIM)


@triton.jit
def _bound_reference(q, key_norm, qk_scale):
    """Each row's fixed reference point (base 2): the Cauchy-Schwarz bound |q| * key_norm *
    scale of its scores when no key is longer than key_norm. A point up to about 85 (base
    2) above the row's true max gives the same softmax to rounding; `_merge_or_repair`
    checks."""
    q = q.to(tl.float32)
    return tl.sqrt(tl.sum(q * q, 1)) * (tl.cast(key_norm, tl.float32) * tl.cast(qk_scale, tl.float32))


_NORMAL_SPAN = tl.constexpr(102.0)
"""fp32's normal range below 1 (2^-126), less the 24 bits of a weight that still count."""
_DEN_HIGH = tl.constexpr(2.0 ** 64)


@triton.jit
def _merge_or_repair(
    Q, K, V, RANGE, ACC, ML, O, REPAIRS,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_on, stride_oh,
    n_q, n_heads, kv_lo, kv_hi, qk_scale,
    RANGE_IN_MEMORY: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TMA: tl.constexpr, COUNT: tl.constexpr,
):
    """The balanced call's merge when its shares used a fixed reference point. A row whose
    denominator (its weights' sum, relative to that point) came out too small, above 2^64 or
    NaN was computed too far from its true max: its weights may have lost range (underflow)
    or overflowed. Then this program's row block is computed again from scratch with the
    running max (and REPAIRS counted, when COUNT). Otherwise the two shares add up. "Too
    small": below 2^-102 n, for n keys. A sum of at least that puts the largest of n
    weights at 2^-102 or more, so every weight within 2^-24 of it (all that count in fp32)
    is at least 2^-126, a normal float that the exponential does not flush to 0; and a
    reference point from a true bound keeps every weight at most 1 (an estimate too small
    shows as the sum's overflow)."""
    head = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_q
    num, den = _merged_shares(ACC, ML, head, n_heads, offs_m, row_ok, n_q, HEAD_DIM, BLOCK_M, 2)
    lo, hi = _key_range(RANGE, kv_lo, kv_hi, RANGE_IN_MEMORY)
    den_low = tl.math.exp2(tl.log2(tl.maximum(hi - lo, 1).to(tl.float32)) - _NORMAL_SPAN)
    in_range = (den >= den_low) & (den < _DEN_HIGH)
    if tl.min(tl.where(row_ok, in_range, True).to(tl.int32), 0) == 1:
        _finish_rows(O, num, den, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM)
    else:
        m_i, l_i, acc = _attend_rows(Q, K, V, head, offs_m, row_ok, lo, hi, qk_scale, 0.0,
                                     stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
                                     HEAD_DIM, BLOCK_M, BLOCK_N, TMA, False)
        _finish_rows(O, acc, l_i, offs_m, row_ok, stride_on, stride_oh, HEAD_DIM)
        if COUNT:
            tl.atomic_add(REPAIRS, 1)


def _resident_slots(device: torch.device, config: KernelConfig) -> int:
    """Programs of `config` that run at once on `device` (0 where it cannot tell: off CUDA)."""
    if config.slots:
        return config.slots
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count * config.programs_per_sm


def balanced_grid(n_q: int, heads: int, device: torch.device, config: KernelConfig) -> tuple[int, int] | None:
    """(programs, tails a spare program takes) of a balanced call, or None where there is
    no spare slot to balance with (the plain grid is then as good)."""
    items = triton.cdiv(n_q, config.block_m) * heads
    spare = _resident_slots(device, config) - items
    if spare < 1:
        return None
    per_spare = triton.cdiv(items, spare)
    return items + triton.cdiv(items, per_spare), per_spare


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv_range: torch.Tensor | tuple[int, int] | None = None,
    out: torch.Tensor | None = None,
    config: KernelConfig | None = None,
    launch=None,
    key_norm: float | None = None,
    repairs: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v over keys [lo, hi) of k/v.

    q [H, Nq, D] (any strides, unit last stride; any float dtype, computed in k's dtype);
    k, v [H, T, D] (unit last stride; fp16/bf16 on CUDA). kv_range: (lo, hi) ints, or an
    int tensor [2] on q's device (read by the kernel: graph-safe), or None for all T keys.
    Returns [H, Nq, D] in q's dtype, a transposed view of token-major [Nq, H, D] storage
    (`out`, if given, must be that storage). config: None picks `default_config(q.device)`.
    launch: wraps the (pointer, non-TMA) kernels before launching them, e.g. with
    `torch.library.wrap_triton` inside a `triton_op` that torch.compile traces.
    key_norm: an estimate of the longest key's Euclidean norm (keys after a LayerNorm have
    one, see `layers.layer_norm_bound`). The balanced grid then sets each row's softmax reference
    point in advance, from |q| * key_norm, instead of tracking the running max, and its
    merge checks every row, computing again with the running max any row block that came
    out of range: a poor estimate costs time, never accuracy. Other grids ignore it, and so
    do fp16 K/V: the weights may lie far below 1 (to 2^-102), and P, rounded to K/V's dtype
    for the P.V product, keeps that range in bf16 and fp32 but not in fp16 (2^-24).
    repairs: an int32 tensor [1] on q's device that counts the row blocks computed again.
    """
    heads, n_q, dim = q.shape
    config = config or default_config(q.device)
    if key_norm is not None and not (key_norm > 0 and math.isfinite(key_norm)):
        raise ValueError(f"key_norm must be a positive finite float (got {key_norm})")
    if repairs is not None and (repairs.shape != (1,) or repairs.dtype != torch.int32 or repairs.device != q.device):
        raise ValueError("repairs must be an int32 tensor of shape [1] on q's device")
    check_qkv(q, k, v)
    if k.dtype == torch.float16:
        key_norm = repairs = None
    if out is None:
        out = torch.empty(n_q, heads, dim, device=q.device, dtype=q.dtype)
    elif out.shape != (n_q, heads, dim) or out.stride(-1) != 1:
        raise ValueError(f"out must be [Nq, H, D] = {(n_q, heads, dim)} with a unit last stride")
    in_memory, lo, hi = key_bounds(k, kv_range)
    # Unused pointer arguments get q, which the kernel only reads: torch.compile clones the
    # tensors a kernel writes, and `out` passed twice would keep it from writing in place.
    range_arg = kv_range if in_memory else q
    splits = config.splits
    if launch is not None and config.tma:
        raise ValueError("launch wraps the pointer kernels only: use a config with tma=False")
    wrap = launch or (lambda kernel: kernel)
    if config.balance and splits > 1:
        raise ValueError("KernelConfig.balance runs the plain loop: it does not combine with splits")
    balanced = balanced_grid(n_q, heads, q.device, config) if config.balance else None
    if balanced is not None:
        return _balanced_call(q, k, v, out, range_arg, in_memory, lo, hi, balanced, config, wrap, key_norm, repairs)
    if splits > 1:
        partial_acc = torch.empty(splits, heads, n_q, dim, device=q.device, dtype=torch.float32)
        partial_ml = torch.empty(splits, heads, n_q, 2, device=q.device, dtype=torch.float32)
    else:
        partial_acc = partial_ml = q  # unused
    grid = (triton.cdiv(n_q, config.block_m), heads, splits)
    scalars = (n_q, lo, hi, _LOG2E / math.sqrt(dim))
    meta = dict(
        RANGE_IN_MEMORY=in_memory, HEAD_DIM=dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        SPLITS=splits, **_launch_options(config),
    )
    if config.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        block = [1, config.block_n, dim]
        k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), block)
        v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), block)
        _flash_fwd_tma[grid](
            q, k_desc, v_desc, out, range_arg, partial_acc, partial_ml, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *scalars, **meta,
        )
    else:
        wrap(_flash_fwd)[grid](
            q, k, v, out, range_arg, partial_acc, partial_ml,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
            *scalars, **meta,
        )
    if splits > 1:
        wrap(_merge_splits)[grid[:2]](
            partial_acc, partial_ml, out, out.stride(0), out.stride(1), n_q, heads,
            HEAD_DIM=dim, BLOCK_M=config.block_m, SPLITS=splits, num_warps=4,
        )
    return out.transpose(0, 1)


def _balanced_call(q, k, v, out, range_arg, in_memory, lo, hi, grid, config, wrap, key_norm, repairs) -> torch.Tensor:
    """`flash_attention` with `KernelConfig.balance`: head and tail shares, then the merge
    (checked, with a fixed reference point)."""
    heads, n_q, dim = q.shape
    programs, per_spare = grid
    partial_acc = torch.empty(2, heads, n_q, dim, device=q.device, dtype=torch.float32)
    partial_ml = torch.empty(2, heads, n_q, 2, device=q.device, dtype=torch.float32)
    if config.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        block = [1, config.block_n, dim]
        k_arg = TensorDescriptor(k, list(k.shape), list(k.stride()), block)
        v_arg = TensorDescriptor(v, list(v.shape), list(v.stride()), block)
        kernel = _flash_fwd_balanced
    else:
        k_arg, v_arg, kernel = k, v, wrap(_flash_fwd_balanced)
    fixed = key_norm is not None
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1))
    kernel[(programs,)](
        q, k_arg, v_arg, range_arg, partial_acc, partial_ml, *strides,
        n_q, heads, lo, hi, _LOG2E / math.sqrt(dim), per_spare, float(key_norm or 0.0),
        RANGE_IN_MEMORY=in_memory, HEAD_DIM=dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        TMA=config.tma, TAIL_SETUP=config.tail_setup, FIXED=fixed, **_launch_options(config),
    )
    if fixed:
        merge = _merge_or_repair if config.tma else wrap(_merge_or_repair)
        merge[(triton.cdiv(n_q, config.block_m), heads)](
            q, k_arg, v_arg, range_arg, partial_acc, partial_ml, out, q if repairs is None else repairs,
            *strides, out.stride(0), out.stride(1), n_q, heads, lo, hi, _LOG2E / math.sqrt(dim),
            RANGE_IN_MEMORY=in_memory, HEAD_DIM=dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
            TMA=config.tma, COUNT=repairs is not None, **_launch_options(config),
        )
        return out.transpose(0, 1)
    wrap(_merge_splits)[(triton.cdiv(n_q, config.block_m), heads)](
        partial_acc, partial_ml, out, out.stride(0), out.stride(1), n_q, heads,
        HEAD_DIM=dim, BLOCK_M=config.block_m, SPLITS=2, num_warps=4,
    )
    return out.transpose(0, 1)
