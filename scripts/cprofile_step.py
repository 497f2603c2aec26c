"""Host-side profile (cProfile) of steady-state streaming steps: where Python time goes.
Usage: python scripts/cprofile_step.py [--fast] [--frames 80]"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from mapstream.bench import BenchConfig, build_bench_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--frames", type=int, default=80)
    args = ap.parse_args()
    model = build_bench_model(BenchConfig(), torch.device("cuda"))
    frames = torch.rand(args.frames, 3, 378, 504, device="cuda")
    session = model.session(num_scale_frames=8, precision="bf16", fast=args.fast)
    for i in range(args.frames - 5):
        session.step(frames[i])
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(args.frames - 5, args.frames):
        session.step(frames[i])
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue()[:6000])


if __name__ == "__main__":
    main()
