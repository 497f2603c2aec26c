"""The trunk's linear layers at one frame's token count, cuBLAS against the alternatives.

Each aggregator / ViT block multiplies one frame's tokens (978 at 504x378) by four weights:
q/k/v 1024->3072, projection 1024->1024, fc1 1024->4096, fc2 4096->1024. With M = 978 the
N = 1024 products fill only 64 tiles of 128x128 on 132 multiprocessors, so they run well
below the chip's rate. Compared here (bf16, bias, µs a call, 20 calls a CUDA graph, median of
5 interleaved rounds):

- `cublas`: F.linear as the model runs it (eager and inside the compiled blocks);
- `cublaslt`: F.linear with `torch.backends.cuda.preferred_blas_library("cublaslt")` (its
  heuristics may pick split-K or stream-K kernels for the narrow products);
- `autotune`: Inductor's max-autotune choice (its Triton GEMM templates timed against cuBLAS);
- `fp8-rows`: torch._scaled_mm with e4m3 operands and per-row / per-column scales (what an
  fp8 trunk would cost, quantization of the activations included);
- `bmm-split2` / `bmm-split2+sum`: the reduction split in two halves run as one batched cuBLAS
  product with fp32 outputs (twice the tiles, so the N = 1024 products fill the chip), alone
  and with the halves summed with the bias into bf16 (what a fused epilogue would have to read);
- `triton-split2+sum` / `triton-m64`: the same split in a Triton kernel of 128x128 tiles, and
  one of 64-row tiles without a split (128 tiles for N = 1024).

Usage (device): python3 scripts/bench_trunk_gemms.py [--tokens 978] [--no-autotune] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from _timing import captured, interleaved

SHAPES = {"qkv": (1024, 3072), "proj": (1024, 1024), "fc1": (1024, 4096), "fc2": (4096, 1024)}


def _fp8_linear(x, w8, w_scale, bias):
    amax = x.abs().amax(dim=1, keepdim=True).float().clamp_min(1e-6)
    x_scale = amax / 448.0
    x8 = (x / x_scale).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(), bias=bias, out_dtype=torch.bfloat16)


def _bmm_split2(x, w):
    """x @ w.T with the reduction in two halves, as one batched product of fp32 outputs [2, M, N]."""
    m, k = x.shape
    halves_x = x.view(m, 2, k // 2).transpose(0, 1)
    halves_w = w.view(w.shape[0], 2, k // 2).permute(1, 2, 0)
    return torch.bmm(halves_x, halves_w, out_dtype=torch.float32)


@triton.jit
def _split_gemm(x_ptr, w_ptr, out_ptr, b_ptr, M, N, K, K_SPLIT, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BIAS: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    n_tiles = tl.cdiv(N, BLOCK_N)
    rows = (tile // n_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    k0 = split * K_SPLIT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(k0, k0 + K_SPLIT, BLOCK_K):
        a = tl.load(x_ptr + rows[:, None] * K + (kk + ks)[None, :], mask=rows[:, None] < M, other=0.0)
        b = tl.load(w_ptr + cols[None, :] * K + (kk + ks)[:, None])
        acc = tl.dot(a, b, acc)
    if BIAS:
        acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
    mask = rows[:, None] < M
    if SPLITS == 1:
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + split * M * N + rows[:, None] * N + cols[None, :], acc, mask=mask)


def _triton_linear(x, w, b, splits, block_m, block_n=128, block_k=64, warps=8, stages=4):
    m, k = x.shape
    n = w.shape[0]
    if splits == 1:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    else:
        out = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), splits)
    _split_gemm[grid](x, w, out, b, m, n, k, k // splits, SPLITS=splits, BLOCK_M=block_m, BLOCK_N=block_n,
                      BLOCK_K=block_k, BIAS=splits == 1, num_warps=warps, num_stages=stages)
    if splits == 1:
        return out
    return (out.sum(0) + b).to(x.dtype)


def _cublaslt_linear(x, w, b):
    """F.linear through cuBLASLt: the library preference is read when the product is launched
    (and captured with it), so it is switched around the call only."""
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return F.linear(x, w, b)
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=978)
    parser.add_argument("--no-autotune", action="store_true", help="skip Inductor's minutes of autotuning")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    results = {}
    for name, (k, n) in SHAPES.items():
        x = torch.randn(args.tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device=dev, dtype=torch.bfloat16)
        autotuned = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
        w_scale = (w.abs().amax(dim=1, keepdim=True).float() / 448.0).clamp_min(1e-12)
        w8 = (w / w_scale).to(torch.float8_e4m3fn)
        variants = {
            "cublas": lambda: F.linear(x, w, b),
            "cublaslt": lambda: _cublaslt_linear(x, w, b),
            "autotune": lambda: autotuned(x, w, b),
            "fp8-rows": lambda: _fp8_linear(x, w8, w_scale, b),
            "bmm-split2": lambda: _bmm_split2(x, w),
            "bmm-split2+sum": lambda: (_bmm_split2(x, w).sum(0) + b).to(x.dtype),
            "triton-split2+sum": lambda: _triton_linear(x, w, b, splits=2, block_m=128),
            "triton-m64": lambda: _triton_linear(x, w, b, splits=1, block_m=64, warps=4),
            "triton-m128": lambda: _triton_linear(x, w, b, splits=1, block_m=128),
        }
        if args.no_autotune:
            variants.pop("autotune")
        ref = F.linear(x.float(), w.float(), b.float())
        errors = {}
        for label, fn in list(variants.items()):
            try:
                out = fn().float()
                if out.dim() == 3:  # fp32 halves of the reduction, bias not yet added
                    out = out.sum(0) + b.float()
                errors[label] = float((out - ref).norm() / ref.norm())
            except Exception as exc:  # an unsupported variant is reported, not fatal
                print(f"{name} {label}: {type(exc).__name__}: {exc}")
                variants.pop(label)
        graphs = {label: captured(fn, calls=20) for label, fn in variants.items()}
        flops = 2.0 * args.tokens * k * n
        times = interleaved({label: g.replay for label, g in graphs.items()}, label=f"{name:5s} ", flops=flops, calls=20)
        results[name] = {
            label: {"us": sorted(ts)[len(ts) // 2], "rel_error": errors[label]} for label, ts in times.items()
        }
        print(f"{name}: relative errors {errors}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
