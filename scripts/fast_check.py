"""The CUDA-graph fast path against the eager path on the same frames (full model, bf16),
then its throughput with the bench protocol. Usage: python scripts/fast_check.py [--out F]"""
from __future__ import annotations

import argparse
import json

import torch

from mapstream.bench import BenchConfig, build_bench_model, run_benchmark


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--frames", type=int, default=40)
    args = ap.parse_args()
    cfg = BenchConfig(fast=True, stage_breakdown=False)
    model = build_bench_model(cfg, torch.device("cuda"))
    g = torch.Generator().manual_seed(1)
    x = torch.rand(args.frames, 3, cfg.height, cfg.width, generator=g).cuda()
    outs = {}
    for fast in (False, True):
        with model.session(num_scale_frames=8, keyframe_interval=2, precision="bf16", fast=fast) as s:
            outs[fast] = s.run_frames(x)
    check = {
        key: max(rel(getattr(a, key), getattr(b, key)) for a, b in zip(outs[True], outs[False]))
        for key in ("pose_enc", "depth", "depth_conf")
    }
    check["finite"] = all(torch.isfinite(p.depth).all().item() for p in outs[True])
    print("fast vs eager (max over frames, relative L2):", json.dumps(check), flush=True)
    result = run_benchmark(cfg, model)
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"check": check, "bench": result}, f, indent=1)


if __name__ == "__main__":
    main()
