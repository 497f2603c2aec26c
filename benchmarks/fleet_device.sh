#!/usr/bin/env bash
# The many-input job on one GPU against one input alone, with the official architecture.
#   bash benchmarks/fleet_device.sh VIDEO_FOLDER [--ray]
# Weights: the official architecture filled by the golden data's rule (throughput does not
# depend on their values), saved once to /tmp. Runs every *.mp4 of VIDEO_FOLDER as one job
# (in this process, or on one Ray actor with --ray) into runs/fleet, then the first video alone
# into runs/single; copies job.json and the single run's run.json to $OUT.
set -euo pipefail
videos=${1:?folder of videos}
shift
out=${OUT:-out}
mkdir -p "$out"
weights=$(python3 "$(dirname "$0")/rule_weights.py" /tmp/mapstream_official/model.safetensors)
common=(--model "$weights" --quiet --fps 10 --formats npz tum)
first=$(ls "$videos"/*.mp4 | head -1)
python3 -m mapstream run "$first" --out runs/single "${common[@]}" --no-resume
python3 -m mapstream run "$videos"/*.mp4 --out runs/fleet "${common[@]}" "$@"
cp runs/fleet/job.json "$out/fleet_job.json"
cp runs/single/run.json "$out/single_run.json"
python3 - runs/fleet/job.json runs/single/run.json <<'PY'
import json, sys
job, single = (json.load(open(p)) for p in sys.argv[1:])
print("job", json.dumps({k: job[k] for k in ("backend", "workers", "done", "failed", "frames", "seconds", "fps")}))
print("job inputs' own fps", [round(r["fps"], 1) for r in job["results"]])
print("single", json.dumps({"frames": single["frames"], "fps": single["fps"], "timings_s": single["timings_s"]}))
PY
