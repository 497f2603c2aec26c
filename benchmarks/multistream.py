"""Throughput of several streams on one device: N sessions stepped one after another (on
the CUDA-graph fast path where there is a GPU) against `mapstream.step_together` (one
batched eager forward for all N), and how far the two give apart. With --graphed, also
`step_together` over sessions with the fast path on (the batched pieces step: CUDA graphs N
frames wide between each stream's eager cache attention; on a CPU the same decomposition
eagerly), as "step_together_graphed". Each pass also gives, where NVML reads the GPU, its energy
a stream-frame, power and clock over the steady rounds ("gpu_power", as `mapstream bench`).

Full model with synthetic (rule) weights, random frames, bf16 on a GPU, fp32 elsewhere; the
cache attention through --backend (auto: the fastest usable, our Triton kernel on a GPU).

Usage: python benchmarks/multistream.py [--streams 4] [--frames 40] [--steady-from N] [--graphed] [--skip-eager]
                                       [--compile] [--backend NAME] [--kv-dtype fp8] [--out FILE]
       python benchmarks/multistream.py --streams 8 --frames 200 --steady-from 100 --graphed  (a full window of 64)
       python benchmarks/multistream.py --device cpu --preset tiny --size 56x42 (mechanism check)
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import mapstream
from mapstream.bench import BenchConfig, build_bench_model, write_result
from mapstream.config import KV_DTYPES, StreamConfig
from mapstream.gpu_power import PowerLog, open_reader

PROTOCOL = BenchConfig()  # the defaults of the flags it shares with `mapstream bench`
STREAM = StreamConfig()  # and with a session

# Steps after the scale phase left out of the median: the first ones build graphs and caches.
WARMUP_STEPS = 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stream(model, frames: torch.Tensor, *, together: bool, fast: bool, scale: int, precision: str, kv_dtype: str,
            steady_from: int):
    """Every stream's poses and depths (on the host, copied after each round's timing), the
    median time of one round (one frame of each stream) from frame `steady_from` on, and over
    those rounds the GPU's energy a stream-frame, power and clock (None without NVML)."""
    streams, count = frames.shape[:2]
    reader = open_reader(frames.device)
    power = PowerLog(reader) if reader is not None else None
    sessions = [mapstream.Session(model, num_scale_frames=scale, precision=precision, fast=fast, kv_dtype=kv_dtype)
                for _ in range(streams)]
    preds: list[list] = [[] for _ in range(streams)]
    times = []
    with torch.no_grad():
        for i in range(count):
            _sync(frames.device)
            start = time.perf_counter()
            if together:
                out = mapstream.step_together(sessions, list(frames[:, i]))
            else:
                out = [s.step(frames[b, i]) for b, s in enumerate(sessions)]
            _sync(frames.device)
            times.append(time.perf_counter() - start)
            if power is not None and i == steady_from - 1:
                power.start()
            elif power is not None and i >= steady_from:
                power.after_frame()
            for b in range(streams):
                preds[b].extend((p.pose_enc.cpu(), p.depth.cpu()) for p in out[b])
    for s in sessions:
        s.close()
    steady = sorted(times[steady_from:])
    round_ms = steady[len(steady) // 2] * 1e3
    timing = {"median_ms_per_round": round_ms, "stream_frames_per_s": streams * 1e3 / round_ms}
    summary = power.summary() if power is not None else None
    if summary is not None:  # its "frames" are rounds of one frame a stream
        summary["J_per_stream_frame"] = summary["J_per_frame"] / streams
    timing["gpu_power"] = summary
    return preds, timing


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / a.float().norm())


def _agreement(solo: list[list], other: list[list]) -> dict:
    """Whether every prediction of `other` is finite, and its largest relative error from the
    same frame's solo prediction."""
    pairs = [(a, b) for a_list, b_list in zip(solo, other) for a, b in zip(a_list, b_list)]
    return {
        "all_finite": all(bool(torch.isfinite(b[0]).all() and torch.isfinite(b[1]).all()) for _, b in pairs),
        "depth_rel_err_max": max(_relative_error(a[1], b[1]) for a, b in pairs),
        "pose_enc_rel_err_max": max(_relative_error(a[0], b[0]) for a, b in pairs),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--frames", type=int, default=40, help="frames per stream")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PROTOCOL.preset)
    ap.add_argument("--size", default=f"{PROTOCOL.width}x{PROTOCOL.height}", help="WxH")
    ap.add_argument("--scale-frames", type=int, default=PROTOCOL.scale_frames, help="frames of each stream's scale phase")
    ap.add_argument("--steady-from", type=int, default=None,
                    help="first frame whose round counts in the median (default: after the scale phase and "
                         f"{WARMUP_STEPS} warm-up steps; the window is full from the scale frames plus the window on)")
    ap.add_argument("--graphed", action="store_true",
                    help="also time step_together over fast-path sessions (the batched graphed step)")
    ap.add_argument("--backend", default=STREAM.backend,
                    help="the cache attention's backend (auto: the fastest usable, our Triton kernel on a CUDA GPU)")
    ap.add_argument("--compile", action="store_true",
                    help="build the model with its per-frame parts compiled (what `mapstream run --compile` runs)")
    ap.add_argument("--skip-eager", action="store_true",
                    help="leave out step_together's eager batched forward (with --graphed: time the graphed step only)")
    ap.add_argument("--kv-dtype", default=STREAM.kv_dtype, choices=KV_DTYPES,
                    help="how every stream's cache stores keys and values (fp8: e4m3 with a scale per token and head)")
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = ap.parse_args(argv)
    steady_from = args.scale_frames + WARMUP_STEPS if args.steady_from is None else args.steady_from
    if steady_from < args.scale_frames + WARMUP_STEPS or args.frames <= steady_from:
        ap.error(f"--steady-from must be at least --scale-frames + {WARMUP_STEPS} (the first steps build graphs "
                 f"and caches) and below --frames (got {steady_from} of {args.frames} frames)")
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = BenchConfig(preset=args.preset, width=width, height=height, scale_frames=args.scale_frames,
                      device=args.device, precision=precision, backend=args.backend)
    if args.skip_eager and not args.graphed:
        ap.error("--skip-eager leaves only the streams one after another: give --graphed too")
    model = build_bench_model(cfg, device, compile=args.compile)
    g = torch.Generator(device=device).manual_seed(0)
    frames = torch.rand(args.streams, args.frames, 3, height, width, device=device, generator=g)
    result: dict = {"streams": args.streams, "frames": args.frames, "size": [width, height],
                    "preset": args.preset, "device": str(device), "kv_dtype": args.kv_dtype, "steady_from": steady_from,
                    "compiled": args.compile, "backend": args.backend,
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    fast = device.type == "cuda"
    run = dict(scale=cfg.scale_frames, precision=precision, kv_dtype=args.kv_dtype, steady_from=steady_from)
    solo, result["one_after_another"] = _stream(model, frames, together=False, fast=fast, **run)
    result["one_after_another"]["fast_path"] = fast
    print(json.dumps(result), flush=True)
    if not args.skip_eager:
        batched, result["step_together"] = _stream(model, frames, together=True, fast=False, **run)
        result.update(_agreement(solo, batched))
        print(json.dumps(result), flush=True)
    if args.graphed:
        graphed, result["step_together_graphed"] = _stream(model, frames, together=True, fast=True, **run)
        result["step_together_graphed"].update(_agreement(solo, graphed))
        print(json.dumps(result), flush=True)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()
