"""How long the GPU waits for the host at the start of a streaming step (no profiler).

The protocol synchronizes after every frame, so each step starts with an idle GPU: nothing
runs until the host has checked the frame's shape, copied it into the first graph's input and
launched that graph. Measured with the host's clock and CUDA events around the benchmark's
own session (compiled, bf16 heads), from frame 100 on, in four interleaved arms:

- order `now`: `Session.step` as it is (the value check starts after the first graph's launch,
  beside it on the step's second stream, `GraphedStep.start`);
- order `before`: the start of session 14, rebuilt here from the session's parts: the full
  shape check of every frame, autocast entered around the first graph's replay, and the time
  index filled at every start (now: a frame like the last accepted one skips the checks, the
  replay runs without autocast, and each step sets the next frame's time index at its end);
- each order `exposed` (timed as the protocol does) and `hidden` (the GPU kept busy ~1.5 ms by
  `torch.cuda._sleep` before the start event, so that the host's start is not timed).

Reported (medians, µs): `step_gpu` per arm, `host_exposed` = exposed - hidden per order, and for
the `now` arm the host's clock from the step's call to the first graph's launch
(`before_launch`, of it `record`: the start event's record call, `check`: the step's entry and
shape check, `check_to_load`, `load`: the frame's copies)
and the launch call itself (`launch`). In whole-step mode (`Session.whole_step`, the choice
of `fast=True` here) also `graph0_to_second_graph`: from the end of the first graph to the
point where the host queued the second (CUDA events), i.e. the GPU's wait for the host's
cache planning plus the few small kernels of `DeviceStep.prepare`.

Usage (device): python3 scripts/probe_step_host.py [--frames 192] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from _probe import Around
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model
from mapstream.session import _autocast


def _evented(fn, event: torch.cuda.Event, *, after: bool) -> Around:
    """fn, recording `event` on the current stream just before (or after) each call."""
    return Around(fn, after=event.record) if after else Around(fn, before=event.record)


def _marked(fn, marks: dict, key: str) -> Around:
    """fn, recording marks[key + "_start" / "_end"] around each call."""

    def mark(which: str):
        return lambda: marks.__setitem__(f"{key}_{which}", time.perf_counter())

    return Around(fn, mark("start"), mark("end"))


@torch.no_grad()
def _step_session14(session, frame):
    """A session step as of session 14 (see the module docstring)."""
    session._accepted = None
    frames = session._check_frame(frame, values=False)
    graphs = session._graphed_step(frames)
    frames = frames.to(session.device, non_blocking=True)
    graphs._time_value = -1
    with _autocast(session.device, session.precision):
        started = graphs.start(frames, session.state)
    started.values.wait()
    return session._step_checked(frames, None, None, started=started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=192)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, heads_precision="bf16", stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    model.set_backend(cfg.backend)
    frames = _frames(cfg, device)
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast)
    marks: dict[str, float] = {}
    gpu_ms: dict[str, list[float]] = {f"{o}_{t}": [] for o in ("now", "before") for t in ("exposed", "hidden")}
    host: list[dict[str, float]] = []
    between: list[float] = []
    for i in range(cfg.scale_frames + args.frames):
        if i == cfg.scale_frames + 1:  # the graphs exist now: time the first piece's launches
            (graphed,) = session._graphed.values()
            graphed._first_piece = _marked(graphed._first_piece, marks, "launch")
            session._check_frame = _marked(session._check_frame, marks, "check")
            graphed._load_frame = _marked(graphed._load_frame, marks, "load")
            if graphed.whole:  # events after graph 0's launch and before the second graph's
                first_done, second_start = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                graphed._first_piece = _evented(graphed._first_piece, first_done, after=True)
                for_key = graphed._whole.for_key
                graphed._whole.for_key = lambda key: _evented(for_key(key), second_start, after=False)
        order = "before" if (i // 2) % 2 else "now"
        hidden = i % 2 == 1
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if hidden and i >= 100:
            torch.cuda._sleep(3_000_000)
        t0 = time.perf_counter()
        start.record()
        t_recorded = time.perf_counter()
        if order == "before" and i >= 100:
            _step_session14(session, frames[i])
        else:
            session.step(frames[i])
        end.record()
        torch.cuda.synchronize()
        if i < 100:
            continue
        gpu_ms[f"{order}_{'hidden' if hidden else 'exposed'}"].append(start.elapsed_time(end) * 1e3)
        if order == "now" and not hidden:
            if graphed.whole:
                between.append(first_done.elapsed_time(second_start) * 1e3)
            host.append({
                "record": (t_recorded - t0) * 1e6,
                "check": (marks["check_end"] - t_recorded) * 1e6,
                "check_to_load": (marks["load_start"] - marks["check_end"]) * 1e6,
                "load": (marks["load_end"] - marks["load_start"]) * 1e6,
                "before_launch": (marks["launch_start"] - t0) * 1e6,
                "launch": (marks["launch_end"] - marks["launch_start"]) * 1e6,
            })
    summary = {f"step_gpu_{arm}": statistics.median(v) for arm, v in gpu_ms.items()}
    for o in ("now", "before"):
        summary[f"host_exposed_{o}"] = summary[f"step_gpu_{o}_exposed"] - summary[f"step_gpu_{o}_hidden"]
    summary.update({key: statistics.median(r[key] for r in host) for key in host[0]})
    if between:
        summary["graph0_to_second_graph"] = statistics.median(between)
    for key, value in summary.items():
        print(f"{key:22s} median {value:9.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"median_us": summary, "step_gpu_us": gpu_ms, "host_us": host}, f, indent=1)


if __name__ == "__main__":
    main()
