"""Host-side profile (cProfile) of steady-state streaming steps: where Python time goes.

Also reports the host time of a step (enqueue only, no synchronize) against its wall time
(synchronized): a host time near the wall time means the GPU waits for Python.

Usage: python scripts/cprofile_step.py [--fast] [--compile] [--backend triton] [--bf16-heads] [--frames 80]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from mapstream.bench import BenchConfig, build_bench_model
from mapstream.models.compile import compile_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--backend", default="sdpa")
    ap.add_argument("--bf16-heads", action="store_true")
    ap.add_argument("--frames", type=int, default=80)
    args = ap.parse_args()
    cfg = BenchConfig(backend=args.backend, heads_precision="bf16" if args.bf16_heads else "fp32")
    model = build_bench_model(cfg, torch.device("cuda"))
    if args.compile:
        compile_model(model)
    frames = torch.rand(args.frames, 3, 378, 504, device="cuda")
    session = model.session(num_scale_frames=8, precision="bf16", fast=args.fast)
    for i in range(args.frames - 10):
        session.step(frames[i])
    torch.cuda.synchronize()
    host, wall = [], []
    for i in range(args.frames - 10, args.frames - 5):
        t0 = time.perf_counter()
        session.step(frames[i])
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
    print("host ms per step:", " ".join(f"{t:.2f}" for t in host), "| wall:", " ".join(f"{t:.2f}" for t in wall))
    prof = cProfile.Profile()
    prof.enable()
    for i in range(args.frames - 5, args.frames):
        session.step(frames[i])
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(22)
        print(out.getvalue()[:5000])


if __name__ == "__main__":
    main()
