#!/usr/bin/env bash
# Scaling over the GPUs of one machine (issue 37), in three parts, each well under ten minutes:
#   bash benchmarks/multi_gpu_device.sh fleet VIDEO_FOLDER   # the many-input job: 1 GPU, then all
#   bash benchmarks/multi_gpu_device.sh train                # DDP training: 1 GPU against all
#   bash benchmarks/multi_gpu_device.sh fsdp                 # one FSDP step of the official architecture
# VIDEO_FOLDER: *.mp4 files (python3 benchmarks/make_videos.py VIDEO_FOLDER writes 16 of 200
# frames at 504x378). GPUS=N uses the first N GPUs (default: all). Writes to $OUT (at most 8
# files): fleet.json, train.json, train_1gpu.jsonl, train_ngpu.jsonl, fsdp_step.json, log.txt.
#
# fleet: the official architecture with the golden data's rule weights (as fleet_device.sh;
# throughput does not depend on their values) runs every video as one job on GPU 0, then on all
# GPUs: through Ray (--ray, one actor a GPU) when `import ray` works, else one
# `mapstream run --many` process a GPU (CUDA_VISIBLE_DEVICES=i, every N-th video), all under
# one --out. Then every input's predictions.npz must equal the one-GPU run's (each array's
# largest difference within FLEET_RTOL, default 1e-2, of its largest magnitude), and inputs/s,
# stream-frames/s (wall clock, process start and model load included) and the scaling
# efficiency (N-GPU rate / (N x 1-GPU rate)) are printed.
# train: recipes/small.yaml for TRAIN_STEPS (default 12) steps with the same global batch on
# one GPU and under torchrun on N (PER_GPU_BATCH clips each, default ceil(12 / N), the
# recipe's 12 spread out); step time is the mean of the steps after the first two (FlexAttention
# compiles once per clip size; the recipe alternates two), samples/s = global batch / step time.
# The two loss curves must agree to bf16 noise: the data of a step does not depend on the split.
# fsdp: benchmarks/train_step.py under torchrun, --distributed fsdp: full fine-tuning of
# lingbot-map (1.16 B parameters), bf16, --checkpoint-layers, 8 frames of 294x518, 1 clip per
# GPU, 3 steps; peak memory of every GPU (one H200 alone: 31.2 GiB, docs/TRAINING.md).
# FLEET_BACKEND=processes skips Ray. A check of the mechanism on a CPU: GPUS=2 MODEL=tiny (fleet), GPUS=2 RECIPE=a-cpu-recipe.yaml
# TRAIN_DEVICE=cpu (train).
set -euo pipefail
usage="usage: multi_gpu_device.sh fleet VIDEO_FOLDER | train | fsdp"
part=${1:-}
[[ $part == fleet || $part == train || $part == fsdp ]] || { echo "$usage" >&2; exit 2; }
out=${OUT:-out}
mkdir -p "$out" runs
log="$out/log.txt"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gpus=${GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
(( gpus >= 1 )) || { echo "no GPU" >&2; exit 1; }
all_gpus=$(seq -s, 0 $((gpus - 1)))
now() { date +%s.%N; }

fleet() {
    local videos=$1
    [[ -d $videos ]] || { echo "$usage (no folder ${videos:-given})" >&2; exit 2; }
    local weights=${MODEL:-}
    [[ -n $weights ]] || weights=$(python3 "$here/rule_weights.py" /tmp/mapstream_official/model.safetensors)
    local common=(--model "$weights" --quiet --fps 10 --formats npz)
    local inputs
    mapfile -t inputs < <(ls "$videos"/*.mp4)
    (( ${#inputs[@]} > 0 )) || { echo "no *.mp4 in $videos" >&2; exit 1; }
    rm -rf runs/gpus_1 runs/gpus_n
    echo "== fleet: ${#inputs[@]} videos on 1 GPU" | tee -a "$log"
    local t0 t1 t2 backend fail=0
    t0=$(now)
    CUDA_VISIBLE_DEVICES=0 python3 -m mapstream run "${inputs[@]}" --many --out runs/gpus_1 "${common[@]}" 2>&1 | tee -a "$log"
    t1=$(now)
    echo "== fleet: ${#inputs[@]} videos on $gpus GPUs" | tee -a "$log"
    local want=${FLEET_BACKEND:-auto}  # auto, ray or processes
    if [[ $want == ray || ( $want == auto && $(python3 -c "import ray" 2>/dev/null && echo yes) == yes ) ]]; then
        backend=ray
        CUDA_VISIBLE_DEVICES=$all_gpus python3 -m mapstream run "${inputs[@]}" --ray --ray-workers "$gpus" \
            --out runs/gpus_n "${common[@]}" 2>&1 | tee -a "$log"
    else
        backend=processes  # no Ray on the image: one job process a GPU, every N-th video each
        local pids=() i j mine
        for ((i = 0; i < gpus; i++)); do
            mine=()
            for ((j = i; j < ${#inputs[@]}; j += gpus)); do mine+=("${inputs[j]}"); done
            (( ${#mine[@]} > 0 )) || continue
            CUDA_VISIBLE_DEVICES=$i python3 -m mapstream run "${mine[@]}" --many --out runs/gpus_n "${common[@]}" \
                > "runs/gpus_n_$i.log" 2>&1 &
            pids+=($!)
        done
        for i in "${!pids[@]}"; do
            wait "${pids[i]}" || { fail=1; echo "GPU $i's job failed:" >&2; tail -20 "runs/gpus_n_$i.log" >&2; }
        done
        cat runs/gpus_n_*.log >> "$log"
    fi
    t2=$(now)
    python3 - runs/gpus_1 runs/gpus_n "$t0" "$t1" "$t2" "$gpus" "$backend" "${FLEET_RTOL:-1e-2}" "$out/fleet.json" \
        "${inputs[@]}" <<'PY' | tee -a "$log"
import json, sys
from pathlib import Path
import numpy as np
one, many, t0, t1, t2, gpus, backend, rtol, out, *inputs = sys.argv[1:]
t0, t1, t2, gpus, rtol = float(t0), float(t1), float(t2), int(gpus), float(rtol)
names = sorted(Path(p).stem for p in inputs)
frames, worst, problems = 0, {}, []
for name in names:
    a, b = Path(one, name, "predictions.npz"), Path(many, name, "predictions.npz")
    if not (a.is_file() and b.is_file()):
        problems.append(f"{name}: predictions.npz missing ({'' if a.is_file() else '1 GPU '}{'' if b.is_file() else 'N GPUs'})")
        continue
    frames += json.loads(Path(one, name, "run.json").read_text())["frames"]
    with np.load(a) as x, np.load(b) as y:
        if set(x.files) != set(y.files):
            problems.append(f"{name}: arrays {sorted(x.files)} != {sorted(y.files)}")
        for key in set(x.files) & set(y.files):
            u, v = x[key], y[key]
            if u.shape != v.shape:
                problems.append(f"{name}/{key}: shape {u.shape} != {v.shape}")
                continue
            if not np.issubdtype(u.dtype, np.number):
                continue
            u, v = u.astype(np.float64), v.astype(np.float64)
            scale = max(float(np.abs(u).max(initial=0.0)), 1e-12)
            rel = float(np.abs(u - v).max(initial=0.0)) / scale
            worst[key] = max(worst.get(key, 0.0), rel)
            if not rel <= rtol:
                problems.append(f"{name}/{key}: largest difference {rel:.2e} of the largest value (> {rtol})")
single, multi = t1 - t0, t2 - t1
rate1, raten = len(names) / single, len(names) / multi
result = {
    "inputs": len(names), "stream_frames": frames, "gpus": gpus, "backend": backend,
    "one_gpu": {"seconds": single, "inputs_per_s": rate1, "stream_frames_per_s": frames / single},
    "n_gpus": {"seconds": multi, "inputs_per_s": raten, "stream_frames_per_s": frames / multi},
    "scaling_efficiency": raten / (gpus * rate1), "rtol": rtol, "worst_relative_difference": worst,
    "problems": problems, "equal": not problems,
}
Path(out).write_text(json.dumps(result, indent=2) + "\n")
print(f"1 GPU: {single:.1f} s, {rate1:.3f} inputs/s, {frames / single:.1f} stream-frames/s")
print(f"{gpus} GPUs ({backend}): {multi:.1f} s, {raten:.3f} inputs/s, {frames / multi:.1f} stream-frames/s; "
      f"scaling efficiency {result['scaling_efficiency']:.2f}")
print("worst relative difference per array:", json.dumps(worst))
print("outputs equal" if not problems else "OUTPUTS DIFFER:\n  " + "\n  ".join(problems[:20]))
sys.exit(0 if not problems else 3)
PY
    return $fail
}

train() {
    local steps=${TRAIN_STEPS:-12}
    local per_gpu=${PER_GPU_BATCH:-$(( (12 + gpus - 1) / gpus ))}
    local global=$(( per_gpu * gpus ))
    local flags=(--config "${RECIPE:-recipes/small.yaml}" --steps "$steps" --log-every 1 --checkpoint-every "$steps"
                 --no-resume --quiet --no-tensorboard --device "${TRAIN_DEVICE:-cuda}")
    rm -rf runs/train_1gpu runs/train_ngpu
    echo "== train: ${RECIPE:-recipes/small.yaml}, global batch $global, on 1 GPU" | tee -a "$log"
    CUDA_VISIBLE_DEVICES=0 python3 -m mapstream train "${flags[@]}" --batch-size "$global" --out runs/train_1gpu \
        2>&1 | tee -a "$log"
    echo "== train: $gpus GPUs x $per_gpu clips (torchrun, DDP)" | tee -a "$log"
    CUDA_VISIBLE_DEVICES=$all_gpus python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" -m mapstream train "${flags[@]}" \
        --batch-size "$per_gpu" --out runs/train_ngpu 2>&1 | tee -a "$log"
    cp runs/train_1gpu/metrics.jsonl "$out/train_1gpu.jsonl"
    cp runs/train_ngpu/metrics.jsonl "$out/train_ngpu.jsonl"
    python3 - runs/train_1gpu/metrics.jsonl runs/train_ngpu/metrics.jsonl "$gpus" "$global" "$out/train.json" <<'PY' \
        | tee -a "$log"
import json, statistics, sys
from pathlib import Path
one, many, gpus, batch, out = sys.argv[1:]
gpus, batch = int(gpus), int(batch)
def read(path):
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    step = statistics.mean(r["step_seconds"] for r in records[2:])
    return {"step_seconds": step, "samples_per_s": batch / step, "losses": [r["loss"] for r in records]}
a, b = read(one), read(many)
result = {"gpus": gpus, "global_batch": batch, "one_gpu": a, "n_gpus": b,
          "scaling_efficiency": b["samples_per_s"] / (gpus * a["samples_per_s"]),
          "largest_loss_difference": max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))}
Path(out).write_text(json.dumps(result, indent=2) + "\n")
for name, r in (("1 GPU", a), (f"{gpus} GPUs", b)):
    print(f"{name}: {r['step_seconds']:.3f} s/step, {r['samples_per_s']:.1f} samples/s; "
          f"losses {' '.join(f'{x:.4f}' for x in r['losses'])}")
print(f"scaling efficiency {result['scaling_efficiency']:.2f}; "
      f"largest loss difference {result['largest_loss_difference']:.2e}")
PY
}

fsdp() {
    echo "== fsdp: one step of lingbot-map on $gpus GPUs" | tee -a "$log"
    CUDA_VISIBLE_DEVICES=$all_gpus python3 -m torch.distributed.run --standalone --nproc_per_node="$gpus" "$here/train_step.py" \
        --preset lingbot-map --device cuda --precision bf16 --frames 8 --hw 294 518 --batch-size 1 --steps 3 \
        --checkpoint-layers --distributed fsdp --out "$out/fsdp_step.json" 2>&1 | tee -a "$log"
    python3 - "$out/fsdp_step.json" <<'PY' | tee -a "$log"
import json, sys
r = json.load(open(sys.argv[1]))
print("peak GiB per GPU:", [round(b / 2**30, 2) for b in r["peak_gpu_bytes_per_process"]],
      f"step {r['step_seconds']:.3f} s, losses {r['losses']}")
PY
}

case $part in
    fleet) fleet "${2:-}" ;;
    train) train ;;
    fsdp) fsdp ;;
esac
