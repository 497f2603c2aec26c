#!/usr/bin/env bash
# One device call that checks and measures the fast path (about 8 minutes on an H200):
# the GPU tests, the tensor/special-function overlap probe, the benchmark protocol at
# 504x378 (compiled and bf16-heads), and a profiled step summarized by part.
# Usage (device, from the repository root): . scripts/device_setup.sh; bash scripts/device_check.sh
# Writes its logs under $OUT (or ./device_check when OUT is unset) and prints their tails.
set -uo pipefail
out="${OUT:-device_check}"
mkdir -p "$out"
python3 -m pytest tests/gpu -q > "$out/gpu_tests.txt" 2>&1; tail -2 "$out/gpu_tests.txt"
grep -E "^E .*(assert|Error)" "$out/gpu_tests.txt" | head -5
python3 scripts/probe_tensor_sfu_overlap.py "$out/probe.json" > "$out/probe_log.txt" 2>&1; tail -14 "$out/probe_log.txt"
python3 -m mapstream bench --backends triton --variants compiled bf16-heads --resolutions 504x378 --no-stages \
    --out "$out/bench.json" > "$out/bench_log.txt" 2>&1; grep -E "FPS" "$out/bench_log.txt"
python3 scripts/profile_step.py --fast --backend triton --compile --bf16-heads --out "$out/prof.json" \
    --trace "$out/trace.json" > "$out/prof_log.txt" 2>&1
python3 scripts/trace_summary.py "$out/trace.json" > "$out/trace_summary.txt" 2>&1; head -8 "$out/trace_summary.txt"
gzip -f "$out/trace.json"
