"""Score the runs of a sweep on procedural sequences none of them trained on, and keep the best runs' weights.

    python3 benchmarks/score_variants.py base hw294 trans --seeds 101 102 103 104 105 106 \
        --device cuda --keep 2 --out "$OUT"

Each NAME's export (runs/NAME/model.safetensors, which `benchmarks/train_variants.sh` leaves
at its time limit) is scored by `benchmarks/eval_synthetic.py`, every run at once (one process
each). OUT/scores.json holds each run's seeds, medians and place; the KEEP runs of best mean
rank over the four metrics (ATE over the extent, AUC@30, depth abs_rel, δ<1.25; ties go to
the lower ATE) have their latest checkpoint split into OUT/NAME/ by `half_weights.py`, small
enough to come back from the device and be carried into the next leg. A run whose scoring
fails (no export) is reported with its error and placed last. Each seed is a `mapstream run`
process of its own: three runs of six seeds take more than the 2.5 minutes a 10-minute device
call has left after a 7-minute leg, so a call that trains and scores leaves several minutes for
the scoring.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from eval_synthetic import TARGETS  # noqa: E402  (sibling scripts, not a package)
from half_weights import split  # noqa: E402


def placing(medians: dict[str, dict[str, float]]) -> list[str]:
    """Names from best to worst by their mean rank over the metrics of `TARGETS` (rank 0 is the
    best value of a metric; equal values share the better rank); ties go to the lower ATE."""
    ranks = {name: 0.0 for name in medians}
    for key, (_, how) in TARGETS.items():
        better_first = sorted({m[key] for m in medians.values()}, reverse=(how == "min"))
        for name, m in medians.items():
            ranks[name] += better_first.index(m[key]) / len(TARGETS)
    return sorted(medians, key=lambda name: (ranks[name], medians[name]["ate_fraction"]))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", help="runs/NAME for each NAME")
    ap.add_argument("--runs", type=Path, default=Path("runs"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103, 104, 105, 106])
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--hw", type=int, nargs=2, default=(168, 294))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--keep", type=int, default=1, help="how many of the best runs' weights to split into OUT")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {}
        for name in args.names:
            cmd = [sys.executable, str(HERE / "eval_synthetic.py"), "--model", str(args.runs / name / "model.safetensors"),
                   "--seeds", *map(str, args.seeds), "--frames", str(args.frames), "--hw", *map(str, args.hw),
                   "--device", args.device, "--out", str(Path(tmp) / f"{name}.json")]
            jobs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        scores, failed = {}, {}
        for name, job in jobs.items():
            _, err = job.communicate()
            if job.returncode == 0:
                scores[name] = json.loads((Path(tmp) / f"{name}.json").read_text())
            else:
                failed[name] = err.strip().splitlines()[-1] if err.strip() else f"exit {job.returncode}"
    order = placing({name: s["median"] for name, s in scores.items()}) + list(failed)
    for place, name in enumerate(order):
        if name in failed:
            print(f"{place + 1}. {name}: failed: {failed[name]}")
        else:
            print(f"{place + 1}. {name}: " + " ".join(f"{k} {v:.3f}" for k, v in scores[name]["median"].items()))
    result = {"order": order, "seeds": args.seeds, "frames": args.frames, "hw": list(args.hw),
              "runs": {name: {"median": s["median"], "seeds": s["seeds"]} for name, s in scores.items()},
              "failed": failed}
    (args.out / "scores.json").write_text(json.dumps(result, indent=2))
    for name in [n for n in order if n in scores][: args.keep]:
        (args.out / name).mkdir(exist_ok=True)
        split(args.runs / name, args.out / name)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
