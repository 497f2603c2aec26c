"""Between the overlap probe and the attention kernel: where does the overlap get lost?

`probe_tensor_sfu_overlap.py` showed that a program of products and a program of
exponentials on one multiprocessor overlap (docs/BENCHMARKS.md, session 6, part 1), while
the attention kernel, two programs a multiprocessor, costs the sum of its products and its
exponentials. This probe runs the attention's loop in steps from the one to the other, each
program timing itself (%globaltimer), 4 warps, 64 query rows, 128-key tiles, head dim 64:

- CHAIN: scores = Q Kᵀ, P = 2^(scores·c − 8), acc += P V — the dependent chain, no
  row statistics; K and V loaded once before the loop (nothing streams);
- + STREAM=1: K/V tiles loaded every iteration from a 64k-key buffer (pointer loads,
  software-pipelined like the kernel's non-TMA path); STREAM=2: through TMA descriptors
  (the kernel's default path);
- + ONLINE=1: the online softmax (row max, rescale of acc and the row sum), i.e. the kernel.

Each at one and at two programs a multiprocessor (1 × and 2 × the multiprocessor count),
reported as ns per tile per multiprocessor, next to the components measured alone in the
same process (a 64x128x64 product, 8,192 exponentials). Reading it: if two programs of CHAIN
take about (2 products + exponentials) / 2 per tile, dependent chains do overlap across
programs and a later step (streaming, row statistics) is what serialises them; if they take
the sum, the dependence itself does.

Usage (CUDA sm90): python scripts/probe_attention_chain.py [OUT.json]
"""
from __future__ import annotations

import statistics
import sys

import torch
import triton
import triton.language as tl

from _probe import globaltimer, report
from _timing import timeit


@triton.jit
def _chain(Q, K, V, k_desc, v_desc, OUT, TIMES, n_iter, n_keys, scale,
           STREAM: tl.constexpr, ONLINE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           HEAD_DIM: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rm[:, None] * HEAD_DIM + rd[None, :])
    k = tl.load(K + rn[:, None] * HEAD_DIM + rd[None, :])
    v = tl.load(V + rn[:, None] * HEAD_DIM + rd[None, :])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Programs start at different places of the key buffer, as row blocks of different heads do.
    base = (pid * 7 * BLOCK_N) % (n_keys - BLOCK_N)
    tl.debug_barrier()
    t0 = globaltimer()
    for i in tl.range(0, n_iter):
        if STREAM == 1:
            start = (base + i * BLOCK_N) % (n_keys - BLOCK_N)
            k = tl.load(K + (start + rn)[:, None] * HEAD_DIM + rd[None, :])
            v = tl.load(V + (start + rn)[:, None] * HEAD_DIM + rd[None, :])
        elif STREAM == 2:
            start = (base + i * BLOCK_N) % (n_keys - BLOCK_N)
            k = k_desc.load([start, 0])
            v = v_desc.load([start, 0])
        s = tl.dot(q, tl.trans(k))
        if ONLINE:
            m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
            p = tl.math.exp2(s * scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        else:
            p = tl.math.exp2(s * scale - 8.0)
            acc = tl.dot(p.to(v.dtype), v, acc)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(OUT + pid * BLOCK_M * HEAD_DIM + rm[:, None] * HEAD_DIM + rd[None, :], out)
    tl.debug_barrier()
    t1 = globaltimer()
    tl.store(TIMES + pid * 2, t0)
    tl.store(TIMES + pid * 2 + 1, t1)


@triton.jit
def _dots(Q, K, OUT, n_iter, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rm[:, None] * HEAD_DIM + rd[None, :])
    k = tl.load(K + rn[:, None] * HEAD_DIM + rd[None, :])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(n_iter):
        acc = tl.dot(q, tl.trans(k), acc)
    tl.store(OUT + tl.program_id(0) * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :], acc)


@triton.jit
def _exps(X, OUT, n_iter, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    x = tl.load(X + rm[:, None] * BLOCK_N + rn[None, :])
    for _ in range(n_iter):
        x = tl.math.exp2(x) - 1.0
    tl.store(OUT + tl.program_id(0) * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :], x)


def _launch_ms(fn) -> float:
    """ms of one launch of `fn`, after one warm-up launch (compilation)."""
    return timeit(fn, reps=1, warmup=1) / 1e3


def main(out_path: str | None = None, n_iter: int = 4000) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bm, bn, d, n_keys = 64, 128, 64, 65536
    q = torch.randn(bm, d, device=dev, dtype=torch.bfloat16) * 0.3
    k = torch.randn(n_keys, d, device=dev, dtype=torch.bfloat16) * 0.3
    v = torch.randn(n_keys, d, device=dev, dtype=torch.bfloat16)
    k_desc = TensorDescriptor(k, list(k.shape), list(k.stride()), [bn, d])
    v_desc = TensorDescriptor(v, list(v.shape), list(v.stride()), [bn, d])
    res: dict = {"sms": sms, "n_iter": n_iter}

    # Components alone, as ns a tile per multiprocessor at two programs a multiprocessor.
    scratch = torch.empty(2 * sms, bm, bn, device=dev)
    ms = _launch_ms(lambda: _dots[(2 * sms,)](q, k, scratch, n_iter, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, num_warps=4))
    res["product_ns_per_sm"] = ms * 1e6 / (2 * n_iter)
    x = -torch.rand(bm, bn, device=dev)
    ms = _launch_ms(lambda: _exps[(2 * sms,)](x, scratch, n_iter, BLOCK_M=bm, BLOCK_N=bn, num_warps=4))
    res["exp_tile_ns_per_sm"] = ms * 1e6 / (2 * n_iter)
    res["serial_tile_ns"] = 2 * res["product_ns_per_sm"] + res["exp_tile_ns_per_sm"]
    res["overlapped_tile_ns"] = max(2 * res["product_ns_per_sm"], res["exp_tile_ns_per_sm"])

    for stream in (0, 1, 2):
        for online in (0, 1):
            for per_sm in (1, 2):
                n = per_sm * sms
                out = torch.empty(n, bm, d, device=dev)
                times = torch.zeros(n, 2, device=dev, dtype=torch.int64)
                # The programs' own clocks of the timed (second) launch are what counts.
                _launch_ms(lambda: _chain[(n,)](
                    q, k, v, k_desc, v_desc, out, times, n_iter, n_keys, 0.18, STREAM=stream, ONLINE=online,
                    BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=d, num_warps=4, num_stages=3))
                own_ns = statistics.median((t1 - t0) for t0, t1 in times.tolist())
                # A multiprocessor finishes per_sm tiles in the time one program takes for one.
                res[f"stream{stream}_online{online}_{per_sm}per_sm_tile_ns"] = own_ns / n_iter / per_sm
                assert torch.isfinite(out).all()
    report(res, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:2])
