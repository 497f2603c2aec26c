"""The Triton kernel of `resize.resize_bilinear` (imported only when Triton runs it)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _times(a, scale, ROUNDED: tl.constexpr):
    """a * scale, rounded before any later use: compilers fuse `a * scale - floor` into one
    multiply-add, whose exact fraction differs from PyTorch's (rounded product) by up to
    half an ulp of the coordinate, ~1e-5 of a pixel at a few hundred pixels (CUDA only:
    the CPU interpreter runs plain numpy arithmetic)."""
    if ROUNDED:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, a * 0.0 + scale],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return a * scale


@triton.jit
def _resize_fwd(
    X, OUT, ADD, ADD2, n, c, h, w, out_h, out_w, scale_h, scale_w, split,
    sxn, sxc, sxh, sxw, son, soc, soh, sow, san, sac, sah, saw, sac2, sah2, saw2,
    HAS_ADD: tl.constexpr, SEPARABLE: tl.constexpr, ROUNDED: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # A tile of BLOCK_P output pixels (flattened over n, y, x) by BLOCK_C channels: with
    # channels-last tensors every row of the tile is one contiguous run of memory.
    pix = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    chan = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pix_ok = pix < n * out_h * out_w
    ok = pix_ok[:, None] & (chan < c)[None, :]
    ox = pix % out_w
    oy = (pix // out_w) % out_h
    on = pix // (out_w * out_h)
    sy = _times(oy.to(tl.float32), scale_h, ROUNDED)
    sx = _times(ox.to(tl.float32), scale_w, ROUNDED)
    y0 = sy.to(tl.int64)  # truncation = floor: coordinates are >= 0
    x0 = sx.to(tl.int64)
    fy = sy - y0.to(tl.float32)
    fx = sx - x0.to(tl.float32)
    y1 = tl.minimum(y0 + 1, h - 1)
    x1 = tl.minimum(x0 + 1, w - 1)
    base = X + on[:, None] * sxn + chan[None, :] * sxc
    top = base + y0[:, None] * sxh
    bottom = base + y1[:, None] * sxh
    v00 = tl.load(top + x0[:, None] * sxw, mask=ok, other=0.0).to(tl.float32)
    v01 = tl.load(top + x1[:, None] * sxw, mask=ok, other=0.0).to(tl.float32)
    v10 = tl.load(bottom + x0[:, None] * sxw, mask=ok, other=0.0).to(tl.float32)
    v11 = tl.load(bottom + x1[:, None] * sxw, mask=ok, other=0.0).to(tl.float32)
    wx0 = (1.0 - fx)[:, None]
    wx1 = fx[:, None]
    val = (1.0 - fy)[:, None] * (wx0 * v00 + wx1 * v01) + fy[:, None] * (wx0 * v10 + wx1 * v11)
    if HAS_ADD:
        # ADD serves channels [0, split), ADD2 (SEPARABLE: a second table) the rest
        first = chan < split
        a_ptr = ADD + on[:, None] * san + chan[None, :] * sac + oy[:, None] * sah + ox[:, None] * saw
        val += tl.load(a_ptr, mask=ok & first[None, :], other=0.0).to(tl.float32)
        if SEPARABLE:
            a2_ptr = ADD2 + (chan - split)[None, :] * sac2 + oy[:, None] * sah2 + ox[:, None] * saw2
            val += tl.load(a2_ptr, mask=ok & ~first[None, :], other=0.0).to(tl.float32)
    o_ptr = OUT + on[:, None] * son + chan[None, :] * soc + oy[:, None] * soh + ox[:, None] * sow
    tl.store(o_ptr, val.to(OUT.dtype.element_ty), mask=ok)
