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
