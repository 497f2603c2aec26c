"""Where a steady-state streaming step spends its time: wall time a step against the sum of
the device's kernel time (on a GPU the gap is host and launch overhead), kernel time by kind
(attention, matmul, conv, ...) and the kernels with the most time. A Chrome trace of the
profiled steps can be written and summarized per part of the step by trace_summary.py.

Usage: python benchmarks/profile_step.py [--fast [--whole | --pieces]] [--backend sdpa|triton|flashinfer]
           [--compile] [--bf16-heads] [--out FILE] [--trace FILE]
       python benchmarks/profile_step.py --device cpu --preset tiny --size 56x42 --frames 12
           (mechanism check: CPU operators instead of kernels)
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

import mapstream
from mapstream.bench import BenchConfig, build_bench_model, write_result

PROTOCOL = BenchConfig()  # the defaults of the flags it shares with `mapstream bench`

# Kernel-name fragments -> a coarse kind; the first match wins (names differ across libraries).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "prefill", "_fwd")),
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul", "addmm", "linear")),
    ("conv", ("conv", "implicit", "winograd", "dgrad", "wgrad")),
    ("norm", ("norm",)),
    ("copy/cast", ("copy", "cast", "convert")),
    ("upsample", ("upsample", "interpolate")),
)
OTHER = "elementwise/other"
# Steps timed on the host, then profiled, at the end of the stream (the window is full there).
TIMED_STEPS = 3
PROFILED_STEPS = 2


def kind_of(name: str) -> str:
    """The coarse kind of a kernel or operator named `name`."""
    lowered = name.lower()
    return next((kind for kind, fragments in KINDS if any(f in lowered for f in fragments)), OTHER)


def by_kind(rows: list[tuple[str, float]]) -> dict[str, float]:
    """(name, ms) rows summed per kind, largest first."""
    totals: dict[str, float] = {}
    for name, ms in rows:
        totals[kind_of(name)] = totals.get(kind_of(name), 0.0) + ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fast_option(args) -> bool | str:
    if not args.fast:
        return False
    return "whole" if args.whole else "pieces" if args.pieces else True


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PROTOCOL.preset)
    ap.add_argument("--size", default=f"{PROTOCOL.width}x{PROTOCOL.height}", help="WxH")
    ap.add_argument("--scale-frames", type=int, default=PROTOCOL.scale_frames)
    ap.add_argument("--frames", type=int, default=90)
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--fast", action="store_true", help="single-frame steps through CUDA graphs")
    ap.add_argument("--whole", action="store_true", help="with --fast: the whole step as one graph")
    ap.add_argument("--pieces", action="store_true", help="with --fast: the step in pieces around the cache attentions")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-heads", action="store_true", help="with --compile: compile the DPT heads too")
    ap.add_argument("--compile-mode", default=None, help="with --compile: torch.compile's mode")
    ap.add_argument("--bf16-heads", action="store_true", help="heads cast to bf16 too (bench variant bf16-heads)")
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    ap.add_argument("--trace", default=None, help="also write the profiled steps' timeline (Chrome trace JSON) here")
    args = ap.parse_args(argv)
    if args.frames <= args.scale_frames + TIMED_STEPS + PROFILED_STEPS:
        ap.error(f"--frames must exceed --scale-frames + {TIMED_STEPS + PROFILED_STEPS}")
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = BenchConfig(preset=args.preset, width=width, height=height, scale_frames=args.scale_frames,
                      backend=args.backend, device=args.device, precision=precision,
                      heads_precision="bf16" if args.bf16_heads else "fp32")
    from mapstream.models.compile import CompileOptions

    options = CompileOptions(heads=args.compile_heads, mode=args.compile_mode) if args.compile else None
    model = build_bench_model(cfg, device, compile=options)
    frames = torch.rand(args.frames, 3, height, width, device=device)
    session = mapstream.Session(model, num_scale_frames=args.scale_frames, precision=precision,
                                fast=_fast_option(args))
    warm_end = args.frames - TIMED_STEPS - PROFILED_STEPS
    with session, torch.no_grad():
        start = time.time()
        for i in range(warm_end):
            session.step(frames[i])
        _sync(device)
        warmup_s = time.time() - start
        wall_ms = []
        for i in range(warm_end, warm_end + TIMED_STEPS):
            _sync(device)
            start = time.perf_counter()
            session.step(frames[i])
            _sync(device)
            wall_ms.append((time.perf_counter() - start) * 1e3)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for i in range(args.frames - PROFILED_STEPS, args.frames):
                session.step(frames[i])
                # A sync after each frame, as the protocol: otherwise the next step's first
                # graph may start beside this step's heads and the trace no longer shows one
                # frame's latency.
                _sync(device)
        whole = session.whole_step if args.fast else False
    if args.trace:
        prof.export_chrome_trace(args.trace)
    on = torch.autograd.DeviceType.CUDA if device.type == "cuda" else torch.autograd.DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == on]
    # ms a step: the device's kernels on a GPU, the operators' own time on a CPU.
    rows = [(e.key, (e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total)
             / 1e3 / PROFILED_STEPS, e.count // PROFILED_STEPS) for e in events]
    rows.sort(key=lambda row: -row[1])
    result = {
        "device": str(device), "backend": args.backend, "fast": args.fast, "whole": whole,
        "compile": args.compile, "compile_heads": args.compile_heads, "compile_mode": args.compile_mode,
        "bf16_heads": args.bf16_heads,
        "warmup_s": warmup_s,
        "wall_ms_per_step": wall_ms,
        "kernel_ms_per_step": sum(ms for _, ms, _ in rows),
        "by_kind_ms_per_step": by_kind([(name, ms) for name, ms, _ in rows]),
        "top": [(name[:140], ms, calls) for name, ms, calls in rows[:80]],
    }
    print(json.dumps(result, indent=1), flush=True)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()
