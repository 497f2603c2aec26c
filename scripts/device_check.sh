#!/usr/bin/env bash
# Device calls that check and measure the fast path on an H200, in two parts that each fit in
# one call (a call may run 10 minutes; the GPU tests alone take ~6.5 since session 13):
#   tests    the GPU tests (tests/gpu), ~6.5 minutes
#   measure  the benchmark protocol at 504x378 (compiled and bf16-heads) and a profiled step
#            of the protocol's own variant (fp32 heads) summarized by part, ~3.5 minutes
# Usage (device, from the repository root): . scripts/device_setup.sh; bash scripts/device_check.sh PART
# Writes under $OUT (or ./device_check when OUT is unset): log.txt with every command's
# output; measure also bench.json, prof.json, trace.json.gz and trace_summary.txt. Prints
# their tails. The probes of sessions 6-7 (scripts/probe_*.py) run on their own when needed.
set -uo pipefail
part="${1:-}"
if [[ "$part" != "tests" && "$part" != "measure" ]]; then
    echo "usage: bash scripts/device_check.sh tests|measure" >&2
    exit 2
fi
out="${OUT:-device_check}"
mkdir -p "$out"
log="$out/log.txt"
if [[ "$part" == "tests" ]]; then
    python3 -m pytest tests/gpu -q --durations=15 > "$out/gpu_tests.tmp" 2>&1; tail -2 "$out/gpu_tests.tmp"
    grep -E "^E .*(assert|Error)" "$out/gpu_tests.tmp" | head -5
    cat "$out/gpu_tests.tmp" >> "$log"; rm "$out/gpu_tests.tmp"
    exit 0
fi
python3 -m mapstream bench --backends triton --variants compiled bf16-heads --resolutions 504x378 --no-stages \
    --out "$out/bench.json" > "$out/bench.tmp" 2>&1; grep -E "FPS" "$out/bench.tmp"
cat "$out/bench.tmp" >> "$log"; rm "$out/bench.tmp"
python3 scripts/profile_step.py --fast --backend triton --compile --out "$out/prof.json" \
    --trace "$out/trace.json" >> "$log" 2>&1
python3 scripts/trace_summary.py "$out/trace.json" > "$out/trace_summary.txt" 2>&1; head -8 "$out/trace_summary.txt"
gzip -f "$out/trace.json"
