"""The DPT head alone at the protocol's frame (fp32, channels-last, TF32 convolutions as the
reference runs them): how fast it is, which convolution kernels cuDNN picks, and whether
cuDNN's benchmark mode (try every algorithm once per shape, keep the fastest) picks faster
ones than its heuristics.

The head's convolutions are ≈ 209 GFLOP a frame at 504x378; the session-15 profile had them
at 1.11 ms (≈ 190 TFLOP/s against the H200's ≈ 495 dense TF32). Each arm runs in its own
process (cuDNN keeps its choices per shape for the process's life), captured in a CUDA graph
as the session captures it, and reports the graph's median replay and the kernels of one
replay under the profiler.

Usage (device): python3 scripts/probe_dpt_convs.py [--benchmark] [--compile] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch

from _probe import report
from _timing import captured, timeit

from mapstream.heads.dpt import DPTHead


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--benchmark", action="store_true", help="cuDNN benchmark mode while warming up")
    parser.add_argument("--compile", action="store_true", help="the head's frames pass through torch.compile")
    parser.add_argument("--size", default="504x378")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    torch.backends.cudnn.benchmark = args.benchmark
    torch.manual_seed(0)
    head = DPTHead(2048).cuda().eval().to(memory_format=torch.channels_last)
    if args.compile:
        head._forward_frames = torch.compile(head._forward_frames, dynamic=False)
    tokens = 6 + (height // 14) * (width // 14)
    layers = [torch.randn(1, 1, tokens, 2048, device="cuda") for _ in range(4)]

    def step():
        with torch.no_grad():
            return head(layers, (height, width), 6)

    for _ in range(3):
        step()
    graph = captured(step)
    times = [timeit(graph.replay, reps=50) for _ in range(5)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name].append(event.device_time_total)
    rows = sorted(((sum(v), len(v), name) for name, v in kernels.items()), reverse=True)
    res = {
        "benchmark": args.benchmark, "compile": args.compile, "size": args.size,
        "graph_us_rounds": times, "graph_us_median": statistics.median(times),
        "kernels_us_total": sum(r[0] for r in rows),
        "kernels": [{"us": round(t, 1), "calls": n, "name": name[:120]} for t, n, name in rows[:25]],
    }
    report(res, args.out)


if __name__ == "__main__":
    main()
