"""FlashAttention-3-style ping-pong schedule (sm90, Gluon), for the cache attention.

EXPERIMENTAL, not wired into a backend: correct on an H200 (2.1e-3 to 2.3e-3 against fp32
SDPA over tails, offsets and fewer keys than a tile) but no faster than the Triton kernel
(639-661 µs against 643-659 µs a layer, 2, 3 and 4 stages; `scripts/bench_gluon_attention.py`,
docs/BENCHMARKS.md). 12 warps, 168 registers at entry, no spills, 98 KB shared memory at 2
stages. With the fixed reference point (`key_norm`) it reads each K/V tile once for 128
rows, half as often as the Triton kernel, yet costs the same energy a call (0.414-0.427 J
against 0.417-0.437; `scripts/probe_energy.py --pingpong`, docs/BENCHMARKS.md session 23).

Three partitions per program (128 query rows of one head):
- a producer warp streams K and V tiles through a TMA ring (`k_full`/`v_full` barriers say a
  tile landed, `k_empty`/`v_empty` that both consumers are done with its slot; a K slot
  frees as soon as its scores are computed, a V slot one step later);
- two consumer warp groups, 64 rows each, take turns on the tensor cores: a group issues its
  score product S_j = Q K_jᵀ and the previous tile's P_{j-1} V_{j-1} back to back, hands the
  turn to the other group, and computes its softmax while the other group's products run.
"""
from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

_LOG2E = 1.4426950408889634


@gluon.jit
def _produce(k_desc, v_desc, k_ring, v_ring, k_full, v_full, k_empty, v_empty, row0, n_tiles,
             BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for t in range(n_tiles):
        slot = t % STAGES
        # Parity trick: in the first round the wait for the "previous" phase passes at once.
        free_phase = ((t // STAGES) & 1) ^ 1
        row = row0 + t * BLOCK_N
        # K and V slots are freed separately: a K tile is done once its scores are, while
        # its V tile waits one more iteration (P V runs a step behind).
        mbarrier.wait(k_empty.index(slot), free_phase)
        mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, 0], k_full.index(slot), k_ring.index(slot))
        mbarrier.wait(v_empty.index(slot), free_phase)
        mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, 0], v_full.index(slot), v_ring.index(slot))


@gluon.jit
def _scores_to_probs(s, m_i, l_i, j, n_full, n_keys, qk_scale, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
                     FIXED: gl.constexpr):
    """Fold tile j's scores into the running max/sum; return P and the rescale factor (with
    FIXED, m_i is a reference point set in advance and never moves: no max, no rescale)."""
    if j == n_full:  # the partial last tile: keys past the range are masked
        key = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where((key < n_keys)[None, :], s, float("-inf"))
    if FIXED:  # the fourth value stands in for the rescale factor, which goes unused
        p = gl.exp2(s * qk_scale - m_i[:, None])
        return m_i, l_i + gl.sum(p, 1), p, l_i
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return m_new, l_i, p, alpha


@gluon.jit
def _consume(Q, O, q_smem, k_ring, v_ring, k_full, v_full, k_empty, v_empty, my_turn, other_turn,
             stride_qh, stride_qn, stride_on, stride_oh, head, row_start, n_q, n_keys, n_tiles, n_full, qk_scale,
             key_norm, FIRST: gl.constexpr, HEAD_DIM: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr,
             STAGES: gl.constexpr, FIXED: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    rows = row_start + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, io_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, io_layout))
    row_ok = (rows < n_q)[:, None]
    q = gl.load(Q + head * stride_qh + rows[:, None] * stride_qn + cols[None, :], mask=row_ok, other=0.0)
    q_smem.store(q.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()  # all four warps' rows of Q are in shared memory before the first product

    if FIXED:  # |q| * key_norm bounds every score of the row (Cauchy-Schwarz)
        q32 = q.to(gl.float32)
        m_i = gl.convert_layout(gl.sqrt(gl.sum(q32 * q32, 1)) * (key_norm * qk_scale), gl.SliceLayout(1, s_layout))
    else:
        m_i = gl.full([HALF_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([HALF_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=s_layout)
    # The first group starts; afterwards each group waits for the other's hand-over.
    turn_flip: gl.constexpr = 1 if FIRST else 0

    # Tile 0: scores only.
    mbarrier.wait(k_full.index(0), 0)
    mbarrier.wait(my_turn, turn_flip)
    s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.arrive(other_turn, count=1)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(0), count=1)
    m_i, l_i, p, alpha = _scores_to_probs(s, m_i, l_i, 0, n_full, n_keys, qk_scale, BLOCK_N, s_layout, FIXED)
    p_prev = gl.convert_layout(p.to(gl.bfloat16), p_layout)

    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_full.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_full.index(prev), ((j - 1) // STAGES) & 1)
        mbarrier.wait(my_turn, (j & 1) ^ turn_flip)
        # Both products go to the tensor cores back to back; then the turn passes, so the
        # other group's products queue behind ours while we run the softmax.
        s = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_prev, v_ring.index(prev), acc, is_async=True)
        mbarrier.arrive(other_turn, count=1)
        s = warpgroup_mma_wait(1, deps=[s])  # the scores are ready; P V may still run
        mbarrier.arrive(k_empty.index(slot), count=1)
        m_i, l_i, p, alpha = _scores_to_probs(s, m_i, l_i, j, n_full, n_keys, qk_scale, BLOCK_N, s_layout, FIXED)
        p_next = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(v_empty.index(prev), count=1)
        if not FIXED:
            acc = acc * gl.convert_layout(alpha, row_layout)[:, None]
        p_prev = p_next

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_full.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_prev, v_ring.index(last), acc)
    mbarrier.arrive(v_empty.index(last), count=1)

    out = acc / gl.convert_layout(gl.where(l_i > 0, l_i, 1.0), row_layout)[:, None]
    out = gl.convert_layout(out.to(O.dtype.element_ty), io_layout)
    gl.store(O + rows[:, None] * stride_on + head * stride_oh + cols[None, :], out, mask=row_ok)


@gluon.jit
def _pingpong_fwd(
    Q, k_desc, v_desc, O, RANGE,
    stride_qh, stride_qn, stride_on, stride_oh,
    n_q, keys_per_head, qk_scale, key_norm,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, FIXED: gl.constexpr = False,
):
    HALF_M: gl.constexpr = 64
    head = gl.program_id(1)
    m_start = gl.program_id(0) * (2 * HALF_M)
    lo = gl.load(RANGE)
    hi = gl.load(RANGE + 1)
    n_keys = hi - lo
    n_tiles = gl.cdiv(n_keys, BLOCK_N)
    n_full = n_keys // BLOCK_N
    row0 = head * keys_per_head + lo

    q_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, HALF_M, HEAD_DIM], q_layout)
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per consumer group
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    fence_async_shared()

    gl.warp_specialize(
        [
            (_consume, (Q, O, q_smem.index(0), k_ring, v_ring, k_full, v_full, k_empty, v_empty, turns.index(0),
                        turns.index(1), stride_qh, stride_qn, stride_on, stride_oh, head, m_start, n_q, n_keys, n_tiles, n_full, qk_scale,
                        key_norm, True, HEAD_DIM, HALF_M, BLOCK_N, STAGES, FIXED)),
            (_consume, (Q, O, q_smem.index(1), k_ring, v_ring, k_full, v_full, k_empty, v_empty, turns.index(1),
                        turns.index(0), stride_qh, stride_qn, stride_on, stride_oh, head, m_start + HALF_M, n_q, n_keys, n_tiles, n_full, qk_scale,
                        key_norm, False, HEAD_DIM, HALF_M, BLOCK_N, STAGES, FIXED)),
            (_produce, (k_desc, v_desc, k_ring, v_ring, k_full, v_full, k_empty, v_empty, row0, n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [232, 24],
    )


def pingpong_attention(q, k, v, kv_range, *, out=None, block_n: int = 128, stages: int = 2, key_norm: float | None = None):
    """key_norm: a bound on the keys' norms; each row's reference point is then fixed in
    advance (`triton_flash._bound_reference`), unchecked here (probe use only)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    heads, n_q, dim = q.shape
    keys = k.shape[1]
    if out is None:
        out = torch.empty(n_q, heads, dim, device=q.device, dtype=q.dtype)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    k_desc = TensorDescriptor.from_tensor(k.reshape(heads * keys, dim), [block_n, dim], layout)
    v_desc = TensorDescriptor.from_tensor(v.reshape(heads * keys, dim), [block_n, dim], layout)
    grid = (-(-n_q // 128), heads)
    _pingpong_fwd[grid](
        q, k_desc, v_desc, out, kv_range, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        n_q, keys, _LOG2E / math.sqrt(dim), float(key_norm or 0.0), HEAD_DIM=dim, BLOCK_N=block_n, STAGES=stages,
        FIXED=key_norm is not None, num_warps=4,
    )
    return out.transpose(0, 1)
