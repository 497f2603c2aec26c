"""linear(x) for one frame's tokens with the reduction split in two, where tiles are few.

A block's fc2 (4096 -> 1024) over one 504x378 frame (978 tokens) has only 8 x 8 output tiles
of 128x128 for a GPU of 132 multiprocessors. cuBLAS runs it as 128 tiles of 64x128, which
are less efficient a tile than fc1's. Splitting the reduction in two halves, run as one
batched cuBLAS product with fp32 outputs, gives 128 tiles of 128x128, which fill the GPU at
the larger tile's efficiency. The halves are summed with the bias and rounded once, as
cuBLAS's own epilogue rounds once; only the fp32 order of the sum differs.

The sum reads the two fp32 halves, so it pays only where it joins a pass that runs anyway:
inside torch.compile, Inductor fuses it into the residual add (and next norm) after fc2,
which then takes a little longer. Eagerly it would be extra kernels, so `split_linear`
serves traced code only. The projection (1024 -> 1024) has the same tiles, but its halves
are too short to gain, hence the minimum depth.
"""
from __future__ import annotations

import torch
from torch import nn

from .linear_gelu import half_product_dtype

__all__ = ["split_linear", "split_pays"]

_TILE = 128
MIN_DEPTH = 2048
"""The shortest reduction (input features) split; the projection's 1024 does not gain."""
enabled = True
"""Off only to measure the step without the split (A/B)."""


def split_pays(rows: int, linear: nn.Linear, multiprocessors: int) -> bool:
    """Whether the product of `rows` tokens has at most half as many 128x128 output tiles
    as there are multiprocessors (so two halves still run in one wave) while its reduction
    is deep enough for halves to gain."""
    k, n = linear.in_features, linear.out_features
    if k < MIN_DEPTH or k % 16:  # halves keep 16-byte aligned rows
        return False
    tiles = -(-rows // _TILE) * -(-n // _TILE)
    return 2 * tiles <= multiprocessors


@torch.compiler.assume_constant_result
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).multi_processor_count


def split_linear(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor | None:
    """linear(x) for x [..., in] as two half-depth products summed in fp32, or None where the
    split does not serve (not traced by torch.compile, not CUDA, not half precision, or a
    product that already fills the chip)."""
    if not (enabled and torch.compiler.is_compiling()) or x.shape[-1] != linear.in_features:
        return None
    dtype = half_product_dtype(x, linear)  # the same products as the MLP's GELU epilogue serves
    if dtype is None:
        return None
    rows = x.numel() // x.shape[-1]
    if not split_pays(rows, linear, _multiprocessors(x.device.index)):
        return None
    k, n = linear.in_features, linear.out_features
    flat = x.reshape(rows, k).to(dtype)
    halves_x = flat.view(rows, 2, k // 2).transpose(0, 1)
    halves_w = linear.weight.to(dtype).view(n, 2, k // 2).permute(1, 2, 0)
    with torch.autocast("cuda", enabled=False):
        halves = torch.bmm(halves_x, halves_w, out_dtype=torch.float32)
        out = (halves[0] + halves[1] + linear.bias.float()).to(dtype)
    return out.view(*x.shape[:-1], n)
