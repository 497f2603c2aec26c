"""The global map's settings compared on the same streams: each sequence is streamed once
(`mapstream run --no-loop-closure`), then the map is built on its stored predictions once per
setting, so every setting sees exactly the same stream.

    python3 benchmarks/loop_closure_replay.py --seeds 401 402 403 404 --device cuda \
        --setting default= --setting strict="min_overlap=0.7" --out replay.json

Sequences are `mapstream.synthetic.render_sequence` rooms (seeds below `FIRST_TRAINING_SEED`),
`--frames` frames going `--laps` times round (`--twin`: rooms with a look-alike half a lap
away). For every sequence and setting it prints the Sim(3)-aligned ATE as a fraction of the
trajectory's extent without and with the map, the first lap's own ATE (what the map cannot
correct: drift within the lap before any loop), the loops closed, those joining frames more
than 1 m or 30 degrees apart by the ground truth (false loops), and the checks run; then the
median ATE of each setting; `--plots DIR` draws each sequence's trajectories from above. The
map gets the stream's window joins as the run stored them, as `mapstream run --loop-closure` does.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def render(job: tuple[int, int, float, bool, str]) -> str:
    from mapstream.synthetic import render_sequence, write_sequence

    seed, frames, laps, twin, folder = job
    scene = Path(folder) / f"gt_{seed}{'_twin' if twin else ''}"
    seq = render_sequence(frames, (168, 294), seed=seed, arc=2 * np.pi * laps, twin=twin)
    return str(write_sequence(seq, scene, depth_format="npy"))


def parse_setting(text: str) -> tuple[str, dict]:
    """NAME=key=value,key=value: the values JSON (a list in brackets keeps its commas)."""
    name, _, body = text.partition("=")
    settings = {}
    for item in filter(None, re.split(r",(?![^\[]*\])", body)):
        key, _, value = item.partition("=")
        settings[key.strip()] = json.loads(value)
    return name, settings


def ate(est: np.ndarray, gt: np.ndarray, extent: float) -> float:
    from mapstream.geometry.align import align_trajectories

    sim = align_trajectories(est, gt, mode="sim3")
    return float(np.sqrt(((sim.apply_points(est[:, :3, 3]) - gt[:, :3, 3]) ** 2).sum(1).mean()) / extent)


def plot_top_view(path: Path, gt: np.ndarray, trajectories: dict[str, np.ndarray], extent: float, title: str) -> None:
    """Camera centres seen from above (the plane of the ground truth's path: its two principal
    axes), each trajectory Sim(3)-aligned to the truth, labelled with its ATE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mapstream.geometry.align import align_trajectories

    mean = gt[:, :3, 3].mean(0)
    axes = np.linalg.svd(gt[:, :3, 3] - mean, full_matrices=False)[2][:2]  # the path's plane

    def flat(points: np.ndarray) -> np.ndarray:
        return (points - mean) @ axes.T

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.plot(*flat(gt[:, :3, 3]).T, color="black", linewidth=2, label="ground truth")
    for name, est in trajectories.items():
        centres = align_trajectories(est, gt, mode="sim3").apply_points(est[:, :3, 3])
        ax.plot(*flat(centres).T, linewidth=1, label=f"{name} (ATE {ate(est, gt, extent):.1%} of the extent)")
    ax.set_aspect("equal")
    ax.set_xlabel("m")
    ax.set_ylabel("m")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def replay(model, recon, settings: dict, scale_frames: np.ndarray):
    """The map of `settings` built in the foreground on a stored run's frames, solved."""
    from mapstream.globalmap import GlobalMap, MapConfig
    from mapstream.pipeline.loop_closure import stored_frames

    gmap = GlobalMap(model, MapConfig(**settings))
    for pred, image in stored_frames(recon, scale_frames):
        gmap.add(pred, image)
    gmap.finish()
    return gmap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seeds", type=int, nargs="+", default=[401, 402, 403, 404])
    parser.add_argument("--frames", type=int, default=360)
    parser.add_argument("--laps", type=float, default=2.0)
    parser.add_argument("--twin", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--setting", action="append", default=[],
                        help='NAME=KEY=VALUE,KEY=VALUE (MapConfig fields, JSON values); "default=" is MapConfig()')
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plots", type=Path, default=None,
                        help="write a top view of each sequence's trajectories (truth, stream, each setting) here")
    args = parser.parse_args()
    import mapstream
    from mapstream.eval.datasets import read_benchmark_scene
    from mapstream.export.reconstruction import Reconstruction
    from mapstream.pipeline.frame_store import stored_scale_frames
    from mapstream.synthetic import FIRST_TRAINING_SEED

    if any(seed >= FIRST_TRAINING_SEED for seed in args.seeds):
        parser.error("seeds from FIRST_TRAINING_SEED on are training's; score on smaller ones")
    settings = dict(parse_setting(s) for s in (args.setting or ["default="]))
    work = Path(tempfile.mkdtemp(prefix="loop-replay-"))
    with ProcessPoolExecutor(args.workers) as pool:
        scenes = list(pool.map(render, [(s, args.frames, args.laps, args.twin, str(work)) for s in args.seeds]))
    model = mapstream.load_model(args.model).to(args.device)
    rows = []
    for seed, scene in zip(args.seeds, map(Path, scenes)):
        out = work / f"run_{seed}"
        subprocess.run([sys.executable, "-m", "mapstream", "run", str(scene / "rgb"), "--out", str(out), "--model",
                        args.model, "--formats", "npz", "--quiet", "--no-resume", "--no-loop-closure", "--device",
                        args.device], check=True, capture_output=True)
        recon = Reconstruction.load_npz(out / "predictions.npz")
        scale_frames = stored_scale_frames(out)
        gt = read_benchmark_scene(scene).T_world_cam
        est = np.asarray(recon.T_world_cam, dtype=np.float64)
        extent = float(np.linalg.norm(gt[:, :3, 3].max(0) - gt[:, :3, 3].min(0)))
        lap = int(len(est) / args.laps)
        drawn = {"stream": est}
        for name, setting in settings.items():
            started = time.perf_counter()
            gmap = replay(model, recon, setting, scale_frames)
            corrected = np.stack([gmap.correct_pose(i, est[i])[0] for i in range(len(est))])
            false = 0
            for loop in gmap.loops:
                a, b = gt[loop.candidate], gt[loop.query]
                angle = np.degrees(np.arccos(np.clip(a[:3, 2] @ b[:3, 2], -1, 1)))
                false += bool(np.linalg.norm(a[:3, 3] - b[:3, 3]) > 1.0 or angle > 30)
            row = {"seed": seed, "setting": name, "without": ate(est, gt, extent), "with": ate(corrected, gt, extent),
                   "first_lap": ate(est[:lap], gt[:lap], extent), "loops": len(gmap.loops), "false_loops": false,
                   "checks": gmap.checks, "seconds": time.perf_counter() - started}
            rows.append(row)
            drawn[name] = corrected
            print(f"seed {seed} {name}: ATE {row['without']:.2%} -> {row['with']:.2%} (first lap {row['first_lap']:.2%}), "
                  f"{row['loops']} loops ({false} false), {row['checks']} checks, {row['seconds']:.0f} s", flush=True)
        if args.plots:
            plot_top_view(args.plots / f"seed_{seed}.png", gt, drawn, extent, f"seed {seed}")
    for name in settings:
        mine = [r for r in rows if r["setting"] == name]
        print(f"{name}: median ATE {statistics.median(r['without'] for r in mine):.2%} -> "
              f"{statistics.median(r['with'] for r in mine):.2%}, false loops {sum(r['false_loops'] for r in mine)}")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
