"""A convolution followed by its bias, residual additions and ReLU in one pass:

    conv_epilogue(conv, x, adds=(a, b), relu=True)  ==  relu((conv(x) + a) + b)

PyTorch adds a convolution's bias after cuDNN as a broadcast over the output, which for a
channels-last map runs off its vectorized elementwise path, and each residual add and ReLU is
one more pass over the map: in the DPT head at 504x378 about 65 such kernels, a large share
of the head's time. On CUDA
the convolution runs without its bias and one Triton kernel adds the bias and the addends and
applies the ReLU, in fp32 with one rounding. Elsewhere, inside `plain_pytorch()`, and for what
the kernel does not take (`_kernel_takes`), it is the composition above.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.fused import our_kernels_may_serve
from ._layout import channels_last

__all__ = ["conv_epilogue"]

_Conv = nn.Conv2d | nn.ConvTranspose2d


def conv_epilogue(conv: _Conv, x: torch.Tensor, adds: Sequence[torch.Tensor] = (), relu: bool = False) -> torch.Tensor:
    """relu?(conv(x) + adds[0] + adds[1] ...), added left to right (at most two addends on the
    kernel's path), each addend of the output's shape."""
    if len(adds) <= 2 and our_kernels_may_serve(x) and _kernel_takes(conv, x):
        y = _without_bias(conv, x)
        if conv.bias is None and not adds and not relu:
            return y  # nothing to add: no pass
        if _same_layout(y, adds):
            return _launch(y, conv.bias, adds, relu)
        if conv.bias is not None:  # PyTorch's own bias add, then the rest as below
            y = y + conv.bias.view(1, -1, 1, 1)
    else:
        y = conv(x)
    for a in adds:
        y = y + a
    return F.relu(y) if relu else y


def _kernel_takes(conv: _Conv, x: torch.Tensor) -> bool:
    """Whole-module cases the kernel path computes, whatever the device: a 2D convolution or
    transposed convolution with zero padding and weights of x's float dtype."""
    if not isinstance(conv, (nn.Conv2d, nn.ConvTranspose2d)) or conv.padding_mode != "zeros" or x.dim() != 4:
        return False
    if isinstance(conv.padding, str):
        return False
    dtypes = {x.dtype, conv.weight.dtype} | ({conv.bias.dtype} if conv.bias is not None else set())
    return len(dtypes) == 1 and x.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _without_bias(conv: _Conv, x: torch.Tensor) -> torch.Tensor:
    if isinstance(conv, nn.ConvTranspose2d):
        return F.conv_transpose2d(
            x, conv.weight, None, conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation
        )
    return F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups)


def _same_layout(y: torch.Tensor, adds: Sequence[torch.Tensor]) -> bool:
    """y dense (contiguous or channels-last) and every addend of its shape, dtype and strides."""
    if not (y.is_contiguous() or channels_last(y)):
        return False
    return all(a.shape == y.shape and a.dtype == y.dtype and a.stride() == y.stride() and a.device == y.device
               for a in adds)


def _launch(y: torch.Tensor, bias: torch.Tensor | None, adds: Sequence[torch.Tensor], relu: bool) -> torch.Tensor:
    import triton

    from ._conv_epilogue_kernel import _conv_epilogue_fwd

    out = torch.empty_like(y)  # same strides as y (empty_like keeps a dense layout)
    n, c, h, w = y.shape
    a1 = adds[0] if len(adds) > 0 else y
    a2 = adds[1] if len(adds) > 1 else y
    block = 1024
    _conv_epilogue_fwd[(triton.cdiv(y.numel(), block),)](
        y, bias if bias is not None else y, a1, a2, out, y.numel(), c, h * w,
        CHANNELS_LAST=channels_last(y), HAS_BIAS=bias is not None, N_ADDS=len(adds), RELU=relu,
        BLOCK=block, num_warps=4,
    )
    return out
