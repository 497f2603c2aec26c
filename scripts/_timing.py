"""Shared helpers of the device scripts: CUDA-event timing and incremental result printing."""
from __future__ import annotations

import torch


class Results(dict):
    """Prints every entry as it arrives, so a crashing kernel still leaves the earlier ones."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        print(f"{key}: {value}", flush=True)


def timeit(fn, reps: int = 50, warmup: int = 5) -> float:
    """Median microseconds of `fn` over `reps` calls, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2] * 1000.0


def captured(fn, calls: int = 1) -> torch.cuda.CUDAGraph:
    """`fn` run once (compilation, warm-up), then captured `calls` times in one CUDA graph.
    Replaying a graph costs ≈ 9–15 µs on an H200 however short its kernels, so timing one
    kernel of a few µs needs many calls a graph (and `interleaved(..., calls=)` to divide)."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def interleaved(
    variants: dict, rounds: int = 5, label: str = "", flops: float | None = None, calls: int = 1
) -> dict[str, list[float]]:
    """Time every variant (a callable) once per round, round-robin, so drift between rounds
    hits all of them alike; prints a row per variant with its median. Returns µs per round
    and call (each callable making `calls` calls, e.g. a graph from `captured(fn, calls)`)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(timeit(fn) / calls)
    for name, ts in times.items():
        med = sorted(ts)[len(ts) // 2]
        rate = f"  {flops / med / 1e6:6.1f} TFLOP/s" if flops else ""
        print(f"{label}{name:14s} " + " ".join(f"{t:7.1f}" for t in ts) + f"   median {med:7.1f} us{rate}", flush=True)
    return times


def side_by_side(works) -> torch.cuda.CUDAGraph:
    """One CUDA graph running each (stream, fn) of `works` forked from the capture stream and
    joined back, so that the functions run side by side (a stream of None: a new side stream);
    each function is run once before the capture, and the graph once after it."""
    with torch.no_grad():
        for _, fn in works:
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            current = torch.cuda.current_stream()
            streams = [s if s is not None else torch.cuda.Stream() for s, _ in works]
            for stream, (_, fn) in zip(streams, works):
                stream.wait_stream(current)
                with torch.cuda.stream(stream):
                    fn()
            for stream in streams:
                current.wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    return graph
