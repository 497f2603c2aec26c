"""The Triton kernel of `conv_epilogue` (imported only when Triton runs it)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _conv_epilogue_fwd(
    Y, BIAS, A1, A2, OUT, numel, channels, plane,
    CHANNELS_LAST: tl.constexpr, HAS_BIAS: tl.constexpr, N_ADDS: tl.constexpr, RELU: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Element-wise over the storage of y [N, C, H, W] (the addends share its strides): the
    # channel of an element is its offset mod C (channels-last) or (offset // H W) mod C.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    y = tl.load(Y + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        if CHANNELS_LAST:
            channel = offs % channels
        else:
            channel = (offs // plane) % channels
        y += tl.load(BIAS + channel, mask=ok, other=0.0).to(tl.float32)
    if N_ADDS >= 1:
        y += tl.load(A1 + offs, mask=ok, other=0.0).to(tl.float32)
    if N_ADDS >= 2:
        y += tl.load(A2 + offs, mask=ok, other=0.0).to(tl.float32)
    if RELU:
        y = tl.maximum(y, 0.0)
    tl.store(OUT + offs, y.to(OUT.dtype.element_ty), mask=ok)
