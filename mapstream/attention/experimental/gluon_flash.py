"""Hopper cache attention in Gluon, with the next tile's scores in flight during the softmax.

EXPERIMENTAL (sm90 only; not selected by any backend). Measured on an H200 (docs/BENCHMARKS.md):
correct (2.1e-3 to 2.3e-3 against fp32 SDPA on seven key ranges) and exactly as fast as the
`tl` kernel (646 vs 656 µs), so the overlap inside one warp group buys nothing while two
programs already share each multiprocessor. It is the base for the other half of
FlashAttention-3's schedule: two consumer warp groups in ping-pong fed by a TMA producer warp
(`gl.warp_specialize`). Written against Triton 3.6's Gluon API, which is still experimental.

With `key_norm=` (FIXED) it is the same loop with each row's softmax reference point fixed
in advance, as `triton_flash` does with a key-norm hint (session 12, docs/BENCHMARKS.md):
586 µs with each P @ V waited for (the Triton kernel: 570), 716 µs with P @ V left in flight
through the next softmax, so again no gain from overlap inside one program.

The `tl` kernel (`triton_flash.py`) issues each tile's chain —
scores, softmax, P @ V — in order, so the tensor cores idle during the softmax and the
exponential units idle during the matrix products (Nsight Compute: tensor pipe 48 % busy,
latency-bound). Gluon exposes Hopper's asynchronous warp-group MMA, so this kernel issues
S_{j+1} = Q K_{j+1}^T before the softmax of S_j and waits for it only afterwards: the
intra-warp-group half of FlashAttention-3's schedule.

Same contract as `triton_flash.flash_attention` with a device-side key range: q [H, Nq, D]
(unit last stride), k/v [H, T, D] contiguous per head, kv_range int32 [2] on the device,
output token-major [Nq, H, D].
"""
from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

__all__ = ["gluon_flash_attention"]

_LOG2E = 1.4426950408889634


@gluon.jit
def _issue_tile(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, row0, tile, n_tiles,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA loads of K and V tile `tile` (if it exists) into its ring slot."""
    slot = tile % STAGES
    ok = tile < n_tiles
    row = row0 + tile * BLOCK_N
    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(k_desc, [row, 0], k_bars.index(slot), k_ring.index(slot), pred=ok)
    mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes, pred=ok)
    tma.async_copy_global_to_shared(v_desc, [row, 0], v_bars.index(slot), v_ring.index(slot), pred=ok)


@gluon.jit
def _fold_tile(s, m_i, l_i, acc, qk_scale, row_o: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr):
    """Fold one tile's scores into the running max and sum, rescale acc, and return P as the
    register operand of the P @ V product."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    return m_new, l_i, acc, gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _fold_fixed(s, m_i, l_i, qk_scale, p_layout: gl.constexpr, dtype: gl.constexpr):
    """One tile's weights against the fixed reference points m_i: the row sums, and P as
    the register operand of the P @ V product."""
    p = gl.exp2(s * qk_scale - m_i[:, None])
    return l_i + gl.sum(p, 1), gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _gluon_flash_fwd(
    Q, k_desc, v_desc, O, RANGE,
    stride_qh, stride_qn, stride_on, stride_oh,
    n_q, keys_per_head, qk_scale, key_norm,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    FIXED: gl.constexpr, PV_IN_FLIGHT: gl.constexpr,
):
    """FIXED: each row's softmax reference point fixed in advance from |q| * key_norm (as
    `triton_flash`'s balanced grid does with a key-norm hint): no row max, no rescale.
    PV_IN_FLIGHT (with FIXED): an iteration waits only for the next scores, so that its
    P @ V runs on through the next softmax (P's registers stay reserved until the next
    wait: the product reads them); a tile's slot is then refilled one iteration later."""
    head = gl.program_id(1)
    m_start = gl.program_id(0) * BLOCK_M
    lo = gl.load(RANGE)
    hi = gl.load(RANGE + 1)
    n_keys = hi - lo
    n_tiles = gl.cdiv(n_keys, BLOCK_N)
    n_full = n_keys // BLOCK_N
    row0 = head * keys_per_head + lo  # first key's row in the [H * T, D] view

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    # Q tile -> shared memory (the A operand of the score products).
    rows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, io_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, io_layout))
    q_ptrs = Q + head * stride_qh + rows[:, None] * stride_qn + cols[None, :]
    q = gl.load(q_ptrs, mask=(rows < n_q)[:, None], other=0.0).to(k_desc.dtype)
    if FIXED:
        q32 = q.to(gl.float32)
        m_i = gl.convert_layout(gl.sqrt(gl.sum(q32 * q32, 1)) * (key_norm * qk_scale), row_s)
    else:
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    q_smem = gl.allocate_shared_memory(k_desc.dtype, [BLOCK_M, HEAD_DIM], q_smem_layout, value=q)

    k_ring = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    for i in gl.static_range(STAGES):
        _issue_tile(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, row0, i, n_tiles, BLOCK_N, STAGES)

    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    # Scores of tile 0.
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), s_zero, use_acc=False)
    if PV_IN_FLIGHT:
        p_old = gl.zeros([BLOCK_M, BLOCK_N], v_desc.dtype, layout=p_layout)  # P of the product in flight

    for j in range(0, n_full):
        # Scores of the next tile (the last full tile recomputes itself when no tail follows),
        # issued now and awaited after this tile's softmax.
        nxt = gl.minimum(j + 1, n_tiles - 1)
        nslot = nxt % STAGES
        mbarrier.wait(k_bars.index(nslot), (nxt // STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_ring.index(nslot).permute((1, 0)), s_zero, use_acc=False, is_async=True)

        if FIXED:
            l_i, p_op = _fold_fixed(s, m_i, l_i, qk_scale, p_layout, v_desc.dtype)
        else:
            m_i, l_i, acc, p_op = _fold_tile(s, m_i, l_i, acc, qk_scale, row_o, p_layout, v_desc.dtype)

        slot = j % STAGES
        mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_ring.index(slot), acc, is_async=True)
        if PV_IN_FLIGHT:
            # S_{j+1} and P_{j-1} V_{j-1} are done; P_j V_j (the newest group) may run on.
            s, acc, p_op, p_old = warpgroup_mma_wait(1, deps=[s_next, acc, p_op, p_old])
            p_old = p_op
            # Tile j-1's slot is free (its P V is done): it takes tile j-1+STAGES.
            if j > 0:
                _issue_tile(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, row0, j - 1 + STAGES, n_tiles, BLOCK_N,
                            STAGES)
        else:
            acc, s = warpgroup_mma_wait(0, deps=[acc, s_next])
            # Both of tile j's buffers are consumed: refill the slot with tile j + STAGES.
            _issue_tile(k_desc, v_desc, k_ring, v_ring, k_bars, v_bars, row0, j + STAGES, n_tiles, BLOCK_N, STAGES)
    if PV_IN_FLIGHT:
        acc, p_old = warpgroup_mma_wait(0, deps=[acc, p_old])

    if n_full < n_tiles:
        # The partial last tile: `s` holds its scores; keys at or past `hi` are masked.
        key = n_full * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where((key < n_keys)[None, :], s, float("-inf"))
        if FIXED:
            l_i, p_op = _fold_fixed(s, m_i, l_i, qk_scale, p_layout, v_desc.dtype)
        else:
            m_i, l_i, acc, p_op = _fold_tile(s, m_i, l_i, acc, qk_scale, row_o, p_layout, v_desc.dtype)
        slot = n_full % STAGES
        mbarrier.wait(v_bars.index(slot), (n_full // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_ring.index(slot), acc)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    out = acc / gl.convert_layout(gl.where(l_i > 0, l_i, 1.0), row_o)[:, None]
    out = gl.convert_layout(out.to(O.dtype.element_ty), io_layout)
    o_ptrs = O + rows[:, None] * stride_on + head * stride_oh + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows < n_q)[:, None])


def gluon_flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_range: torch.Tensor, *,
    out: torch.Tensor | None = None, block_n: int = 128, stages: int = 3, key_norm: float | None = None,
    pv_in_flight: bool = True,
) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(D)) v over keys [kv_range[0], kv_range[1]) — see module docstring.
    The range must not be empty (the kernel would wait for a tile that is never loaded).
    key_norm: the longest key's norm (at most): fixed reference points (FIXED), unchecked (a
    measurement kernel: `triton_flash` checks and repairs); pv_in_flight: see PV_IN_FLIGHT."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    heads, n_q, dim = q.shape
    keys = k.shape[1]
    block_m = 64
    if out is None:
        out = torch.empty(n_q, heads, dim, device=q.device, dtype=q.dtype)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    k_desc = TensorDescriptor.from_tensor(k.reshape(heads * keys, dim), [block_n, dim], layout)
    v_desc = TensorDescriptor.from_tensor(v.reshape(heads * keys, dim), [block_n, dim], layout)
    grid = (-(-n_q // block_m), heads)
    fixed = key_norm is not None
    if fixed and pv_in_flight and stages < 3:  # a tile's slot is refilled one iteration after its P @ V is issued
        raise ValueError("the fixed-reference kernel with P @ V in flight needs stages >= 3")
    _gluon_flash_fwd[grid](
        q, k_desc, v_desc, out, kv_range, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        n_q, keys, _LOG2E / math.sqrt(dim), float(key_norm or 0.0),
        HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, FIXED=fixed, PV_IN_FLIGHT=fixed and pv_in_flight,
        num_warps=4,
    )
    return out.transpose(0, 1)
