"""The camera head's one-row products: how far cuBLAS is from the memory bandwidth.

With one camera token a frame, every product of the camera head is a matrix-vector product,
and its four refinement passes read the trunk's 201 M weights four times a frame: 3.2 GB in
fp32 (the protocol's heads), 1.6 GB in bf16, 0.75 / 0.37 ms at the H200's ~4.3 TB/s. In the
step's profile (session 11, call 2, fp32 heads) the head's products (`gemv2T_kernel_val`,
49 calls, and a second cuBLAS kernel, 58 calls) took 2.6 ms of kernel time beside the DPT head.
This times them alone: cuBLAS (`F.linear`, what runs) against a plain Triton kernel (a
program per block of output rows, the row's dot products in fp32), at the trunk's shapes. The
weights rotate through copies larger than L2 together, as in the head, where no product finds
its weights cached. CUDA graphs of `calls` products, interleaved rounds, µs a product and
GB/s of weights read.

Usage (device): python3 scripts/bench_camera_gemv.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from _probe import report
from _timing import captured, interleaved

SHAPES = {"qkv 2048->6144": (6144, 2048), "proj 2048->2048": (2048, 2048),
          "fc1 2048->8192": (8192, 2048), "fc2 8192->2048": (2048, 8192)}


@triton.jit
def _gemv(X, W, B, Y, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[rows] = W[rows] @ x + b[rows] for this program's BLOCK_N rows, fp32 accumulation."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in tl.range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        x = tl.load(X + cols, mask=cols < K, other=0.0).to(tl.float32)
        w = tl.load(W + rows[:, None].to(tl.int64) * K + cols[None, :],
                    mask=row_ok[:, None] & (cols[None, :] < K), other=0.0).to(tl.float32)
        acc += w * x[None, :]
    y = tl.sum(acc, 1) + tl.load(B + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    _gemv[(triton.cdiv(n, block_n),)](x, w, b, y, n, k, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)
    return y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--calls", type=int, default=16)
    args = parser.parse_args()
    res = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, (n, k) in SHAPES.items():
            copies = max(args.calls, -(-256 * 2**20 // (n * k * dtype.itemsize)))  # > L2 together
            ws = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(copies)]
            b = torch.randn(n, device="cuda", dtype=dtype)
            x = torch.randn(k, device="cuda", dtype=dtype)
            want = F.linear(x.double(), ws[0].double(), b.double())
            variants = {"cublas": lambda w: F.linear(x, w, b)}
            for bn, bk in ((4, 512), (8, 256), (16, 128), (8, 512)):
                variants[f"triton {bn}x{bk}"] = lambda w, bn=bn, bk=bk: gemv(x, w, b, bn, bk)
            errors = {v: ((fn(ws[0]).double() - want).norm() / want.norm()).item() for v, fn in variants.items()}
            counter = iter(range(10**9))
            graphs = {
                v: captured(lambda fn=fn: [fn(ws[next(counter) % copies]) for _ in range(args.calls)]).replay
                for v, fn in variants.items()
            }
            times = interleaved(graphs, rounds=5, label=f"{str(dtype)[6:]:8s} {name:16s} ", calls=args.calls)
            gbytes = n * k * dtype.itemsize / 1e9
            res[f"{str(dtype)[6:]} {name}"] = {
                v: {"us": statistics.median(ts), "GB_per_s": gbytes / (statistics.median(ts) * 1e-6),
                    "rel_err_vs_fp64": errors[v]}
                for v, ts in times.items()
            }
            del ws
    report(res, args.out)


if __name__ == "__main__":
    main()
