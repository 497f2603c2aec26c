"""GPU memory over a long stream with the full model (bf16, synthetic weights).

Streams N random frames through one session and records torch.cuda.memory_allocated /
memory_reserved every `every` frames; asserts they are flat once the first frame is stored
(the cache arena is leased up front, the trajectory memory is capped and thinned).

Usage: python scripts/long_run_memory.py [--frames 2000] [--width 504 --height 378]
           [--backend auto] [--fast] [--compile] [--out FILE]
The JSON file is rewritten at every mark, so an interrupted run keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from mapstream.bench import BenchConfig, build_bench_model, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--width", type=int, default=504)
    ap.add_argument("--height", type=int, default=378)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--fast", action="store_true", help="CUDA-graph single-frame steps")
    ap.add_argument("--compile", action="store_true", help="torch.compile the graph pieces' blocks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = BenchConfig(width=args.width, height=args.height, backend=args.backend)
    model = build_bench_model(cfg, torch.device("cuda"))
    if args.compile:
        from mapstream.models.compile import compile_model

        compile_model(model)
    pool = torch.rand(32, 3, args.height, args.width, device="cuda")
    marks = []
    finite = torch.ones((), dtype=torch.bool, device="cuda")
    start = time.time()
    with model.session(num_scale_frames=8, precision="bf16", fast=args.fast) as session:
        for i in range(args.frames):
            preds = session.step(pool[i % 32])
            for p in preds:  # checked on the GPU, read at each mark (no per-frame sync)
                finite &= torch.isfinite(p.depth).all()
            if (i + 1) % args.every == 0:
                if not bool(finite):
                    raise RuntimeError(f"non-finite depth before frame {i + 1}")
                st = session.stats()["aggregator"]
                marks.append({
                    "frame": i + 1,
                    "allocated": torch.cuda.memory_allocated(),
                    "reserved": torch.cuda.memory_reserved(),
                    "trajectory_frames": st.trajectory_frames,
                    "elapsed_s": time.time() - start,
                })
                print(json.dumps(marks[-1]), flush=True)
                if args.out:
                    write_result({"frames_done": i + 1, "options": vars(args), "marks": marks}, args.out)
    allocated = {m["allocated"] for m in marks[1:]}
    result = {
        "frames": args.frames,
        "size": [args.width, args.height],
        "marks": marks,
        "flat_allocated": len(allocated) == 1,
        "mean_fps": args.frames / (time.time() - start),
        "peak_allocated": torch.cuda.max_memory_allocated(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "marks"}))
    result["options"] = vars(args)
    if args.out:
        write_result(result, args.out)
    assert result["flat_allocated"], "GPU memory grew during the stream"


if __name__ == "__main__":
    main()
