#!/usr/bin/env bash
# One leg of training recipes/small.yaml on a GPU machine whose calls are time-limited.
#   [RECIPE=recipes/small.yaml RUN=runs/small] bash benchmarks/train_small_device.sh MINUTES [STEPS]
# Trains RECIPE in RUN for MINUTES (resuming what an earlier leg left there), then writes to
# $OUT: metrics.jsonl, the log, and the current weights (the EMA's) in half precision, split
# in two files of under 16 MB (benchmarks/half_weights.py joins them). STEPS overrides the
# recipe's length (the schedule stretches from the current step).
set -euo pipefail
minutes=${1:?minutes}
steps=${2:-}
recipe=${RECIPE:-recipes/small.yaml}
run=${RUN:-runs/small}
mkdir -p "$run" "${OUT:-out}"
extra=()
[[ -n "$steps" ]] && extra+=(--steps "$steps")
PYTHONUNBUFFERED=1 python3 -m mapstream train --config "$recipe" --out "$run" --quiet \
    --time-limit-minutes "$minutes" "${extra[@]}" 2>&1 | tee -a "${OUT:-out}/train.log"
cp "$run/metrics.jsonl" "${OUT:-out}/metrics.jsonl"
python3 benchmarks/half_weights.py split "$run" "${OUT:-out}"
