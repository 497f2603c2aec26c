"""Throughput of several streams on one GPU: N sessions stepped one after another (each on
the CUDA-graph fast path) against `mapstream.step_together` (one batched eager forward for
all N). Full model, rule weights, bf16, 504x378 random frames, window 64.

Usage: python scripts/bench_multistream.py [--streams 4] [--frames 40] [--out FILE]
       python scripts/bench_multistream.py --device cpu --preset tiny --size 168x112 (mechanism check)
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import mapstream
from mapstream.bench import BenchConfig, build_bench_model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _run(model, frames, together: bool, fast: bool, scale: int):
    streams, count = frames.shape[:2]
    precision = "bf16" if frames.is_cuda else "fp32"
    sessions = [model.session(num_scale_frames=scale, precision=precision, fast=fast) for _ in range(streams)]
    preds = [[] for _ in range(streams)]
    times = []
    for i in range(count):
        _sync(frames.device)
        start = time.perf_counter()
        if together:
            out = mapstream.step_together(sessions, list(frames[:, i]))
        else:
            out = [s.step(frames[b, i]) for b, s in enumerate(sessions)]
        _sync(frames.device)
        times.append(time.perf_counter() - start)
        for b in range(streams):
            preds[b].extend(out[b])
    for s in sessions:
        s.close()
    steady = sorted(times[scale + 4 :])  # past the scale phase and warm-up
    step_ms = steady[len(steady) // 2] * 1e3
    return preds, {"median_ms_per_round": step_ms, "stream_frames_per_s": streams * 1e3 / step_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--size", default="504x378", help="WxH")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    cfg = BenchConfig(preset=args.preset, width=width, height=height, device=args.device,
                      precision="bf16" if device.type == "cuda" else "fp32")
    model = build_bench_model(cfg, device)
    scale = cfg.scale_frames
    g = torch.Generator(device=device).manual_seed(0)
    frames = torch.rand(args.streams, args.frames, 3, height, width, device=device, generator=g)
    result = {"streams": args.streams, "frames": args.frames, "size": [width, height], "preset": args.preset,
              "device": str(device)}
    fast = device.type == "cuda"
    solo, result["one_after_another"] = _run(model, frames, together=False, fast=fast, scale=scale)
    result["one_after_another"]["fast_path"] = fast
    print(json.dumps(result), flush=True)
    batched, result["step_together"] = _run(model, frames, together=True, fast=False, scale=scale)
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
