"""gelu(fc1(x)) of the blocks' MLPs, with the GELU in the product's epilogue on CUDA.

Left to itself, the compiled trunk runs the GELU after each fc1 as a kernel of its own: a
pass over the 978 x 4096 hidden activations of every ViT, frame and global block, 72
launches a 504x378 frame. cuBLASLt applies a GELU in
the product's epilogue (`torch._addmm_activation`, which torch.compile calls as it is), so
the hidden activations are written once, already activated.

That epilogue's GELU is the tanh approximation. It differs from the exact (erf) GELU by at
most 4.7e-4 (at x ≈ 2.7, where the value is 2.69 and a bf16 step is 1.6e-2): under a tenth
of the bf16 rounding every hidden activation gets anyway. So it serves only products
computed in bf16 or fp16 (the sessions' autocast, or half weights); fp32 keeps the exact
GELU, and so does `plain_pytorch()`, the reference the fast path is checked against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.fused import fused_kernels_allowed
from .quantized import is_quantized

__all__ = ["half_product_dtype", "linear_gelu"]

_HALF = (torch.bfloat16, torch.float16)


def linear_gelu(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """gelu(linear(x)) for x [..., in]: exact GELU, or on CUDA in half precision (see the
    module docstring) one cuBLASLt product with a tanh-GELU epilogue."""
    dtype = half_product_dtype(x, linear)
    if dtype is None:
        return F.gelu(linear(x))
    rows = x.reshape(-1, x.shape[-1]).to(dtype)
    out = torch._addmm_activation(linear.bias.to(dtype), rows, linear.weight.to(dtype).t(), use_gelu=True)
    return out.view(*x.shape[:-1], out.shape[-1])


def half_product_dtype(x: torch.Tensor, linear: nn.Linear) -> torch.dtype | None:
    """The half dtype a biased product of x on CUDA runs in (autocast's, else the weights'),
    or None where it is not half precision, is empty or our fast forms are off
    (`plain_pytorch()`) or the weights are quantized (their own forward computes them): the
    products this epilogue and `split_linear` serve."""
    if not (x.is_cuda and linear.bias is not None and fused_kernels_allowed()) or is_quantized(linear.weight):
        return None
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else linear.weight.dtype
    if dtype not in _HALF or x.dtype not in (dtype, torch.float32) or x.numel() == 0:
        return None
    return dtype
