"""Pieces against the whole-step graph, interleaved in one process.

The two graph decompositions of a single-frame step (`Session(fast="pieces")` and
`fast="whole"`) on the benchmark's model (compiled), two sessions over the same frames, the
frames of one stepped alternately by each; steady frames 100-200 timed as the protocol does
(CUDA events, synchronize after each frame). Separate benchmark runs put them 0.4 ms apart one
way (session 10) and 0.2 ms the other (session 11), within the spread between machines and
calls; alternating frames cannot drift apart.

Usage (device): python3 scripts/probe_step_modes.py [--heads bf16|fp32] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from _probe import report
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", default="bf16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, heads_precision=args.heads, stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    model.set_backend(cfg.backend)
    frames = _frames(cfg, device)
    modes = {"pieces": "pieces", "whole": "whole"}
    sessions = {name: model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=fast)
                for name, fast in modes.items()}
    times: dict[str, list[float]] = {name: [] for name in modes}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rep in range(2):  # the first pass warms up (captures, compiles)
        for session in sessions.values():
            session.reset()
        for i in range(cfg.scale_frames + cfg.stream_frames):
            order = list(sessions.items()) if i % 2 else list(sessions.items())[::-1]
            for name, session in order:
                torch.cuda.synchronize()
                start.record()
                preds = session.step(frames[i])
                end.record()
                torch.cuda.synchronize()
                if rep == 1 and i >= cfg.steady_from:
                    times[name].append(start.elapsed_time(end))
                assert all(torch.isfinite(p.pose_enc).all() for p in preds)
    for session in sessions.values():
        session.close()
    res = {name: {"mean_ms": statistics.fmean(ts), "median_ms": statistics.median(ts), "frames": len(ts)}
           for name, ts in times.items()}
    res["heads"] = args.heads
    report(res, args.out)


if __name__ == "__main__":
    main()
