"""Does the GPU's clock move under the protocol's load, and does the step's time follow it?

The protocol's steady frames (100-199) do the same work each (a full window: the same keys
but 6 trajectory tokens more a frame), yet their times wander between ≈ 20.8 and 23 ms in
slow waves of 10-30 frames (docs/BENCHMARKS.md, session 22). A power or thermal limit that
lowers the SM clock while the GPU is busy would do that. This probe steps the benchmark's
session (compiled, whole-step graphs, protocol's fp32 heads) through passes of scale frames +
N streaming frames, timing each step with CUDA events as the protocol does and noting the
wall clock of each, in three passes: back to back (the protocol), `--rest-ms` of host sleep
after each step (the GPU idle in between), back to back again; with the GPU's energy over
each back-to-back pass's streaming steps (NVML's counter: J a step). Run it beside
`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,... -lms 50` and match the two by
wall clock.

Usage (device): python3 scripts/probe_clocks.py [--stream-frames 192] [--rest-ms 20] [--out F]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from _probe import energy_reader, report
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream-frames", type=int, default=192)
    parser.add_argument("--rest-ms", type=float, default=20.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, stream_frames=args.stream_frames, stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    frames = _frames(cfg, device)
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast)

    nvml = energy_reader()

    def one_pass(rest_s: float) -> tuple[list[tuple[float, float]], float]:
        """(wall clock at the step's end, its ms) of each streaming step, and the GPU's J over
        the streaming steps (rests included)."""
        session.reset()
        for i in range(cfg.scale_frames):
            session.step(frames[i])
        torch.cuda.synchronize()
        mj = nvml.energy_mj()
        rows = []
        for i in range(cfg.scale_frames, cfg.scale_frames + args.stream_frames):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            session.step(frames[i])
            end.record()
            torch.cuda.synchronize()
            rows.append((time.time(), start.elapsed_time(end)))
            if rest_s:
                time.sleep(rest_s)
        return rows, (nvml.energy_mj() - mj) / 1e3

    one_pass(0.0)  # compilation, graphs
    res = {"rest_ms": args.rest_ms}
    for label, rest in (("back_to_back", 0.0), ("rested", args.rest_ms / 1e3), ("back_to_back_again", 0.0)):
        rows, joules = one_pass(rest)
        steady = [ms for _, ms in rows[100 - cfg.scale_frames:]] or [ms for _, ms in rows]
        res[label] = {
            "steady_mean_ms": statistics.fmean(steady), "steady_min_ms": min(steady),
            "steady_max_ms": max(steady), "J_per_step_incl_rests": round(joules / len(rows), 4),
            "mean_W": round(joules / (rows[-1][0] - rows[0][0] + rows[0][1] / 1e3), 1),
            "steps": [(round(t, 3), round(ms, 3)) for t, ms in rows],
        }
        print(label, {k: v for k, v in res[label].items() if k != "steps"}, flush=True)
    report(res, args.out)


if __name__ == "__main__":
    main()
