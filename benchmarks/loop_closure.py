"""Loop closure's effect on multi-lap procedural sequences, through `mapstream run` and `mapstream eval`.

    python3 benchmarks/loop_closure.py --model small --seeds 401 402 403 --frames 360 --laps 2 \
        --hw 168 294 --device cuda --out loops.json

Each seed's sequence (`mapstream.synthetic.render_sequence`, seeds below
`FIRST_TRAINING_SEED`: never seen in training) goes round the room `--laps` times, so the
later laps revisit the first one's places (`--twin`: rooms where every view also has a
look-alike half a lap away, `mapstream.synthetic.make_twin_scene`). Every sequence is run twice with the run's
defaults, without and with `--loop-closure`, and scored by `mapstream eval` (Sim(3)-aligned
ATE as a fraction of the trajectory's extent, pose AUC@30, depth abs_rel, the fused cloud's
Chamfer distance). For the loop-closed run it also reports the map's loops and checks, its
time per keyframe, and every loop edge against the ground truth: an edge between frames whose
true camera centres are more than `--false-distance` metres apart (default 1 m, in rooms of
6 x 5.2 m), or whose viewing directions differ by more than 30 degrees, joins views of
different places: a false loop. Prints one line a run, the
medians, and the issue's targets (ATE with at most half of without, and at most 3 %).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def render(args: tuple[int, int, float, tuple[int, int], str, bool]) -> str:
    from mapstream.synthetic import render_sequence, write_sequence

    seed, frames, laps, hw, folder, twin = args
    seq = render_sequence(frames, hw, seed=seed, arc=2 * np.pi * laps, twin=twin)
    return str(write_sequence(seq, Path(folder) / f"gt_{seed}", depth_format="npy"))


def run_and_score(scene: Path, out: Path, model: str, device: str, loop: bool, run_args: list[str]) -> dict:
    from mapstream.eval.datasets import read_benchmark_scene

    flag = "--loop-closure" if loop else "--no-loop-closure"
    cmd = [sys.executable, "-m", "mapstream", "run", str(scene / "rgb"), "--out", str(out), "--model", model,
           "--formats", "npz", "tum", "--quiet", "--no-resume", "--device", device, flag, *run_args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    subprocess.run([sys.executable, "-m", "mapstream", "eval", str(out), "--gt", str(scene)], check=True,
                   capture_output=True, text=True)
    (metrics,) = [s["metrics"] for s in json.loads((out / "eval.json").read_text())["scenes"].values()]
    gt = read_benchmark_scene(scene)
    centres = gt.T_world_cam[:, :3, 3]
    extent = float(np.linalg.norm(centres.max(0) - centres.min(0)))
    run = json.loads((out / "run.json").read_text())
    row = {
        "ate_fraction": metrics["trajectory"]["ate"] / extent, "auc30": metrics["pose_auc"]["auc@30"],
        "abs_rel": metrics["depth"]["abs_rel"], "chamfer": (metrics.get("pointcloud") or {}).get("chamfer"),
        "fps": run["fps"],
    }
    record = run.get("loop_closure")
    if record:
        row["map"] = record["stats"]
        row["loops"] = [_judge(edge, gt.T_world_cam) for edge in record["loops"]]
        row["false_loops"] = sum(not edge["true"] for edge in row["loops"])
    return row


FALSE_DISTANCE = 1.0


def _judge(edge: dict, poses: np.ndarray) -> dict:
    a, b = poses[edge["candidate"]], poses[edge["query"]]
    distance = float(np.linalg.norm(a[:3, 3] - b[:3, 3]))
    angle = float(np.degrees(np.arccos(np.clip(a[:3, 2] @ b[:3, 2], -1, 1))))
    return {**edge, "gt_distance": distance, "gt_angle_deg": angle,
            "true": distance <= FALSE_DISTANCE and angle <= 30.0}


def main() -> int:
    global FALSE_DISTANCE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seeds", type=int, nargs="+", default=[401, 402, 403])
    parser.add_argument("--frames", type=int, default=360)
    parser.add_argument("--laps", type=float, default=2.0)
    parser.add_argument("--hw", type=int, nargs=2, default=(168, 294))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--run-args", default="", help="further flags for both runs of `mapstream run`")
    parser.add_argument("--false-distance", type=float, default=FALSE_DISTANCE)
    parser.add_argument("--twin", action="store_true",
                        help="rooms that look the same after a half turn (every view has a look-alike half a lap away)")
    parser.add_argument("--workers", type=int, default=4, help="processes rendering the sequences")
    parser.add_argument("--keep", type=Path, default=None, help="keep the sequences and runs in this folder")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    FALSE_DISTANCE = args.false_distance
    from mapstream.synthetic import FIRST_TRAINING_SEED

    if any(seed >= FIRST_TRAINING_SEED for seed in args.seeds):
        parser.error("seeds from FIRST_TRAINING_SEED on are training's; score on smaller ones")
    work = args.keep or Path(tempfile.mkdtemp(prefix="loops-"))
    work.mkdir(parents=True, exist_ok=True)
    jobs = [(seed, args.frames, args.laps, tuple(args.hw), str(work), args.twin) for seed in args.seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        scenes = dict(zip(args.seeds, pool.map(render, jobs)))
    rows = []
    for seed in args.seeds:
        for loop in (False, True):
            row = {"seed": seed, "loop_closure": loop, **run_and_score(
                Path(scenes[seed]), work / f"run_{seed}_{'loop' if loop else 'plain'}", args.model, args.device,
                loop, args.run_args.split())}
            rows.append(row)
            extra = (f"  loops {row['map']['loops']} (false {row['false_loops']}), checks {row['map']['checks']}, "
                     f"{row['map']['seconds_per_keyframe']['median'] * 1e3:.0f} ms/keyframe" if loop else "")
            print(f"seed {seed} {'loop ' if loop else 'plain'} ATE {row['ate_fraction']:.2%} AUC@30 {row['auc30']:.3f} "
                  f"abs_rel {row['abs_rel']:.3f} fps {row['fps']:.1f}{extra}", flush=True)
    summary = {}
    for loop in (False, True):
        mine = [r for r in rows if r["loop_closure"] == loop]
        summary["loop" if loop else "plain"] = {
            key: statistics.median(r[key] for r in mine) for key in ("ate_fraction", "auc30", "abs_rel")
        }
    plain, closed = summary["plain"]["ate_fraction"], summary["loop"]["ate_fraction"]
    summary["false_loops"] = sum(r.get("false_loops", 0) for r in rows)
    summary["targets"] = {"at_most_half": closed <= plain / 2, "at_most_3_percent": closed <= 0.03}
    print(f"median ATE/extent: without {plain:.2%}, with {closed:.2%} (targets: <= half: "
          f"{summary['targets']['at_most_half']}, <= 3 %: {summary['targets']['at_most_3_percent']}); "
          f"false loops: {summary['false_loops']}")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                        "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
