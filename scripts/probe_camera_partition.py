"""How many multiprocessors does the camera head's fp32 chain need, and would the heads' tail
shrink if the two heads each had their own part of the GPU?

The step's tail (the heads after the trunk) takes ≈ 2.5 ms with fp32 heads: the camera head's
chain of one-row products (3.2 GB of fp32 weights a frame) beside the DPT head's convolutions,
each ≈ 1.1-1.5 ms alone (docs/BENCHMARKS.md, sessions 13 and 16). Session 16 confined the DPT
head to 96-120 SMs with the camera head free on all: no gain. What it did not measure is how
fast the camera chain runs on a few SMs alone, i.e. how much memory bandwidth a multiprocessor
can draw with our row kernel. This probe times, each captured in a CUDA graph (median of 50
replays):

- the camera trunk's product chain as the step runs it (4 passes x 4 blocks of
  `norm_linear` q/k/v, `linear_residual` projection, `norm_linear` fc1 + GELU,
  `linear_residual` fc2; one row, fp32; the attention and the small per-pass work left out):
  alone on all SMs and alone on N SMs (a green context);
- the DPT head (fp32, channels-last, TF32 convolutions as in the step) alone on all SMs and on
  the other 132 - N;
- both together: on two ordinary streams (the step's arrangement) and split N / 132 - N.

With ``--configs``, the row kernel's launch settings are varied instead (rows a program,
chunk bytes, warps),
each timed alone on all SMs and on the first ``--sms`` count, beside the DPT head on all SMs
(the step's arrangement) and split with it.

Usage (device): python3 scripts/probe_camera_partition.py [--sms 16 24 32 48] [--configs] [--out FILE.json]
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from _partition import sm_partition
from _probe import report
from _timing import timeit

from mapstream.heads.dpt import DPTHead
from mapstream.layers import row_linear
from mapstream.layers.row_linear import linear_residual, norm_linear

DIM, PASSES, BLOCKS = 2048, 4, 4
# (rows a program, chunk bytes, warps). Session 20 also had the first weight chunk requested
# after the LayerNorm's statistics as an arm (a kernel flag, since removed: before them won).
CONFIGS = [(4, 2048, 4), (2, 2048, 4), (8, 2048, 4), (4, 4096, 4), (8, 4096, 8), (16, 2048, 8)]


class TrunkBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.ls1, self.ls2 = nn.Parameter(torch.full((DIM,), 0.1)), nn.Parameter(torch.full((DIM,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = norm_linear(x, self.norm1, self.qkv)[..., 2 * DIM:]  # the values stand in for the attention's output
        x = linear_residual(v, self.proj, x, self.ls1)
        return linear_residual(norm_linear(x, self.norm2, self.fc1, gelu=True), self.fc2, x, self.ls2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", type=int, nargs="*", default=[16, 24, 32, 48])
    parser.add_argument("--configs", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.allow_tf32 = True
    blocks = nn.ModuleList(TrunkBlock() for _ in range(BLOCKS)).cuda().eval()
    weight_bytes = PASSES * sum(p.numel() * 4 for p in blocks.parameters())
    token = torch.randn(1, 1, DIM, device="cuda")
    dpt = DPTHead(DIM).cuda().eval().to(memory_format=torch.channels_last)
    layers = [torch.randn(1, 1, 978, DIM, device="cuda") for _ in range(4)]

    def camera():
        x = token
        for _ in range(PASSES):
            for block in blocks:
                x = block(x)
        return x

    def dense():
        return dpt(layers, (378, 504), 6)

    def graph_of(works):
        """One graph running each (stream or None = a plain side stream, fn) forked from the
        capture stream and joined back: the works run side by side."""
        with torch.no_grad():
            for _, fn in works:
                fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                current = torch.cuda.current_stream()
                streams = [s if s is not None else torch.cuda.Stream() for s, _ in works]
                for stream, (_, fn) in zip(streams, works):
                    stream.wait_stream(current)
                    with torch.cuda.stream(stream):
                        fn()
                for stream in streams:
                    current.wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def time_of(works) -> float:
        return round(timeit(graph_of(works).replay), 1)

    res = {"camera_weight_bytes_per_frame": weight_bytes}
    if args.configs:
        (part, got), (rest, others) = sm_partition(args.sms[0])
        want = None
        for config in CONFIGS:
            row_linear._BLOCK_N, row_linear._CHUNK_BYTES, row_linear._NUM_WARPS = config
            with torch.no_grad():
                out = camera()
            want = out if want is None else want
            alone = time_of([(None, camera)])
            res[f"rows {config[0]}, {config[1]} B, {config[2]} warps"] = row = {
                "camera_us": alone, "camera_TB_s": round(weight_bytes / alone / 1e6, 2),
                f"camera_on_{got}_us": time_of([(part, camera)]),
                "beside_dpt_us": time_of([(None, camera), (None, dense)]),
                f"split_{got}_{others}_us": time_of([(part, camera), (rest, dense)]),
                "max_abs_diff_vs_first": float((out - want).abs().max()),
            }
            print(config, row, flush=True)
        report(res, args.out)
        return
    alone = time_of([(None, camera)])
    res["all SMs"] = {
        "camera_us": alone, "camera_TB_s": round(weight_bytes / alone / 1e6, 2),
        "dpt_us": time_of([(None, dense)]), "both_side_by_side_us": time_of([(None, camera), (None, dense)]),
    }
    for n in args.sms:
        (part, got), (rest, others) = sm_partition(n)
        cam = time_of([(part, camera)])
        res[f"{got} / {others} SMs"] = {
            "camera_us": cam, "camera_TB_s": round(weight_bytes / cam / 1e6, 2),
            "dpt_us": time_of([(rest, dense)]), "both_split_us": time_of([(part, camera), (rest, dense)]),
        }
        print(res[f"{got} / {others} SMs"], flush=True)
    report(res, args.out)


if __name__ == "__main__":
    main()
