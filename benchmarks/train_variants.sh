#!/usr/bin/env bash
# Several training runs side by side on one GPU: a small network's step is bound by launching
# kernels, so runs sharing the GPU each keep most of their speed (docs/TRAINING.md).
#   [RECIPE=recipes/small_stage2.yaml] bash benchmarks/train_variants.sh MINUTES NAME=FLAGS...
#   e.g. bash benchmarks/train_variants.sh 7 "base=" "pan=--path-kinds pan" "short=--frames 8 --num-scale-frames 2"
# Each NAME trains RECIPE plus its FLAGS in runs/NAME for MINUTES (the learning rate held at
# its peak: --steps 100000) and writes $OUT/NAME.jsonl (its metrics); $OUT/logs.txt gathers
# the end of every log. At most 7 variants (the call returns at most 8 files). KEEP_WEIGHTS=1
# also writes each run's current weights in half precision to $OUT/NAME/ (two files each,
# benchmarks/half_weights.py; the call returns 64 MiB at most: two or three variants);
# KEEP_WEIGHTS="NAME ..." does so for the variants named.
set -uo pipefail
minutes=${1:?minutes}
shift
(( $# >= 1 && $# <= 7 )) || { echo "give 1 to 7 variants NAME=FLAGS" >&2; exit 2; }
recipe=${RECIPE:-recipes/small_stage2.yaml}
out=${OUT:-out}
mkdir -p runs "$out"
names=()
for variant in "$@"; do
    name=${variant%%=*}
    flags=${variant#*=}
    [[ $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "bad variant name: $name" >&2; exit 2; }
    names+=("$name")
    # shellcheck disable=SC2086  # FLAGS is a list of words
    python3 -m mapstream train --config "$recipe" --steps 100000 --checkpoint-every 100000 \
        --time-limit-minutes "$minutes" --quiet --out "runs/$name" $flags > "runs/$name.log" 2>&1 &
done
wait
for name in "${names[@]}"; do
    echo "== $name"
    grep -v "trainer: step" "runs/$name.log" | tail -6
    cp "runs/$name/metrics.jsonl" "$out/$name.jsonl" 2>/dev/null || echo "(no metrics)"
    if [[ ${KEEP_WEIGHTS:-0} == 1 || " ${KEEP_WEIGHTS:-} " == *" $name "* ]]; then
        mkdir -p "$out/$name" && python3 "$(dirname "$0")/half_weights.py" split "runs/$name" "$out/$name"
    fi
done | tee "$out/logs.txt"
