"""Throughput of several streams on one GPU: N sessions stepped one after another (each on
the CUDA-graph fast path) against `mapstream.step_together` (one batched eager forward for
all N). Full model, rule weights, bf16, 504x378 random frames, window 64.

Usage: python scripts/bench_multistream.py [--streams 4] [--frames 40] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import mapstream
from mapstream.bench import BenchConfig, build_bench_model


def _run(model, frames, together: bool, fast: bool):
    streams, count = frames.shape[:2]
    sessions = [model.session(num_scale_frames=8, precision="bf16", fast=fast) for _ in range(streams)]
    preds = [[] for _ in range(streams)]
    times = []
    for i in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if together:
            out = mapstream.step_together(sessions, list(frames[:, i]))
        else:
            out = [s.step(frames[b, i]) for b, s in enumerate(sessions)]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        for b in range(streams):
            preds[b].extend(out[b])
    for s in sessions:
        s.close()
    steady = sorted(times[12:])  # past the scale phase and warm-up
    step_ms = steady[len(steady) // 2] * 1e3
    return preds, {"median_ms_per_round": step_ms, "stream_frames_per_s": streams * 1e3 / step_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = BenchConfig()
    model = build_bench_model(cfg, torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(0)
    frames = torch.rand(args.streams, args.frames, 3, cfg.height, cfg.width, device="cuda", generator=g)
    result = {"streams": args.streams, "frames": args.frames, "size": [cfg.width, cfg.height]}
    solo, result["one_after_another_fast"] = _run(model, frames, together=False, fast=True)
    print(json.dumps(result), flush=True)
    batched, result["step_together"] = _run(model, frames, together=True, fast=False)
    errs = []
    for a_list, b_list in zip(solo, batched):
        for a, b in zip(a_list, b_list):
            assert torch.isfinite(b.depth).all() and torch.isfinite(b.pose_enc).all()
            errs.append(float((a.depth - b.depth).norm() / a.depth.norm()))
    result["depth_rel_err_max"] = max(errs)
    print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
