"""Bilinear resizing with aligned corners, the DPT head's upsampling.

`resize_bilinear` is `F.interpolate(x, size, mode="bilinear", align_corners=True)`, plus
an optional tensor added to the result, or a `SeparableAddend` (the DPT head's position
embedding: each channel varies along one axis only, so the kernel reads two small tables
instead of a map as large as the output, ~100 MB at 504x378 with 128 channels). On CUDA it
runs one Triton kernel that reads and writes any strides: PyTorch's kernel for channels-last
inputs is slow, the DPT head's largest call (128 channels up to full resolution) alone a
large share of the head, and the position embedding added after it would be one more pass
over that output. Elsewhere it is `F.interpolate` itself.

Arithmetic as PyTorch's: source coordinate = scale * destination with scale =
(in - 1) / (out - 1) in fp32, weights 1 - f and f, the four taps blended in fp32 and rounded
once (with `add`, the sum is rounded once instead of twice).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..attention.fused import our_kernels_may_serve
from ._layout import channels_last

__all__ = ["SeparableAddend", "resize_bilinear"]


@dataclass(frozen=True)
class SeparableAddend:
    """The addend [C1 + C2, H, W] whose channel c < C1 is cols[x, c] at every row and whose
    channel C1 + c is rows[y, c] at every column: cols [W, C1], rows [H, C2]."""

    cols: torch.Tensor
    rows: torch.Tensor

    def dense(self) -> torch.Tensor:
        """The addend as a tensor [C1 + C2, H, W]."""
        height, width = self.rows.shape[0], self.cols.shape[0]
        grid = torch.cat(
            (self.cols[None].expand(height, -1, -1), self.rows[:, None].expand(-1, width, -1)), dim=-1
        )
        return grid.permute(2, 0, 1)


def resize_bilinear(
    x: torch.Tensor, size: tuple[int, int], add: torch.Tensor | SeparableAddend | None = None
) -> torch.Tensor:
    """x [N, C, H, W] resized to `size` (bilinear, align_corners=True), then `add` (a tensor
    that broadcasts to [N, C, *size], or a `SeparableAddend` of C channels) added. The result
    keeps x's memory format."""
    if x.dim() != 4:
        raise ValueError(f"resize_bilinear needs x [N, C, H, W], got {list(x.shape)}")
    if isinstance(add, SeparableAddend):
        tables = add.cols.shape[1] + add.rows.shape[1], add.rows.shape[0], add.cols.shape[0]
        if tables != (x.shape[1], *size):
            raise ValueError(f"a separable addend of {tables} (channels, rows, columns) for "
                             f"{x.shape[1]} channels resized to {tuple(size)}")
    if not (our_kernels_may_serve(x) and x.dtype in (torch.float32, torch.float16, torch.bfloat16)):
        out = F.interpolate(x, size=size, mode="bilinear", align_corners=True)
        if isinstance(add, SeparableAddend):
            # each part broadcast over the axis it does not vary along: the same sums as
            # adding `add.dense()`, without building that map
            split = add.cols.shape[1]
            out[:, :split] += add.cols.t()[:, None, :]
            out[:, split:] += add.rows.t()[:, :, None]
            return out
        return out if add is None else out + add
    return _resize_triton(x, size, add)


def _scale(src: int, dst: int) -> float:
    # PyTorch's area_pixel_compute_scale with align_corners, in fp32.
    return float(np.float32(src - 1) / np.float32(dst - 1)) if dst > 1 else 0.0


def _resize_triton(x: torch.Tensor, size: tuple[int, int], add: torch.Tensor | None) -> torch.Tensor:
    import triton

    from ._resize_kernel import _resize_fwd

    n, c, h, w = x.shape
    out_h, out_w = int(size[0]), int(size[1])
    fmt = torch.channels_last if channels_last(x) else torch.contiguous_format
    out = torch.empty(n, c, out_h, out_w, device=x.device, dtype=x.dtype, memory_format=fmt)
    separable = isinstance(add, SeparableAddend)
    if separable:
        # Two addends in one: the column table for channels [0, C1) (stride 0 along y, its
        # rows along x), the row table for channels [C1, C) (stride 0 along x).
        extra, extra2, split = add.cols, add.rows, add.cols.shape[1]
        add_strides = (0, extra.stride(1), 0, extra.stride(0), extra2.stride(1), extra2.stride(0), 0)
    else:
        if add is not None:
            add = add.expand(n, c, out_h, out_w)
        extra = extra2 = add if add is not None else out
        split = c
        add_strides = (*extra.stride(), 0, 0, 0)
    block_p, block_c = 32, min(64, triton.next_power_of_2(c))
    grid = (triton.cdiv(n * out_h * out_w, block_p), triton.cdiv(c, block_c))
    _resize_fwd[grid](
        x, out, extra, extra2, n, c, h, w, out_h, out_w, _scale(h, out_h), _scale(w, out_w), split,
        *x.stride(), *out.stride(), *add_strides,
        HAS_ADD=add is not None, SEPARABLE=separable, ROUNDED=x.is_cuda, BLOCK_P=block_p, BLOCK_C=block_c,
        num_warps=4,
    )
    return out
