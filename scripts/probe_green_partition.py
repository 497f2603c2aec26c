"""Does a green-context stream confine a captured graph's kernels to its multiprocessors?

The DPT head alone (fp32, channels-last, as in the step), captured in a CUDA graph as the
whole step captures it: the capture forks onto the stream under test and joins back. If the
partition holds inside graphs, the head gets much slower on a stream of few SMs.

Usage (device): python3 scripts/probe_green_partition.py [--sms 16 64 112] [--out FILE.json]
"""
from __future__ import annotations

import argparse

import torch

from _probe import report
from _timing import timeit

from mapstream.fast.partition import sm_limited_stream
from mapstream.heads.dpt import DPTHead


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", type=int, nargs="*", default=[16, 64, 112])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    head = DPTHead(2048).cuda().eval().to(memory_format=torch.channels_last)
    layers = [torch.randn(1, 1, 978, 2048, device="cuda") for _ in range(4)]

    def step():
        with torch.no_grad():
            return head(layers, (378, 504), 6)

    def graph_on(stream):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            current = torch.cuda.current_stream()
            if stream is None:
                out = step()
            else:
                stream.wait_stream(current)
                with torch.cuda.stream(stream):
                    out = step()
                current.wait_stream(stream)
        return graph, out

    res = {}
    graph, want = graph_on(None)
    graph.replay()
    res["all SMs"] = {"us": timeit(graph.replay)}
    for n in args.sms:
        stream, got = sm_limited_stream(n, 0)
        graph, out = graph_on(stream)
        graph.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(a, b) for a, b in zip(out, want))
        res[f"{n} SMs asked"] = {"got_sms": got, "us": timeit(graph.replay), "same_outputs": same}
    report(res, args.out)


if __name__ == "__main__":
    main()
