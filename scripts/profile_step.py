"""Where a steady-state streaming step spends its time (CUDA): wall time per step against
the sum of GPU kernel time (the gap is host/launch overhead), and the top kernels.

Usage: python scripts/profile_step.py [--compile] [--backend sdpa|flashinfer] [--out FILE] [--trace FILE]
(a trace is summarized per part of the step by scripts/trace_summary.py)
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from mapstream.bench import BenchConfig, build_bench_model
from mapstream.models.compile import compile_model


# Kernel-name fragments -> a coarse kind, first match wins (names differ across libraries).
_KINDS = (
    ("attention", ("flash", "fmha", "attention", "prefill", "_fwd")),
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul")),
    ("conv", ("conv", "implicit", "winograd", "dgrad", "wgrad")),
    ("norm", ("norm",)),
    ("copy/cast", ("copy", "cast", "convert")),
    ("upsample", ("upsample", "interpolate")),
)


def _by_kind(rows) -> dict[str, float]:
    totals: dict[str, float] = {}
    for e in rows:
        name = e.key.lower()
        kind = next((k for k, frags in _KINDS if any(f in name for f in frags)), "elementwise/other")
        totals[kind] = totals.get(kind, 0.0) + e.self_device_time_total / 1e3 / 2
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--fast", action="store_true", help="CUDA-graph fast path (Session(fast=True))")
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--out", default=None)
    ap.add_argument("--whole", action="store_true", help="with --fast: the whole step as one CUDA graph (fast='whole')")
    ap.add_argument("--pieces", action="store_true", help="with --fast: the step in pieces around the cache attentions (fast='pieces'); default: the session's choice")
    ap.add_argument("--compile-heads", action="store_true", help="with --compile: compile the DPT heads too")
    ap.add_argument("--bf16-heads", action="store_true", help="heads cast to bf16 too (bench variant bf16-heads)")
    ap.add_argument("--compile-mode", default=None, help="with --compile: torch.compile mode (e.g. max-autotune-no-cudagraphs)")
    ap.add_argument("--trace", default=None, help="also write the profiled steps' timeline (Chrome trace JSON) here")
    args = ap.parse_args()
    cfg = BenchConfig(backend=args.backend, heads_precision="bf16" if args.bf16_heads else "fp32")
    model = build_bench_model(cfg, torch.device("cuda"))
    if args.compile:
        compile_model(model, heads=args.compile_heads, mode=args.compile_mode)
    frames = torch.rand(args.frames, 3, cfg.height, cfg.width, device="cuda")
    session = model.session(num_scale_frames=8, precision="bf16", fast=("whole" if args.whole else "pieces" if args.pieces else True) if args.fast else False)
    t0 = time.time()
    for i in range(args.frames - 5):
        session.step(frames[i])
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    for i in range(args.frames - 5, args.frames - 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        session.step(frames[i])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.frames - 2, args.frames):
            session.step(frames[i])
            # As the protocol (a sync after each frame): otherwise the next step's first
            # graph may start beside this step's heads when the host runs ahead, and the
            # trace no longer shows one frame's latency (session 13, call 2).
            torch.cuda.synchronize()
    if args.trace:
        prof.export_chrome_trace(args.trace)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    rows = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)
    total_gpu_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / 2  # kernels only, per step
    result = {
        "compile": args.compile,
        "fast": args.fast,
        "backend": args.backend,
        "whole": session.whole_step if args.fast else False,
        "compile_heads": args.compile_heads,
        "compile_mode": args.compile_mode,
        "bf16_heads": args.bf16_heads,
        "warmup_s": warm_s,
        "wall_ms_per_step": times,
        "gpu_kernel_ms_per_step": total_gpu_ms,
        "top": [(e.key[:140], e.self_device_time_total / 1e3 / 2, e.count // 2) for e in rows[:80]],
        "by_kind_ms_per_step": _by_kind(rows),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
