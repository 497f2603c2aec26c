#!/usr/bin/env bash
# The GPU checks, in parts that each fit in one device call of at most 10 minutes:
#   tests    the GPU tests (tests/gpu)
#   measure  the benchmark protocol at 504x378 (triton, compiled and bf16-heads), then a
#            profiled step of the protocol's own variant (fp32 heads) summarized by part
#   memory   one stream's memory by part beside its estimates (memory_parts.py), then 1,000
#            frames of 518x378 fitted to an 8 GB budget (mapstream bench --gpu-memory 8GB)
# Usage (device, from the repository root):
#   . benchmarks/device_setup.sh; bash benchmarks/device_check.sh tests|measure|memory
# Writes under $OUT (or ./device_check when OUT is unset): log.txt with every command's
# output; measure also bench.json, prof.json, trace.json.gz and trace_summary.txt; memory
# parts.json and budget.json. Prints their tails.
set -uo pipefail
part="${1:-}"
if [[ "$part" != "tests" && "$part" != "measure" && "$part" != "memory" ]]; then
    echo "usage: bash benchmarks/device_check.sh tests|measure|memory" >&2
    exit 2
fi
here="$(dirname "$0")"
out="${OUT:-device_check}"
mkdir -p "$out"
log="$out/log.txt"
if [[ "$part" == "tests" ]]; then
    python3 -m pytest tests/gpu -q --durations=15 > "$out/gpu_tests.tmp" 2>&1; tail -2 "$out/gpu_tests.tmp"
    grep -E "^E .*(assert|Error)" "$out/gpu_tests.tmp" | head -5
    cat "$out/gpu_tests.tmp" >> "$log"; rm "$out/gpu_tests.tmp"
    exit 0
fi
if [[ "$part" == "memory" ]]; then
    python3 "$here/memory_parts.py" --out "$out/parts.json" > "$out/parts.tmp" 2>&1; tail -3 "$out/parts.tmp"
    cat "$out/parts.tmp" >> "$log"; rm "$out/parts.tmp"
    python3 -m mapstream bench --backends triton --variants fast --resolutions 518x378 --stream-frames 1000 \
        --gpu-memory 8GB --no-check --no-stages --out "$out/budget.json" > "$out/budget.tmp" 2>&1
    grep -E "FPS|budget" "$out/budget.tmp"; cat "$out/budget.tmp" >> "$log"; rm "$out/budget.tmp"
    exit 0
fi
python3 -m mapstream bench --backends triton --variants compiled bf16-heads --resolutions 504x378 --no-stages \
    --out "$out/bench.json" > "$out/bench.tmp" 2>&1; grep -E "FPS" "$out/bench.tmp"
cat "$out/bench.tmp" >> "$log"; rm "$out/bench.tmp"
python3 "$here/profile_step.py" --fast --backend triton --compile --out "$out/prof.json" \
    --trace "$out/trace.json" >> "$log" 2>&1
python3 "$here/trace_summary.py" "$out/trace.json" > "$out/trace_summary.txt" 2>&1; head -8 "$out/trace_summary.txt"
gzip -f "$out/trace.json"
