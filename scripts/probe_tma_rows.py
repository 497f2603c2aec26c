"""How much memory bandwidth can one multiprocessor draw for a one-row product, with plain
loads (the camera head's row kernel) and with bulk tensor copies (TMA)?

Session 20 (docs/BENCHMARKS.md) found the camera head's fp32 chain bound by the bandwidth each
multiprocessor draws: ≈ 55-58 GB/s with the row kernel, so the chain needs nearly the whole GPU
and cannot leave the DPT head room beside it. A partition of its own would pay only with a
kernel drawing ≈ 3x more per multiprocessor. This probe measures that rate before any such
kernel is built into the step. It times y = W x (fp32, no norm, no epilogue) for one weight
matrix, captured in a CUDA graph of several calls (median of 50 replays):

- `row kernel`: `mapstream.layers.row_linear.launch_row_linear`, the camera head's kernel;
- `tma sS bN kK`: each program streams BLOCK_N rows of W in [BLOCK_N, BLOCK_K] boxes through a
  host tensor descriptor, the loop pipelined by Triton over S stages (the copies land in
  shared memory with no register staging);
- `tma persistent ...`: one program a multiprocessor of the partition, looping over row blocks
  and chunks as one flattened loop, so the pipeline also runs ahead across row blocks;
- `torch.mv`: cuBLAS's matrix-vector product, and `sum`, a plain read of the same bytes.

each on all SMs and on green-context partitions of --sms multiprocessors. Every variant's
output is compared with torch.mv's (fp32). Also the achievable read rate of the whole GPU.

Usage (device): python3 scripts/probe_tma_rows.py [--sms 16 32] [--rows 8192 --cols 8192] [--out FILE.json]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from _partition import sm_partition
from _probe import report
from _timing import timeit

from mapstream.layers.row_linear import launch_row_linear


@triton.jit
def _tma_rows(W, X, Y, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    n0 = tl.program_id(0) * BLOCK_N
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        w = W.load([n0, k])
        cols = k + tl.arange(0, BLOCK_K)
        x = tl.load(X + cols, mask=cols < K, other=0.0)
        acc += w * x[None, :]
    rows = n0 + tl.arange(0, BLOCK_N)
    tl.store(Y + rows, tl.sum(acc, 1), mask=rows < N)


@triton.jit
def _tma_rows_persistent(W, X, Y, N, K, PROGRAMS, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         STAGES: tl.constexpr):
    chunks = tl.cdiv(K, BLOCK_K)
    blocks = tl.cdiv(N, BLOCK_N)
    mine = tl.cdiv(blocks - tl.program_id(0), PROGRAMS)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in tl.range(0, mine * chunks, num_stages=STAGES):
        block = tl.program_id(0) + (i // chunks) * PROGRAMS
        k = (i % chunks) * BLOCK_K
        w = W.load([block * BLOCK_N, k])
        cols = k + tl.arange(0, BLOCK_K)
        x = tl.load(X + cols, mask=cols < K, other=0.0)
        acc += w * x[None, :]
        if i % chunks == chunks - 1:
            rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(Y + rows, tl.sum(acc, 1), mask=rows < N)
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", type=int, nargs="*", default=[16, 32])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from triton.tools.tensor_descriptor import TensorDescriptor

    torch.manual_seed(0)
    N, K = args.rows, args.cols
    W = torch.randn(N, K, device="cuda")
    bias = torch.zeros(N, device="cuda")
    x = torch.randn(K, device="cuda")
    y = torch.empty(N, device="cuda")
    want = torch.mv(W, x)
    nbytes = W.numel() * 4
    sms_all = torch.cuda.get_device_properties(0).multi_processor_count

    def tma(stages, bn, bk):
        desc = TensorDescriptor(W, [N, K], [K, 1], [bn, bk])
        return lambda sms: _tma_rows[(triton.cdiv(N, bn),)](desc, x, y, N, K, BLOCK_N=bn, BLOCK_K=bk,
                                                           STAGES=stages, num_warps=4)

    def persistent(stages, bn, bk, per_sm):
        desc = TensorDescriptor(W, [N, K], [K, 1], [bn, bk])

        def launch(sms):
            programs = min(per_sm * sms, triton.cdiv(N, bn))
            _tma_rows_persistent[(programs,)](desc, x, y, N, K, programs, BLOCK_N=bn, BLOCK_K=bk,
                                             STAGES=stages, num_warps=4)
        return launch

    variants = {
        "row kernel": lambda sms: y.copy_(launch_row_linear(x, W, bias, None, None, None, None, 0.0, False, False)),
        "torch.mv": lambda sms: torch.mv(W, x, out=y),
    }
    for stages, bn, bk in [(2, 16, 256), (4, 16, 256), (6, 16, 256), (4, 32, 256), (8, 8, 256), (3, 64, 128)]:
        variants[f"tma s{stages} n{bn} k{bk}"] = tma(stages, bn, bk)
    for stages, bn, bk, per_sm in [(4, 16, 256, 1), (6, 16, 256, 1), (4, 16, 256, 2), (8, 8, 256, 2)]:
        variants[f"tma persistent s{stages} n{bn} k{bk} x{per_sm}"] = persistent(stages, bn, bk, per_sm)

    res = {"shape": [N, K], "bytes": nbytes}
    res["sum, all SMs"] = {"TB_s": round(nbytes / timeit(lambda: W.sum()) / 1e6, 2)}

    def measure(stream, sms):
        with torch.cuda.stream(stream):
            out = {}
            for name, launch in variants.items():
                try:
                    y.zero_()
                    launch(sms)
                    torch.cuda.synchronize()
                    err = float(((y - want).abs().max() / want.abs().max()))
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        for _ in range(args.calls):
                            launch(sms)
                    us = timeit(graph.replay) / args.calls
                    out[name] = {"us": round(us, 1), "TB_s": round(nbytes / us / 1e6, 2),
                                 "GB_s_per_SM": round(nbytes / us / 1e3 / sms, 1), "rel_err": err}
                except Exception as exc:  # a variant that does not compile must not stop the others
                    out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                print(sms, name, out[name], flush=True)
            return out

    res["all SMs"] = measure(torch.cuda.Stream(), sms_all)
    for n in args.sms:
        (part, got), _ = sm_partition(n)
        res[f"{got} SMs"] = measure(part, got)
    report(res, args.out)


if __name__ == "__main__":
    main()
