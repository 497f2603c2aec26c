"""Variants of the graphed step, interleaved frame by frame in one process.

Arms (all the benchmark's model, whole-step graphs, fp32 heads unless --heads bf16):
- `pad`: compiled as before session 16 (Inductor pads the products' rows to a multiple of 8);
- `nopad`: compiled with `shape_padding=False`, fc2's reduction not split;
- `split`: as `nopad`, with fc2's reduction split in two halves (`layers.split_linear`, the
  default since session 17; the module's switch is set before each arm's step, and matters
  while the arm compiles and captures its graphs);
(Session 16 also had arms with the dense heads on a green-context stream confined to part of
the multiprocessors, commits 69ae6f1 and 0cb1ecf; no gain, removed: docs/BENCHMARKS.md.)
Each arm is its own session; every frame is stepped by every arm, the order rotating, and
steady frames 100-200 are timed as the protocol does (CUDA events, synchronize after each
frame). Each arm's outputs are compared with the first arm's at the same frame.

Usage (device): python3 scripts/probe_step_variants.py [--heads fp32|bf16] [--arms nopad,split]
                [--conv-heuristics]
                [--out FILE.json]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import traceback

import torch

import mapstream.fast as fast_module
import mapstream.layers.split_linear as split_module
from _probe import report
from mapstream.bench import BenchConfig, _frames, build_bench_model
from mapstream.fast.graphs import GraphedStep
from mapstream.models.compile import compile_model


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--heads", default="fp32")
    parser.add_argument("--arms", default="nopad,split", help="comma-separated, of pad, nopad, split")
    parser.add_argument("--conv-heuristics", action="store_true",
                        help="every arm takes cuDNN's heuristic convolution kernels (GraphedStep conv_search=False)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = BenchConfig(backend="triton", fast=True, heads_precision=args.heads, stage_breakdown=False)
    device = torch.device("cuda")
    # Arms share the blocks' compiled code (one cache entry per arm and phase): room for all.
    torch._dynamo.config.recompile_limit = 64
    arms = {}
    for name in args.arms.split(","):
        if name not in ("pad", "nopad", "split"):
            parser.error(f"unknown arm {name!r}")
        model = compile_model(build_bench_model(cfg, device), shape_padding=name == "pad")
        model.set_backend(cfg.backend)
        arms[name] = model
    frames = _frames(cfg, device)
    sessions = {name: model.session(num_scale_frames=cfg.scale_frames, precision=cfg.precision, fast=True)
                for name, model in arms.items()}
    times: dict[str, list[float]] = {name: [] for name in arms}
    errors: dict[str, dict[str, float]] = {name: {"pose": 0.0, "depth": 0.0} for name in arms}
    failed: dict[str, str] = {}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(arms)
    for rep in range(2):  # the first pass warms up (captures, compiles)
        for name in names:
            sessions[name].reset()
        for i in range(cfg.scale_frames + cfg.stream_frames):
            shift = i % len(names)
            first_pred = None
            for name in names[shift:] + names[:shift]:
                if name in failed:
                    continue
                fast_module.GraphedStep = functools.partial(
                    GraphedStep, conv_search=not args.conv_heuristics)
                split_module.enabled = name == "split"
                try:
                    torch.cuda.synchronize()
                    start.record()
                    preds = sessions[name].step(frames[i])
                    end.record()
                    torch.cuda.synchronize()
                except Exception:  # an arm the driver cannot run is reported, not fatal
                    failed[name] = traceback.format_exc(limit=6)
                    print(f"{name} failed at frame {i}:\n{failed[name]}", flush=True)
                    continue
                if rep == 1 and i >= cfg.steady_from:
                    times[name].append(start.elapsed_time(end))
                if preds and i >= cfg.scale_frames:
                    pred = preds[-1]
                    if first_pred is None:
                        first_pred = pred
                    else:
                        for key, a, b in (("pose", pred.pose_enc, first_pred.pose_enc), ("depth", pred.depth, first_pred.depth)):
                            rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
                            errors[name][key] = max(errors[name][key], rel)
                    assert torch.isfinite(pred.pose_enc).all() and torch.isfinite(pred.depth).all()
    for session in sessions.values():
        session.close()
    res = {name: {"mean_ms": statistics.fmean(ts), "median_ms": statistics.median(ts), "frames": len(ts),
                  "max_rel_vs_another_arm": errors[name]}
           for name, ts in times.items() if ts}
    res["failed"] = failed
    res["heads"] = args.heads
    res["conv_search"] = not args.conv_heuristics
    report(res, args.out)


if __name__ == "__main__":
    main()
