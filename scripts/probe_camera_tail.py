"""The step's tail (the heads after the trunk): two levers on the camera head's chain.

1. **Rows kernel shares** (`rows_attention(..., splits=)`): the camera head's cache
   attention at the benchmark's shape (16 heads of 128, one query, the camera cache's
   storage of 1,096 keys), visible ranges as at frames 100-200 and after a long stream;
   one program per head walking the keys against the default shares (+ merge kernel).
   CUDA graphs of 20 calls, interleaved rounds, µs a call.
2. **The camera head's stream priority**: the benchmark's session (compiled; bf16 and fp32
   heads), steady frames 100-200 timed as the protocol does (CUDA events, synchronize after
   each frame), alternating blocks of frames between a camera stream of high priority and
   one of the default priority (the dense heads' stream has the default), so drift between
   machines cannot decide it. Measured no difference (docs/BENCHMARKS.md, session 9).

Usage (device): python3 scripts/probe_camera_tail.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from _probe import report
from _timing import captured, interleaved
from mapstream.attention.triton_rows import rows_attention
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.models.compile import compile_model


def rows_shares() -> dict:
    storage = torch.randn(2, 16, 1096, 128, device="cuda", dtype=torch.bfloat16)
    k, v = storage[0], storage[1]
    q = torch.randn(16, 1, 128, device="cuda", dtype=torch.bfloat16)
    res = {}
    for lo, hi in [(0, 150), (0, 200), (0, 1096)]:
        rng = torch.tensor([lo, hi], device="cuda", dtype=torch.int32)
        variants = {
            f"{name}": (lambda g: g.replay)(captured(lambda s=s: rows_attention(q, k, v, kv_range=rng, splits=s), 20))
            for name, s in (("one program", 1), ("default shares", None))
        }
        times = interleaved(variants, label=f"keys {hi - lo:5d}  ", calls=20)
        res[f"keys_{hi - lo}"] = {name: statistics.median(ts) for name, ts in times.items()}
    return res


def priority(heads_precision: str, frames_per_block: int = 10) -> dict:
    cfg = BenchConfig(backend="triton", fast="pieces", heads_precision=heads_precision, stage_breakdown=False)
    device = torch.device("cuda")
    model = compile_model(build_bench_model(cfg, device))
    model.set_backend(cfg.backend)
    frames = _frames(cfg, device)
    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=cfg.fast)
    times: dict[str, list[float]] = {"high": [], "default": []}
    streams = {"high": torch.cuda.Stream(device, priority=-1), "default": torch.cuda.Stream(device, priority=0)}
    for rep in range(2):  # the first pass warms up (captures, compiles)
        session.reset()
        for i in range(cfg.scale_frames + cfg.stream_frames):
            arm = list(times)[(i // frames_per_block) % 2]
            if rep == 0 and i == cfg.scale_frames + 1:  # the graphed step exists from here on
                (graphed,) = session._graphed.values()
            if i > cfg.scale_frames:
                graphed.side_stream = streams[arm]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            session.step(frames[i])
            end.record()
            torch.cuda.synchronize()
            if rep == 1 and i >= cfg.steady_from:
                times[arm].append(start.elapsed_time(end))
    session.close()
    out = {
        "priorities": {arm: stream.priority for arm, stream in streams.items()},
        **{arm: {"mean_ms": statistics.fmean(ts), "median_ms": statistics.median(ts), "frames": len(ts)}
           for arm, ts in times.items()},
    }
    print(heads_precision, out, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    res = {"rows_shares": rows_shares()}
    for heads in ("bf16", "fp32"):
        res[f"priority_{heads}_heads"] = priority(heads)
    report(res, args.out)


if __name__ == "__main__":
    main()
