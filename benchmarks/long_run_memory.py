"""Memory over a long stream: one session streams N frames of a looping pool of random
frames and records, every `--every` frames, the bytes its aggregator's cache holds, the
cache's frame counts and, on a GPU, the memory PyTorch holds there. It fails unless the
cache's bytes stay the same at every mark and, on a GPU, the allocated memory stays the same
after the first mark: the cache arena is leased up front and the trajectory memory is capped
and thinned, so nothing may grow with the stream's length.

Usage: python benchmarks/long_run_memory.py [--frames 2000] [--size 504x378] [--backend auto]
           [--fast] [--compile] [--out FILE]
       python benchmarks/long_run_memory.py --device cpu --preset tiny --size 56x42 --frames 24 --every 6
           (mechanism check: the cache only, the process's CPU memory is not measured)
The JSON file is rewritten at every mark, so an interrupted run keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import mapstream
from mapstream.bench import BenchConfig, build_bench_model, write_result
from mapstream.progress import progress_bar

PROTOCOL = BenchConfig()  # the defaults of the flags it shares with `mapstream bench`

# Distinct random frames cycled through: enough that no two neighbours repeat, few enough
# to keep on the device.
POOL_FRAMES = 32


def _mark(session, frame: int, device: torch.device, start: float) -> dict:
    stats = session.stats()["aggregator"]
    mark = {"frame": frame, "window_frames": stats.window_frames, "trajectory_frames": stats.trajectory_frames,
            "cache_bytes": stats.bytes_held, "elapsed_s": time.time() - start}
    if device.type == "cuda":
        mark["allocated"] = torch.cuda.memory_allocated(device)
        mark["reserved"] = torch.cuda.memory_reserved(device)
    return mark


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100, help="frames between marks")
    ap.add_argument("--size", default=f"{PROTOCOL.width}x{PROTOCOL.height}", help="WxH")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PROTOCOL.preset)
    ap.add_argument("--scale-frames", type=int, default=PROTOCOL.scale_frames)
    ap.add_argument("--window", type=int, default=PROTOCOL.window, help="frames in the sliding window")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--fast", action="store_true", help="single-frame steps through CUDA graphs")
    ap.add_argument("--compile", action="store_true", help="torch.compile the graph pieces' blocks")
    ap.add_argument("--out", default=None, help="also write the result here (JSON), at every mark")
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = BenchConfig(preset=args.preset, width=width, height=height, scale_frames=args.scale_frames,
                      window=args.window, backend=args.backend, device=args.device, precision=precision)
    model = build_bench_model(cfg, device, compile=args.compile)
    g = torch.Generator(device=device).manual_seed(0)
    pool = torch.rand(POOL_FRAMES, 3, height, width, device=device, generator=g)
    marks: list[dict] = []
    # Checked on the device and read at each mark, so the stream runs without a sync a frame.
    finite = torch.ones((), dtype=torch.bool, device=device)
    start = time.time()
    session = mapstream.Session(model, num_scale_frames=args.scale_frames, precision=precision, fast=args.fast)
    with session, torch.no_grad(), progress_bar(args.frames, desc="long run") as bar:
        for i in range(args.frames):
            for pred in session.step(pool[i % POOL_FRAMES]):
                finite &= torch.isfinite(pred.depth).all()
            bar.update(1)
            if (i + 1) % args.every == 0:
                if not bool(finite):
                    raise RuntimeError(f"non-finite depth before frame {i + 1}")
                marks.append(_mark(session, i + 1, device, start))
                print(json.dumps(marks[-1]), flush=True)
                if args.out:
                    write_result({"frames_done": i + 1, "options": vars(args), "marks": marks}, args.out)
    result: dict = {
        "frames": args.frames,
        "size": [width, height],
        "device": str(device),
        "mean_fps": args.frames / (time.time() - start),
        "trajectory_frames_max": max((m["trajectory_frames"] for m in marks), default=0),
        "flat_cache_bytes": len({m["cache_bytes"] for m in marks}) <= 1,
    }
    if device.type == "cuda":
        result["flat_allocated"] = len({m["allocated"] for m in marks[1:]}) <= 1
        result["peak_allocated"] = torch.cuda.max_memory_allocated(device)
    print(json.dumps(result), flush=True)
    result["marks"] = marks
    result["options"] = vars(args)
    if args.out:
        write_result(result, args.out)
    if not result["flat_cache_bytes"]:
        raise SystemExit("the cache's memory changed during the stream")
    if device.type == "cuda" and not result["flat_allocated"]:
        raise SystemExit("GPU memory grew during the stream")
    return result


if __name__ == "__main__":
    main()
