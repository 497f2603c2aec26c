"""The parts of one stream's GPU memory, measured and as `mapstream.gpu_memory` estimates them.

For each setting (frame size, heads' dtype, cache storage, sliding window, dense heads'
frames at a time) a fresh session streams the scale phase and `--frames` more frames with
the fast path; measured: the weights, the bytes the caches lease, the scale phase's and the
steady steps' working memory (peak allocated above what is held), and the stream's whole peak
above its weights. The estimate's parts stand beside them; the run fails where the estimate of
the stream falls short of its measurement, the test of `gpu_memory.WORKING`'s figures.

Usage (CUDA): python benchmarks/memory_parts.py [--preset lingbot-map] [--frames 80] [--out FILE]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys

import torch

from mapstream.bench import BenchConfig, build_bench_model, write_result
from mapstream.cache import shared_pools
from mapstream.gpu_memory import GIB, estimate_memory

# (width, height, kv_dtype, sliding window, dense chunk)
SETTINGS = [
    (518, 378, "fp8", 64, 8), (518, 378, "fp8", 64, 2), (518, 378, "fp8", 64, 1), (518, 378, "auto", 64, 1),
    (518, 378, "fp8", 32, 1), (518, 378, "fp8", 16, 1), (294, 224, "fp8", 64, 8), (294, 224, "auto", 64, 1),
]


def _settle() -> int:
    gc.collect()
    shared_pools().trim()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


@torch.no_grad()
def measure(model, heads: str, width: int, height: int, kv: str, window: int, chunk: int, frames: int,
            scale: int) -> dict:
    model.dense_chunk_frames = chunk
    g = torch.Generator(device="cuda").manual_seed(0)
    pool = torch.rand(24, 3, height, width, device="cuda", generator=g)
    base = _settle()
    torch.cuda.reset_peak_memory_stats()
    session = model.session(num_scale_frames=scale, precision="bf16", fast=True, kv_dtype=kv, sliding_window=window)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(scale):
        session.step(pool[i])
    end.record()
    torch.cuda.synchronize()
    scale_peak, after_scale = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    for i in range(4):  # the first steps capture the graphs
        session.step(pool[(scale + i) % 24])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for i in range(frames):
        session.step(pool[i % 24])
    torch.cuda.synchronize()
    steady_peak, held = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    stats = session.stats()
    caches = stats["aggregator"].bytes_held + (stats["camera"].bytes_held if stats.get("camera") else 0)
    stream = session.config
    session.close()
    del session, pool
    _settle()
    est = estimate_memory(model, (height, width), stream, precision="bf16", low_precision_heads=heads == "bf16",
                          dense_chunk_frames=chunk)
    frames_bytes = 24 * 3 * height * width * 4
    measured_peak = max(scale_peak, steady_peak) - base  # the stream's own, the model's weights not included
    return {
        "heads": heads, "size": f"{width}x{height}", "kv_dtype": kv, "window": window, "chunk": chunk,
        "caches_gib": caches / GIB, "caches_est_gib": est.caches / GIB,
        "scale_work_gib": (scale_peak - after_scale) / GIB, "steady_work_gib": (steady_peak - held) / GIB,
        "working_est_gib": est.working / GIB,
        "stream_peak_gib": (measured_peak - frames_bytes) / GIB, "stream_est_gib": (est.caches + est.working) / GIB,
        "graphs_gib": (held - base - caches - frames_bytes) / GIB,
        "scale_phase_ms": start.elapsed_time(end),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="lingbot-map")
    ap.add_argument("--frames", type=int, default=80, help="streaming frames after the graphs are captured")
    ap.add_argument("--scale-frames", type=int, default=BenchConfig().scale_frames)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows, short = [], []
    for heads in ("fp32", "bf16"):
        _settle()
        model = build_bench_model(BenchConfig(preset=args.preset, backend="triton", heads_precision=heads),
                                  torch.device("cuda"))
        weights = _settle()
        est = estimate_memory(model, (378, 518), model.stream_config, precision="bf16",
                              low_precision_heads=heads == "bf16")
        print(json.dumps({"heads": heads, "weights_gib": weights / GIB, "weights_est_gib": est.weights / GIB}))
        for width, height, kv, window, chunk in SETTINGS:
            row = measure(model, heads, width, height, kv, window, chunk, args.frames, args.scale_frames)
            row["weights_gib"], row["weights_est_gib"] = weights / GIB, est.weights / GIB
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
            rows.append(row)
            # The weights as held count what else a model keeps on the device (its hints' counters, a few
            # MiB); a model built after another in the same process may find memory the first one left.
            if row["stream_est_gib"] < row["stream_peak_gib"]:
                short.append(row)
        del model
    if args.out:
        write_result({"device": torch.cuda.get_device_name(), "rows": rows}, args.out)
    if short:
        print(f"{len(short)} estimate(s) below the measured memory", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
