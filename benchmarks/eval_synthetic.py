"""A model's quality on procedural sequences it never saw, through `mapstream run` and `mapstream eval`.

    python3 benchmarks/eval_synthetic.py --model runs/small/model.safetensors \
        --seeds 101 102 103 --frames 24 --hw 168 294 --out eval.json

Each seed's sequence comes from `mapstream.synthetic.render_sequence` (the public API; seeds
below `mapstream.synthetic.FIRST_TRAINING_SEED`, which training never draws), written in
the benchmark layout, reconstructed by `mapstream run` (at the width its model records
unless `--image-size` says otherwise, as a user's run) and scored by
`mapstream eval` (Sim(3)-aligned ATE, pose AUC@30, median-scaled depth abs_rel and δ<1.25,
and the fused point cloud's Chamfer distance and F1 within 5 cm).
Prints one line a seed and the medians over the seeds, against issue 34's targets.
``--run-args "--num-scale-frames 1"`` passes further flags to `mapstream run` (the streaming
settings a network trained on short clips is scored with).
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mapstream.synthetic import FIRST_TRAINING_SEED

TARGETS = {"ate_fraction": (0.05, "max"), "auc30": (0.6, "min"), "abs_rel": (0.10, "max"), "delta1": (0.90, "min")}
# The fused point cloud, predicted depth placed by the predicted cameras and the
# poses' Sim(3): what depth and cameras make together (no target; metres, and F1 within 5 cm).
CLOUD = ("chamfer", "f1")


def evaluate_seed(model: str, seed: int, frames: int, hw: tuple[int, int], folder: Path,
                  arc: float, run_args: tuple[str, ...] = (), device: str = "cpu",
                  image_size: int | None = None) -> dict:
    import numpy as np

    from mapstream.synthetic import render_sequence, write_sequence

    seq = render_sequence(frames, hw, seed=seed, arc=arc)
    scene = write_sequence(seq, folder / f"gt_{seed}", depth_format="npy")
    run = folder / f"run_{seed}"
    width = () if image_size is None else ("--image-size", str(image_size))
    cmd = [sys.executable, "-m", "mapstream", "run", str(scene / "rgb"), "--out", str(run), "--model", model,
           *width, "--formats", "npz", "tum", "--quiet", "--no-resume", "--device", device, *run_args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    subprocess.run([sys.executable, "-m", "mapstream", "eval", str(run), "--gt", str(scene)],
                   check=True, capture_output=True, text=True)
    (metrics,) = [scene["metrics"] for scene in json.loads((run / "eval.json").read_text())["scenes"].values()]
    centres = seq.T_world_cam[:, :3, 3]
    extent = float(np.linalg.norm(centres.max(0) - centres.min(0)))  # the trajectory's bounding-box diagonal
    ate = metrics["trajectory"]["ate"]
    return {
        "seed": seed, "ate": ate, "extent": extent, "ate_fraction": ate / extent,
        "auc30": metrics["pose_auc"]["auc@30"], "abs_rel": metrics["depth"]["abs_rel"],
        "delta1": metrics["depth"]["delta_1"], **cloud_scores(metrics),
    }


def cloud_scores(metrics: dict) -> dict:
    """Chamfer and F1 of the fused cloud; where `mapstream eval` could not place the cloud (the
    predicted centres run against the true ones, so no positive scale fits), the worst values:
    an infinite distance and no match, which a median ranks last instead of leaving out."""
    if "points" not in metrics:
        return {"chamfer": float("inf"), "f1": 0.0}
    return {"chamfer": metrics["points"]["chamfer"], "f1": metrics["points"]["f1"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103])
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--hw", type=int, nargs=2, default=(168, 294))
    ap.add_argument("--image-size", type=int, help="the width `mapstream run` takes (default: the model's own)")
    ap.add_argument("--arc", type=float, default=1.0, help="radians travelled along the path (render_sequence)")
    ap.add_argument("--run-args", default="", help="further `mapstream run` flags, one string")
    ap.add_argument("--device", default="cpu", help="where `mapstream run` reconstructs (cpu, cuda)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    trained = [s for s in args.seeds if s >= FIRST_TRAINING_SEED]
    if trained:
        ap.error(f"--seeds {trained}: seeds from {FIRST_TRAINING_SEED} on are training's scenes; "
                 "score on smaller seeds")
    run_args = tuple(shlex.split(args.run_args))
    with tempfile.TemporaryDirectory() as tmp:
        rows = [evaluate_seed(args.model, s, args.frames, tuple(args.hw), Path(tmp), args.arc, run_args,
                              args.device, args.image_size)
                for s in args.seeds]
    for row in rows:
        print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    medians = {k: statistics.median(r[k] for r in rows) for k in (*TARGETS, *CLOUD)}
    met = {k: (medians[k] <= t if how == "max" else medians[k] >= t) for k, (t, how) in TARGETS.items()}
    print("median " + " ".join(f"{k} {medians[k]:.3f} ({'met' if met[k] else 'target ' + str(TARGETS[k][0])})"
                               for k in TARGETS) + " " + " ".join(f"{k} {medians[k]:.3f}" for k in CLOUD))
    result = {"model": args.model, "frames": args.frames, "hw": list(args.hw), "image_size": args.image_size,
              "arc": args.arc, "run_args": list(run_args), "device": args.device, "seeds": rows,
              "median": medians, "met": met}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
