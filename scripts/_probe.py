"""Shared pieces of the device probes (`probe_*.py`): a clock each Triton program can read
on its own, a wrapper that runs marks around a function's calls, energy a call from the
GPU's counter, and the JSON report they print and write."""
from __future__ import annotations

import json
import time

import triton
import triton.language as tl


@triton.jit
def globaltimer():
    """The GPU's nanosecond clock (%globaltimer): programs time themselves with it."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


def report(res, out_path: str | None) -> None:
    """Print `res` as JSON and, given a path, write it there too."""
    print(json.dumps(res, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


def nothing() -> None:
    pass


class Around:
    """fn with `before()` and `after()` run around each call; other attributes are fn's (the
    whole step reads `_first_piece.outputs` when it captures again)."""

    def __init__(self, fn, before=nothing, after=nothing) -> None:
        self._fn, self._before, self._after = fn, before, after

    def __call__(self, *args, **kwargs):
        self._before()
        out = self._fn(*args, **kwargs)
        self._after()
        return out

    def __getattr__(self, name):
        return getattr(self._fn, name)


def energy_reader():
    """The GPU's NVML readings (`mapstream.gpu_power`); fails where there are none."""
    import torch

    from mapstream.gpu_power import open_reader

    reader = open_reader(torch.device("cuda"))
    if reader is None:
        raise SystemExit("no NVML readings on this machine (see the log)")
    return reader


def energy(nvml, replay, seconds: float = 2.0) -> dict:
    """J a call, mean W and µs a call of `replay` run back to back for about `seconds`, and
    the SM clock at the end (the J are at whatever clock the load ran at: under a power cap
    a heavy load lowers it)."""
    import torch

    replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    replay()
    torch.cuda.synchronize()
    calls = max(10, int(seconds / max(time.perf_counter() - t, 1e-6)))
    time.sleep(0.5)  # the counter moves every few ms: start from a settled reading
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    for _ in range(calls):
        replay()
    torch.cuda.synchronize()
    e1, t1 = nvml.energy_mj(), time.perf_counter()
    return {"J_per_call": round((e1 - e0) / 1e3 / calls, 5), "mean_W": round((e1 - e0) / 1e3 / (t1 - t0), 1),
            "us_per_call": round((t1 - t0) / calls * 1e6, 1), "sm_mhz_at_end": nvml.sm_mhz(), "calls": calls}
