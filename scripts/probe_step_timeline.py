"""Where a protocol-timed whole step spends its time, without the profiler.

The profiler's own host overhead inflates every launch, so its traces cannot say whether the
host is late anywhere inside a step. Here the benchmark's session (compiled, whole-step
graphs, fp32 heads unless --bf16-heads) steps frames 100 on as the protocol does, with CUDA
events and the host clock at five points of each step:

  0 start (the protocol's start event)   1 after graph 0's launch   2 before the second
  graph's replay   3 after its replay   4 the step returned (the protocol's end event)

Reported per part (medians and means over the frames, µs): the GPU time between consecutive
events (1-0 is the host's start plus graph 0 when the GPU is idle at 0; 2-1 the GPU's wait for
the host's cache planning and `DeviceStep.prepare`'s kernels; 3-2 the second graph; 4-3 the
outputs' copies and the predictions' geometry) and the host clock between the same points.
Every other frame is started behind a 3 ms GPU sleep (`hidden`): its 1-0 is graph 0 alone and
its total the step's GPU time without the host's start. With --sync-check, a few more frames
run under `torch.cuda.set_sync_debug_mode("warn")` and any synchronizing call is reported.

Usage (device): python3 scripts/probe_step_timeline.py [--frames 192] [--bf16-heads] [--sync-check] [--out F]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from _probe import Around, report
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model

POINTS = 5


def _mark(marks: dict, point: int):
    """A function that takes point `point`'s event (recorded now) and host time into `marks`."""

    def take() -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks[point] = (event, time.perf_counter())

    return take


def _summary(rows: list[list[float]]) -> dict[str, dict[str, float]]:
    parts = [f"{a}-{a + 1}" for a in range(POINTS - 1)] + ["total"]
    return {
        part: {"median": statistics.median(r[i] for r in rows), "mean": statistics.fmean(r[i] for r in rows)}
        for i, part in enumerate(parts)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=192)
    parser.add_argument("--bf16-heads", action="store_true")
    parser.add_argument("--sync-check", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, heads_precision="bf16" if args.bf16_heads else "fp32",
                      stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    frames = _frames(cfg, device)
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast)
    marks: dict[int, tuple[torch.cuda.Event, float]] = {}
    gpu: dict[str, list[list[float]]] = {"exposed": [], "hidden": []}
    host: list[list[float]] = []
    n = cfg.scale_frames + args.frames
    for i in range(n):
        if i == cfg.scale_frames + 1:  # the graphs exist now
            (graphed,) = session._graphed.values()
            if not graphed.whole:
                raise SystemExit("this probe reads the whole-step mode; the session chose pieces")
            graphed._first_piece = Around(graphed._first_piece, after=_mark(marks, 1))
            for_key = graphed._whole.for_key
            graphed._whole.for_key = lambda key: Around(for_key(key), _mark(marks, 2), _mark(marks, 3))
        hidden = i % 2 == 1
        torch.cuda.synchronize()
        if hidden:
            torch.cuda._sleep(3_000_000)
        marks.clear()
        start = torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter()
        start.record()
        marks[0] = (start, h0)
        session.step(frames[i])
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        marks[4] = (end, time.perf_counter())
        torch.cuda.synchronize()
        if i < 100:
            continue
        events = [marks[p][0] for p in range(POINTS)]
        spans = [events[p].elapsed_time(events[p + 1]) * 1e3 for p in range(POINTS - 1)]
        gpu["hidden" if hidden else "exposed"].append(spans + [sum(spans)])
        if not hidden:
            clock = [marks[p][1] for p in range(POINTS)]
            steps = [(clock[p + 1] - clock[p]) * 1e6 for p in range(POINTS - 1)]
            host.append(steps + [sum(steps)])
    res = {
        "heads": cfg.heads_precision,
        "frames_timed": {k: len(v) for k, v in gpu.items()},
        "gpu_us_exposed": _summary(gpu["exposed"]),
        "gpu_us_hidden": _summary(gpu["hidden"]),
        "host_us_exposed": _summary(host),
    }
    if args.sync_check:
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(n, n + 4):
                session.step(frames[i % n])
        torch.cuda.set_sync_debug_mode(0)
        res["synchronizing_calls"] = sorted({f"{w.filename}:{w.lineno}: {str(w.message)[:200]}" for w in caught})
    report(res, args.out)


if __name__ == "__main__":
    main()
