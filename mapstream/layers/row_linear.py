"""A block's linear layers with their neighbours, in one kernel when the input is one row.

    norm_linear(x, norm, fc1, gelu=True)            ==  gelu(fc1(norm(x)))
    linear_residual(h, fc2, residual=x, scale=g)    ==  x + g * fc2(h)

The camera head refines one camera token a frame, so every product of its trunk is a
matrix-vector product: bound by reading the weights (201 M of them, 16 passes a frame), and
around each one PyTorch launches the LayerNorm before it and the GELU or the scaled residual
add after it as kernels of their own, 11 kernels a trunk block on the step's critical path.
On CUDA, for one row, one Triton kernel (`_row_linear_kernel.py`) computes the norm in its
prologue and the GELU or residual in its epilogue, in fp32 with one rounding at the end (a
half-precision norm's result is rounded first, as the module hands it on). Elsewhere, inside
`plain_pytorch()` or for what the kernel does not take (`_kernel_takes`: more than one row,
mixed dtypes, autocast), it is the composition above; the aggregator's blocks, with ~1k
tokens a frame, always take that path (with fc2's reduction split in two when compiled on
CUDA: `split_linear`). The products are no slower than cuBLAS's and the camera head runs
64 kernels fewer a frame; beside the DPT head, though, they get only the memory bandwidth
its convolutions leave, so with fp32 heads the heads end hardly sooner.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..attention.fused import HAS_TRITON, our_kernels_may_serve
from .linear_gelu import linear_gelu
from .quantized import is_quantized
from .split_linear import split_linear

__all__ = ["linear_residual", "norm_linear"]

_BLOCK_N = 4
_CHUNK_BYTES = 2048
_NUM_WARPS = 4
# A program streams 4 weight rows, 2 KB of each at a time: with fp32 weights 4 x 512 is the
# best of 4-16 rows by 128-512 columns for the trunk's products (more rows, 4 KB chunks or 8
# warps are no faster for the camera head's whole chain either); half weights take 1024
# columns, the same bytes, which keeps every thread's loads 16 bytes wide (512 gives 4- and
# 2-byte loads on sm_90).


def norm_linear(x: torch.Tensor, norm: nn.LayerNorm, linear: nn.Linear, *, gelu: bool = False) -> torch.Tensor:
    """linear(norm(x)), then the exact GELU if `gelu`; x [..., in]."""
    if _fused_ok(x, linear, norm):
        return _row_linear_op(x, linear.weight, linear.bias, norm.weight, norm.bias, None, None, norm.eps, gelu, True)
    return linear_gelu(norm(x), linear) if gelu else linear(norm(x))


def linear_residual(x: torch.Tensor, linear: nn.Linear, residual: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """residual + scale * linear(x) (a LayerScale'd residual branch); x [..., in], residual
    [..., out], scale [out]."""
    if _fused_ok(x, linear, None) and _residual_ok(residual, scale, x, linear):
        return _row_linear_op(x, linear.weight, linear.bias, None, None, residual, scale, 0.0, False, False)
    split = split_linear(x, linear)  # a frame's fc2 under torch.compile on CUDA
    return residual + (linear(x) if split is None else split) * scale


def _fused_ok(x: torch.Tensor, linear: nn.Linear, norm: nn.LayerNorm | None) -> bool:
    return our_kernels_may_serve(x) and _kernel_takes(x, linear, norm)


def _kernel_takes(x: torch.Tensor, linear: nn.Linear, norm: nn.LayerNorm | None) -> bool:
    """The cases the kernel computes, whatever the device: one row of a float dtype shared by
    the layers' parameters, no autocast (the heads run without it)."""
    if x.numel() != x.shape[-1] or x.numel() == 0 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if torch.is_autocast_enabled(x.device.type) or linear.bias is None:
        return False
    if is_quantized(linear.weight):  # a tensor subclass: its own forward reads it
        return False
    if linear.weight.dtype != x.dtype or linear.bias.dtype != x.dtype or linear.weight.stride(-1) != 1:
        return False
    if linear.in_features != x.shape[-1]:  # PyTorch's own error says what is wrong
        return False
    if norm is not None:
        if tuple(norm.normalized_shape) != (x.shape[-1],) or (norm.weight is None) != (norm.bias is None):
            return False
        if norm.weight is not None and norm.weight.dtype not in (x.dtype, torch.float32):
            return False
    return True


def _residual_ok(residual: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> bool:
    out = linear.out_features
    return (
        residual.shape == (*x.shape[:-1], out) and residual.dtype == x.dtype
        and scale.shape == (out,) and scale.dtype == x.dtype
    )


def launch_row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    norm_weight: Optional[torch.Tensor], norm_bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor], scale: Optional[torch.Tensor],
    eps: float, gelu: bool, normed: bool, *, launch=None,
) -> torch.Tensor:
    """Allocate the output [..., out] and run the kernel (`launch` wraps it for torch.compile).
    normed: apply a LayerNorm (affine if norm_weight is given) before the product."""
    import triton

    from ._row_linear_kernel import _row_linear_fwd

    n, k = weight.shape
    row = x.reshape(k).contiguous()
    y = x.new_empty(*x.shape[:-1], n)
    affine = norm_weight is not None
    kernel = _row_linear_fwd if launch is None else launch(_row_linear_fwd)
    kernel[(triton.cdiv(n, _BLOCK_N),)](
        row, weight, bias,
        norm_weight if affine else row, norm_bias if affine else row,
        residual.reshape(n).contiguous() if residual is not None else row,
        scale if scale is not None else row, y,
        n, k, weight.stride(0), eps,
        BLOCK_N=_BLOCK_N, BLOCK_K=_CHUNK_BYTES // weight.element_size(), NORM=normed, NORM_AFFINE=affine,
        ROUND_NORM=normed and x.dtype != torch.float32, GELU=gelu, RESIDUAL=residual is not None,
        num_warps=_NUM_WARPS,
    )
    return y


def _register_op():
    """`launch_row_linear` as the custom op mapstream::row_linear, so that torch.compile
    traces the kernel into the compiled camera-head pieces instead of breaking them."""
    from torch.library import triton_op, wrap_triton

    @triton_op("mapstream::row_linear", mutates_args=())
    def row_linear_op(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
        norm_weight: Optional[torch.Tensor], norm_bias: Optional[torch.Tensor],
        residual: Optional[torch.Tensor], scale: Optional[torch.Tensor],
        eps: float, gelu: bool, normed: bool,
    ) -> torch.Tensor:
        return launch_row_linear(
            x, weight, bias, norm_weight, norm_bias, residual, scale, eps, gelu, normed, launch=wrap_triton,
        )

    return row_linear_op


_row_linear_op = _register_op() if HAS_TRITON else None
