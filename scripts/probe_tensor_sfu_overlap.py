"""Do the tensor cores and the special-function unit work at the same time on this GPU?

The cache-attention kernel's counters (docs/BENCHMARKS.md, session 5) show the tensor pipe
and the special-function pipe each active about half the time, adding up to ~100 % under every
schedule tried. This probe separates the hardware from our schedule with programs of three
kinds, each timing itself with %globaltimer and recording its multiprocessor (%smid):

- "dot": a chain of 64x128x64 bf16 products (`tl.dot`, the kernel's score shape);
- "exp": `exp2` over a 64x128 fp32 tile (the softmax's shape), as a chain;
- "both": the two loops interleaved in one program (one instruction stream, as in attention).

Launches: each kind alone at one program a multiprocessor; then one "dot" and one "exp"
program per multiprocessor. Where a multiprocessor got one of each, their own durations say
what sharing cost: if each runs about as long as alone, the units overlap (and the attention
kernel's schedule is what serialises them); if their durations stretch so that the pair takes
about the sum of the two alone, the exclusion is the hardware's.

Usage (CUDA): python scripts/probe_tensor_sfu_overlap.py [OUT.json]
"""
from __future__ import annotations

import statistics
import sys

import torch
import triton
import triton.language as tl

from _probe import globaltimer, report
from _timing import timeit

DOT, EXP, BOTH = 0, 1, 2


@triton.jit
def _probe(A, B, X, OUT, INFO, kinds, n_dot, n_exp, one, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr, A_IN_REGISTERS: tl.constexpr):
    pid = tl.program_id(0)
    kind = tl.load(kinds + pid)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = tl.load(A + rm[:, None] * BLOCK_K + rk[None, :])
    if A_IN_REGISTERS:
        # Computed, not loaded: Triton feeds it to the tensor cores from registers, as the
        # attention kernel's P in P.V (`one` is 1.0 at run time, so nothing folds).
        a = (a.to(tl.float32) * one).to(tl.bfloat16)
    b = tl.load(B + rk[:, None] * BLOCK_N + rn[None, :])
    x = tl.load(X + rm[:, None] * BLOCK_N + rn[None, :])
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    tl.debug_barrier()
    t0 = globaltimer()
    dots = tl.where(kind != 1, n_dot, 0)
    exps = tl.where(kind != 0, n_exp, 0)
    steps = tl.maximum(dots, exps)
    for i in range(steps):
        if i < dots:
            acc = tl.dot(a, b, acc)
        if i < exps:
            x = tl.math.exp2(x) - 1.0  # stays in (-1, 0]: a chain the compiler cannot fold
    base = OUT + pid * BLOCK_M * BLOCK_N + rm[:, None] * BLOCK_N + rn[None, :]
    tl.store(base, acc + x)
    tl.debug_barrier()
    t1 = globaltimer()
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(INFO + pid * 3 + 0, smid.to(tl.int64))
    tl.store(INFO + pid * 3 + 1, t0)
    tl.store(INFO + pid * 3 + 2, t1)


def measure(a_in_registers: bool, n_dot: int = 20000) -> dict:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bm, bn, bk = 64, 128, 64
    a = torch.randn(bm, bk, device=dev, dtype=torch.bfloat16) * 0.01
    b = torch.randn(bk, bn, device=dev, dtype=torch.bfloat16) * 0.01
    x = -torch.rand(bm, bn, device=dev)

    def launch(kinds: list[int], n_exp: int) -> tuple[float, list[tuple[int, int, float]]]:
        """Wall ms of one launch, and (kind, sm, own ms) for each program."""
        n = len(kinds)
        kt = torch.tensor(kinds, device=dev, dtype=torch.int32)
        out = torch.empty(n, bm, bn, device=dev)
        info = torch.zeros(n, 3, device=dev, dtype=torch.int64)
        args = (a, b, x, out, info, kt, n_dot, n_exp, 1.0)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, A_IN_REGISTERS=a_in_registers, num_warps=4)
        # One warm-up launch (compilation), one timed; `info` holds the timed one's clocks.
        ms = timeit(lambda: _probe[(n,)](*args, **meta), reps=1, warmup=1) / 1e3
        rows = [(k, int(s), (t1 - t0) / 1e6) for k, (s, t0, t1) in zip(kinds, info.tolist())]
        return ms, rows

    def own(rows, kind):
        return statistics.median(ms for k, _, ms in rows if k == kind)

    # Exponential chains sized to take about as long alone as the product chain.
    _, r = launch([DOT] * sms, n_dot)
    t_dot = own(r, DOT)
    _, r = launch([EXP] * sms, n_dot)
    n_exp = max(1, round(n_dot * t_dot / own(r, EXP)))
    _, r = launch([EXP] * sms, n_exp)
    t_exp = own(r, EXP)
    _, r = launch([BOTH] * sms, n_exp)
    t_both = own(r, BOTH)
    _, r2 = launch([DOT] * (2 * sms), n_exp)
    t_dot2 = own(r2, DOT)
    _, r = launch([EXP] * (2 * sms), n_exp)
    t_exp2 = own(r, EXP)
    # Programs 0..sms-1 multiply, the rest exponentiate: the block scheduler usually fills
    # every multiprocessor once before giving any a second, so most get one of each.
    wall_mix, rows = launch([DOT] * sms + [EXP] * sms, n_exp)
    by_sm: dict[int, list] = {}
    for k, s, ms in rows:
        by_sm.setdefault(s, []).append((k, ms))
    pairs = [v for v in by_sm.values() if sorted(k for k, _ in v) == [DOT, EXP]]
    dot_shared = statistics.median(ms for v in pairs for k, ms in v if k == DOT) if pairs else None
    exp_shared = statistics.median(ms for v in pairs for k, ms in v if k == EXP) if pairs else None
    pair_span = statistics.median(max(ms for _, ms in v) for v in pairs) if pairs else None
    res = {
        "a_in_registers": a_in_registers, "sms": sms, "n_dot": n_dot, "n_exp": n_exp,
        "dot_alone_ms": t_dot, "exp_alone_ms": t_exp,
        "dot_two_per_sm_ms": t_dot2, "exp_two_per_sm_ms": t_exp2,
        "both_in_one_program_ms": t_both,
        "sms_with_one_of_each": len(pairs),
        "dot_beside_exp_ms": dot_shared, "exp_beside_dot_ms": exp_shared,
        "pair_span_ms": pair_span, "mixed_launch_wall_ms": wall_mix,
        "dot_tflops_one_per_sm": sms * 2 * bm * bn * bk * n_dot / t_dot / 1e9,
        # 1: a pair of programs takes as long as the longer alone (the units overlap);
        # 0: as long as both alone one after the other (they exclude each other).
        "overlap_two_programs": (t_dot + t_exp - pair_span) / min(t_dot, t_exp) if pairs else None,
        "overlap_one_program": (t_dot + t_exp - t_both) / min(t_dot, t_exp),
    }
    return res


def main(out_path: str | None = None) -> None:
    res = [measure(False), measure(True)]
    report(res, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:2])
