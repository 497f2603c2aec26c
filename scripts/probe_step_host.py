"""How long the GPU waits for the host at the start of a streaming step (no profiler).

The protocol synchronizes after every frame, so each step starts with an idle GPU: nothing
runs until the host has checked the frame, copied it into the first graph's input and
launched that graph (≈ 260 kernel nodes). Measured here with the host's clock around the
benchmark's own session (compiled, bf16 heads), per step from frame 100 on:

- `before_launch`: from `session.step` to the first graph's launch call, of it `check` (the
  frame's shape and value check, one device read), `check_to_load` (planning, the model's
  dispatch) and `load` (the copies into the first graph's inputs);
- `launch`: the first graph's launch call itself (`CUDAGraph.replay`);
- `step_host`: the whole `session.step` call, against `step_gpu`, the CUDA-event time the
  benchmark reports for it.

Usage (device): python3 scripts/probe_step_host.py [--frames 160] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model


def _marked(fn, marks: dict, key: str):
    """fn, recording marks[key + "_start" / "_end"] around each call."""

    def wrapped(*args, **kwargs):
        marks[key + "_start"] = time.perf_counter()
        out = fn(*args, **kwargs)
        marks[key + "_end"] = time.perf_counter()
        return out

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=160)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, heads_precision="bf16", stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    model.set_backend(cfg.backend)
    frames = _frames(cfg, device)
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast)
    marks: dict[str, float] = {}
    rows: list[dict[str, float]] = []
    for i in range(cfg.scale_frames + args.frames):
        if i == cfg.scale_frames + 1:  # the graphs exist now: time the first piece's launches
            (graphed,) = session._graphed.values()
            graphed.pieces[0] = _marked(graphed.pieces[0], marks, "launch")
            session._check_frame = _marked(session._check_frame, marks, "check")
            graphed._load_frame = _marked(graphed._load_frame, marks, "load")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        session.step(frames[i])
        end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= 100 and "launch_start" in marks:
            rows.append({
                "check": (marks["check_end"] - t0) * 1e6,
                "check_to_load": (marks["load_start"] - marks["check_end"]) * 1e6,
                "load": (marks["load_end"] - marks["load_start"]) * 1e6,
                "before_launch": (marks["launch_start"] - t0) * 1e6,
                "launch": (marks["launch_end"] - marks["launch_start"]) * 1e6,
                "step_host": (t1 - t0) * 1e6,
                "step_gpu": start.elapsed_time(end) * 1e3,
            })
    summary = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    for key, value in summary.items():
        print(f"{key:14s} median {value:9.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"median_us": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
