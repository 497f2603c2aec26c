"""A linear layer over a few rows: y = x Wᵀ + b for x [..., K] with at most `MAX_ROWS` rows.

The camera head refines one token a frame through four 2048-wide blocks, four times: sixteen
passes over ≈ 50 M weights (200 MB in fp32) a frame, each pass reading them for one row. cuBLAS
serves those products with GEMM tiles that read the weights at about half the H200's memory
bandwidth, and the camera head is the longest chain of the step's tail (docs/BENCHMARKS.md,
session 7). On CUDA one Triton kernel (`_skinny_kernel.py`) splits the outputs and the
reduction over enough programs to keep every multiprocessor's loads in flight; elsewhere, for
more rows, and under autocast it is `F.linear`.

Arithmetic: fp32 multiply-adds whatever the storage dtype (fp32 stays exact, no TF32), the
reduction split in fixed slices summed in a fixed order — deterministic, and within a few fp32
units of cuBLAS, whose order differs.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from ..attention.fused import HAS_TRITON, our_kernels_may_serve

__all__ = ["MAX_ROWS", "skinny_linear"]

MAX_ROWS = 4


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; on our kernel when x has at most MAX_ROWS rows."""
    if our_kernels_may_serve(x) and _kernel_takes(x, weight, bias):
        rows = x.reshape(-1, x.shape[-1])
        return _skinny_op(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def _kernel_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The cases the kernel computes, whatever the device: 1..MAX_ROWS rows of one float dtype
    shared with the weights, unit last strides, not under autocast (which would run the
    product in its own dtype)."""
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or x.shape[-1] == 0:
        return False
    if not 1 <= x.numel() // x.shape[-1] <= MAX_ROWS:
        return False
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) or weight.dtype != x.dtype:
        return False
    if torch.is_autocast_enabled(x.device.type):
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        return False
    return weight.stride(1) == 1 and x.stride(-1) == 1 and (x.dim() == 1 or x.reshape(-1, x.shape[-1]).stride(-1) == 1)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def plan(n_out: int, n_in: int, element_size: int, programs_wanted: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K): 16-output blocks, 512-byte rows of W a tile, and the
    reduction split until there are about `programs_wanted` programs (slices of at least
    four tiles, so a slice still streams)."""
    block_n = 16
    block_k = 512 // element_size
    blocks = -(-n_out // block_n)
    tiles = -(-n_in // block_k)
    split = max(1, min(-(-programs_wanted // blocks), tiles // 4))
    return block_n, block_k, split


def launch_skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], *, launch=None,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """y [R, N] = x [R, K] Wᵀ + b with our kernel (`launch` wraps it for torch.compile);
    config: (BLOCK_N, BLOCK_K, SPLIT_K), None: `plan` for this GPU."""
    import triton

    from ._skinny_kernel import _skinny_fwd, _skinny_sum

    rows, n_in = x.shape
    n_out = weight.shape[0]
    y = x.new_empty(rows, n_out)
    if config is None:
        sms = _multiprocessors(x.device.index if x.device.index is not None else torch.cuda.current_device())
        config = plan(n_out, n_in, x.element_size(), 4 * sms)
    block_n, block_k, split = config
    k_per_split = triton.cdiv(triton.cdiv(n_in, split), block_k) * block_k
    split = triton.cdiv(n_in, k_per_split)
    part = torch.empty(split, rows, n_out, device=x.device, dtype=torch.float32) if split > 1 else y
    wrap = launch or (lambda kernel: kernel)
    row_block = triton.next_power_of_2(rows)
    has_bias = bias is not None
    wrap(_skinny_fwd)[(triton.cdiv(n_out, block_n), split)](
        x, weight, bias if has_bias else x, y, part,
        rows, n_out, n_in, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
        ROWS=row_block, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, K_TILES=k_per_split // block_k,
        HAS_BIAS=has_bias, num_warps=4,
    )
    if split > 1:
        wrap(_skinny_sum)[(triton.cdiv(n_out, 1024), rows)](
            part, bias if has_bias else x, y, rows, n_out, y.stride(0),
            SPLIT_K=split, BLOCK=1024, HAS_BIAS=has_bias, num_warps=4,
        )
    return y


def _register_op():
    """`launch_skinny_linear` as the custom op mapstream::skinny_linear (traced by torch.compile)."""
    from torch.library import triton_op, wrap_triton

    @triton_op("mapstream::skinny_linear", mutates_args=())
    def skinny_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return launch_skinny_linear(x, weight, bias, launch=wrap_triton)

    return skinny_op


_skinny_op = _register_op() if HAS_TRITON else None
