"""Do the tensor cores and the special-function unit work at the same time on this GPU?

The cache-attention kernel's counters (docs/BENCHMARKS.md, session 5) show the tensor pipe
and the special-function pipe each active about half the time, adding up to ~100 % under every
schedule tried. This probe separates the hardware from our schedule: programs that only run
matrix products (64x128x64 bf16 `tl.dot`, the kernel's score shape), programs that only run
exponentials (`exp2` over a 64x128 fp32 tile, the softmax's shape), and a launch of both kinds
sharing the multiprocessors (two programs each, one of each kind where the block scheduler
puts them so; the script reports how many multiprocessors got one of each, from %smid).

If the mixed launch takes about the longer of the two alone, the units overlap and the
attention kernel's schedule is what serialises them; if it takes about their sum, the
exclusion is in the hardware and head dim 64 attention is bound at about half the tensor rate.

Usage (CUDA): python scripts/probe_tensor_sfu_overlap.py [OUT.json]
"""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _probe(A, B, X, OUT, SMID, n_iter, n_dot_programs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(SMID + pid, smid)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    if pid < n_dot_programs:
        a = tl.load(A + rm[:, None] * BLOCK_K + rk[None, :])
        b = tl.load(B + rk[:, None] * BLOCK_N + rn[None, :])
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for _ in range(n_iter):
            acc = tl.dot(a, b, acc)
        tl.store(OUT + pid * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :], acc)
    else:
        x = tl.load(X + rm[:, None] * BLOCK_N + rn[None, :])
        for _ in range(n_iter):
            x = tl.math.exp2(x) - 1.0  # stays in (-1, 0]: a chain the compiler cannot fold
        tl.store(OUT + pid * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :], x)


def main(out_path: str | None = None, iters: int = 20000) -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bm, bn, bk = 64, 128, 64
    a = torch.randn(bm, bk, device=dev, dtype=torch.bfloat16) * 0.01
    b = torch.randn(bk, bn, device=dev, dtype=torch.bfloat16) * 0.01
    x = -torch.rand(bm, bn, device=dev)

    def launch(n_dot: int, n_exp: int) -> tuple[float, list[int]]:
        """ms of one launch of n_dot product programs then n_exp exponential programs."""
        n = n_dot + n_exp
        out = torch.empty(n, bm, bn, device=dev)
        smid = torch.full((n,), -1, device=dev, dtype=torch.int32)
        args = (a, b, x, out, smid, iters, n_dot)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
        _probe[(n,)](*args, **meta)  # compile and warm up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        _probe[(n,)](*args, **meta)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), smid.tolist()

    t_dot, _ = launch(sms, 0)
    t_exp, _ = launch(0, sms)
    t_dot2, _ = launch(2 * sms, 0)
    t_exp2, _ = launch(0, 2 * sms)
    # Program p < sms multiplies, p >= sms exponentiates; 2 * sms programs sit two to a
    # multiprocessor. %smid says where each one ran.
    t_mix, smid = launch(sms, sms)
    kinds: dict[int, set] = {}
    for p, s in enumerate(smid):
        kinds.setdefault(s, set()).add("dot" if p < sms else "exp")
    res = {
        "sms": sms, "iters": iters,
        "dot_alone_ms": t_dot, "exp_alone_ms": t_exp,
        "dot_two_per_sm_ms": t_dot2, "exp_two_per_sm_ms": t_exp2,
        "mixed_ms": t_mix, "sms_with_one_of_each": sum(1 for k in kinds.values() if k == {"dot", "exp"}),
        "dot_tflops_two_per_sm": 2 * sms * 2 * bm * bn * bk * iters / t_dot2 / 1e9,
        "exp_per_clock_per_sm_two_per_sm_at_1.98GHz": 2 * bm * bn * iters / (t_exp2 * 1e-3 * 1.98e9),
        # 1: the mixed launch takes as long as the longer kind alone (the units overlap);
        # 0: as long as both alone one after the other (they exclude each other).
        "overlap": (t_dot + t_exp - t_mix) / min(t_dot, t_exp),
    }
    print(json.dumps(res, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
