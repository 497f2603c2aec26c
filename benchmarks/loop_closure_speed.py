"""The stream's frame rate with the global map beside it, against without, on one CUDA GPU.

    python3 benchmarks/loop_closure_speed.py --frames 400 --out speed.json [--compile]

The official architecture (rule weights, `mapstream.bench.build_bench_model`), bf16, the
fast path (CUDA graphs), 504x378 frames of a procedural sequence going twice round a room.
Passes alternate without and with a `BackgroundMap` (A, B, A, B, ...; the graphs are
captured once, before the first timed pass); each frame's wall time runs from the step's
start to its prediction on the CPU, as a run consumes it. Reported: the steady frame rate
(frames from `--steady-from` on, the cache window full) of every pass, the ratio of the
medians (the issue's target: >= 0.90), and the map's keyframes, loop checks, loops, searches
skipped for falling behind and time per keyframe. `--min-similarity 0` makes every keyframe
verify its best candidate: the map's worst load.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np
import torch


def frames_of(total: int, hw: tuple[int, int], seed: int, workers: int) -> torch.Tensor:
    """The frames `render_sequence(total, hw, seed, arc=4 pi)` renders, in parallel chunks."""
    chunk = -(-total // workers)
    from mapstream.synthetic.scene import make_scene
    from mapstream.synthetic.sequence import camera_path, pinhole_intrinsics

    scene, K = make_scene(seed), pinhole_intrinsics(hw, 70.0)
    path = camera_path(total, seed, arc=4 * np.pi)
    with ProcessPoolExecutor(workers) as pool:
        parts = list(pool.map(_render_poses, [(scene, K, path[i : i + chunk], hw) for i in range(0, total, chunk)]))
    rgb = np.concatenate(parts)
    return torch.from_numpy(rgb).permute(0, 3, 1, 2).float() / 255


def _render_poses(args):
    scene, K, poses, hw = args
    return np.stack([scene.render(K, T, hw)[0] for T in poses])


def one_pass(model, frames, cfg, map_config, with_map: bool, fast) -> dict:
    from mapstream.globalmap import BackgroundMap

    session = model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=fast,
                            output_device="cpu")
    background = BackgroundMap(model, map_config) if with_map else None
    device = next(model.parameters()).device
    times = []
    for i, frame in enumerate(frames):
        started = time.perf_counter()
        preds = session.step(frame.to(device, non_blocking=True))
        if background is not None:
            for pred in preds:
                background.submit(pred, frames[pred.index])
        times.append(time.perf_counter() - started)
    stats = None
    if background is not None:
        finished = time.perf_counter()
        gmap = background.finish()
        stats = {**gmap.stats(), "skipped_searches": background.skipped_searches,
                 "finish_s": time.perf_counter() - finished}
    session.close()
    return {"times": times, "map": stats}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--steady-from", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of passes (without, with)")
    parser.add_argument("--seed", type=int, default=411)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--min-similarity", type=float, default=None)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from mapstream.bench import BenchConfig, build_bench_model
    from mapstream.globalmap import MapConfig

    device = torch.device("cuda")
    cfg = BenchConfig(backend="auto", fast=True)
    model = build_bench_model(cfg, device, compile=args.compile)
    frames = frames_of(args.frames, (cfg.height, cfg.width), args.seed, args.workers)
    map_config = MapConfig() if args.min_similarity is None else replace(MapConfig(), min_similarity=args.min_similarity)
    one_pass(model, frames[: cfg.scale_frames + 20], cfg, map_config, False, True)  # capture the graphs
    passes = []
    for _ in range(args.repeats):
        for with_map in (False, True):
            result = one_pass(model, frames, cfg, map_config, with_map, True)
            steady = result["times"][args.steady_from :]
            fps = 1.0 / statistics.mean(steady)
            passes.append({"with_map": with_map, "steady_fps": fps, "map": result["map"],
                           "steady_ms_p50": 1e3 * statistics.median(steady), "steady_ms_max": 1e3 * max(steady)})
            print(f"{'with map   ' if with_map else 'without map'} steady {fps:.1f} FPS "
                  f"(p50 {passes[-1]['steady_ms_p50']:.1f} ms, max {passes[-1]['steady_ms_max']:.1f} ms)"
                  + (f" map {result['map']}" if result["map"] else ""), flush=True)
    without = statistics.median(p["steady_fps"] for p in passes if not p["with_map"])
    with_map = statistics.median(p["steady_fps"] for p in passes if p["with_map"])
    summary = {"device": torch.cuda.get_device_name(device), "without_fps": without, "with_fps": with_map,
               "ratio": with_map / without, "compile": args.compile, "frames": args.frames,
               "min_similarity": map_config.min_similarity}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "passes": passes}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
