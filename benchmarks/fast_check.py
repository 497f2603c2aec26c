"""The fast path against the eager path on the same frames: one session of each streams the
same random frames (keyframe interval 2, so both stored and unstored steps are compared) and
the largest relative L2 difference over frames is reported per output; on a GPU the fast
path's throughput under the bench protocol follows.

On a GPU the fast path replays CUDA graphs; on a CPU it runs the same single-frame step
without capturing one, which checks the step's wiring but not the graphs.

Usage: python benchmarks/fast_check.py [--frames 40] [--fast true|pieces|whole] [--out FILE]
       python benchmarks/fast_check.py --device cpu --preset tiny --size 56x42 --frames 8 (mechanism check)
"""
from __future__ import annotations

import argparse
import json

import torch

import mapstream
from mapstream.bench import BenchConfig, build_bench_model, run_benchmark, write_result

PROTOCOL = BenchConfig()  # the defaults of the flags it shares with `mapstream bench`

OUTPUTS = ("pose_enc", "depth", "depth_conf")


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _fast_option(text: str) -> bool | str:
    return True if text == "true" else text


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--fast", type=_fast_option, default=True, choices=[True, "pieces", "whole"],
                    help="true (the session's choice), pieces or whole")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=PROTOCOL.preset)
    ap.add_argument("--size", default=f"{PROTOCOL.width}x{PROTOCOL.height}", help="WxH")
    ap.add_argument("--scale-frames", type=int, default=PROTOCOL.scale_frames)
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.split("x"))
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    cfg = BenchConfig(preset=args.preset, width=width, height=height, scale_frames=args.scale_frames,
                      device=args.device, precision=precision, fast=args.fast, stage_breakdown=False)
    model = build_bench_model(cfg, device)
    g = torch.Generator().manual_seed(1)
    frames = torch.rand(args.frames, 3, height, width, generator=g).to(device)
    preds = {}
    for fast in (False, args.fast):
        with mapstream.Session(model, num_scale_frames=args.scale_frames, keyframe_interval=2,
                               precision=precision, fast=fast) as session, torch.no_grad():
            preds[fast] = session.run_frames(frames)
    fast_preds, eager_preds = preds[args.fast], preds[False]
    check: dict = {name: max(_relative_error(getattr(a, name), getattr(b, name)) for a, b in zip(fast_preds, eager_preds))
                   for name in OUTPUTS}
    check["frames"] = len(fast_preds)
    check["finite"] = all(bool(torch.isfinite(p.depth).all()) for p in fast_preds)
    print("fast vs eager (largest over frames, relative L2):", json.dumps(check), flush=True)
    result: dict = {"check": check}
    if device.type == "cuda":
        bench = run_benchmark(cfg, model)
        # The configuration is this script's options; the kept predictions are tensors.
        result["bench"] = {k: v for k, v in bench.items() if k not in ("config", "_samples")}
        print(json.dumps(result["bench"], indent=1), flush=True)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()
