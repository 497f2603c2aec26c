"""The Triton kernel of `output_head.pointwise_output` (imported only when Triton runs it)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _pointwise_output_fwd(
    H, W, B, VALUE, CONF, pixels, plane,
    C_IN: tl.constexpr, C_IN_POW2: tl.constexpr, C_OUT: tl.constexpr, BLOCK_P: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):
    # BLOCK_P pixels of a dense h [N, C_IN, H, W] (pixel p = n * plane + r): channels-last, a
    # pixel's channels are C_IN consecutive values (wide loads); contiguous, they lie a plane
    # apart. Each output channel is a dot product over C_IN channels in fp32, then activated.
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    ok = p < pixels
    k = tl.arange(0, C_IN_POW2)
    k_ok = k < C_IN
    if CHANNELS_LAST:
        offs = p[:, None] * C_IN + k[None, :]
    else:
        offs = ((p // plane) * (C_IN * plane) + p % plane)[:, None] + k[None, :] * plane
    h = tl.load(H + offs, mask=ok[:, None] & k_ok[None, :], other=0.0)
    h = h.to(tl.float32)
    for c in tl.static_range(C_OUT):
        w = tl.load(W + c * C_IN + k, mask=k_ok, other=0.0).to(tl.float32)
        logit = tl.sum(h * w[None, :], 1) + tl.load(B + c).to(tl.float32)
        if c == C_OUT - 1:  # the confidence, 1 + exp
            tl.store(CONF + p, (1.0 + tl.exp(logit)).to(CONF.dtype.element_ty), mask=ok)
        else:  # a value channel, exp
            tl.store(VALUE + p * (C_OUT - 1) + c, tl.exp(logit).to(VALUE.dtype.element_ty), mask=ok)
