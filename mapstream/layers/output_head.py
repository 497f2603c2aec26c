"""The DPT head's last step: a 1x1 convolution to the output channels, then the activations.

    value, conf = pointwise_output(conv, h)
    # == out = conv(h) moved channels-last; exp(out[..., :-1]), 1 + exp(out[..., -1])

At full image resolution PyTorch reads the 32-channel map once in cuDNN's fp32 kernel
(N = 2 outputs a pixel leaves it on the FMA units), then passes over the logits four more
times (bias, two exponentials, the add), all on the DPT head's critical path. On CUDA one
Triton kernel reads each
pixel's channels once and writes both outputs, in fp32 with one rounding. Elsewhere, inside
`plain_pytorch()` and for what the kernel does not take (`_kernel_takes`), it is the
composition above.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention.fused import our_kernels_may_serve
from ._layout import channels_last

__all__ = ["pointwise_output"]

_BLOCK_P = 128


def pointwise_output(conv: nn.Conv2d, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(exp of every output channel but the last [N, H, W, C_out - 1], 1 + exp of the last
    [N, H, W]) of the 1x1 convolution `conv` on h [N, C_in, H, W]."""
    if our_kernels_may_serve(h) and _kernel_takes(conv, h):
        return _launch(conv, h)
    out = conv(h).permute(0, 2, 3, 1)
    return torch.exp(out[..., :-1]), 1 + torch.exp(out[..., -1])


def _kernel_takes(conv: nn.Conv2d, h: torch.Tensor) -> bool:
    """A plain 1x1 convolution with a bias, at most 128 input and 2 to 8 output channels, on a
    dense map (contiguous or channels-last) of its weights' float dtype."""
    if not isinstance(conv, nn.Conv2d) or conv.kernel_size != (1, 1) or conv.bias is None:
        return False
    if conv.stride != (1, 1) or conv.padding != (0, 0) or conv.dilation != (1, 1) or conv.groups != 1:
        return False
    if not (2 <= conv.out_channels <= 8 and conv.in_channels <= 128) or h.dim() != 4 or h.numel() == 0:
        return False
    if h.dtype not in (torch.float32, torch.float16, torch.bfloat16) or {conv.weight.dtype, conv.bias.dtype} != {h.dtype}:
        return False
    return h.is_contiguous() or channels_last(h)


def _launch(conv: nn.Conv2d, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    import triton

    from ._output_head_kernel import _pointwise_output_fwd

    n, c_in, height, width = h.shape
    c_out = conv.out_channels
    value = h.new_empty(n, height, width, c_out - 1)
    conf = h.new_empty(n, height, width)
    pixels = n * height * width
    _pointwise_output_fwd[(triton.cdiv(pixels, _BLOCK_P),)](
        h, conv.weight.reshape(c_out, c_in).contiguous(), conv.bias, value, conf, pixels, height * width,
        C_IN=c_in, C_IN_POW2=triton.next_power_of_2(c_in), C_OUT=c_out, BLOCK_P=_BLOCK_P,
        CHANNELS_LAST=channels_last(h), num_warps=4,
    )
    return value, conf
