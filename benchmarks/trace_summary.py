"""Where one streaming step's GPU time goes, from a Chrome trace written by
`profile_step.py --trace`.

The last step of the trace starts after the largest idle gap between the previous step's
last cache attention and this step's first. Printed, in ms: the cycle from the previous
step's first cache attention to this one's and how long the GPU was busy in it (the rest is
host time the GPU waited for); the step's span and kernel time; the part before the first
cache attention (patch embedding, first frame block); the trunk from the first to the last
cache attention (with the attention kernels' share); the heads after it, per CUDA stream
(they run side by side); and the kernels with the most time.

Usage: python benchmarks/trace_summary.py TRACE.json[.gz] [--attention REGEX] [--layers 24] [--top 15]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re

# The cache attention's kernel name: our Triton kernel, balanced or on the plain grid (a
# frame's attention over itself runs `_flash_fwd` alone and is not counted).
CACHE_ATTENTION = r"_flash_fwd_(balanced|tma)\b"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: str) -> list[dict]:
    """The GPU events of a trace (kernels, copies, memsets), in order of start."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])


def _end(event: dict) -> float:
    return event["ts"] + event["dur"]


def span(events: list[dict]) -> tuple[float, float, int]:
    """(ms from the first start to the last end, kernel ms summed, kernel count)."""
    return (max(map(_end, events)) - events[0]["ts"]) / 1e3, sum(e["dur"] for e in events) / 1e3, len(events)


def busy_ms(events: list[dict]) -> float:
    """ms in which at least one of `events` ran (kernels on several streams overlap)."""
    busy, covered_to = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e["ts"]):
        start = max(e["ts"], covered_to)
        if _end(e) > start:
            busy += _end(e) - start
        covered_to = max(covered_to, _end(e))
    return busy / 1e3


def short_name(name: str) -> str:
    """A kernel's name without template or call arguments, at most 70 characters."""
    return re.sub(r"\(.*", "", re.sub(r"<.*", "", name))[:70]


def _step_start(kernels: list[dict], previous_last: int, first: int) -> int:
    """Index of the step's first kernel: the one after the largest idle gap between the
    previous step's last cache attention and this step's first. Idle is measured from the
    latest end so far, since on two streams a kernel may end long before one started earlier."""
    gaps, covered_to = [], float("-inf")
    for i in range(previous_last, first):
        covered_to = max(covered_to, _end(kernels[i]))
        gaps.append((kernels[i + 1]["ts"] - covered_to, i + 1))
    return max(gaps)[1]


def summarize(kernels: list[dict], attention: str = CACHE_ATTENTION, layers: int = 24, top: int = 15) -> dict:
    """The parts of the last step of `kernels` (GPU events in order of start), `layers`
    cache attentions a step, each matched by the regular expression `attention`."""
    att = [i for i, e in enumerate(kernels) if re.search(attention, e["name"])]
    if len(att) < layers:
        raise ValueError(f"{len(att)} kernels match {attention!r}, fewer than one step's {layers}")
    first_att = att[-layers]
    has_previous = len(att) > layers
    lo = _step_start(kernels, att[-layers - 1], first_att) if has_previous else 0
    step = kernels[lo:]
    first, last = first_att - lo, att[-1] - lo
    cycle = None
    if len(att) >= 2 * layers:
        previous = kernels[att[-2 * layers] : first_att]
        cycle = ((kernels[first_att]["ts"] - previous[0]["ts"]) / 1e3, busy_ms(previous))
    heads = step[last + 1 :]
    trunk_end = _end(step[last])
    streams = collections.defaultdict(list)
    for e in heads:
        streams[e.get("args", {}).get("stream")].append(e)
    ms_by_name: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for e in step:
        ms_by_name[short_name(e["name"])] += e["dur"] / 1e3
        calls[short_name(e["name"])] += 1
    return {
        "cycle": cycle,
        "step": span(step),
        "before_first_attention": span(step[:first]) if first else None,
        "trunk": span(step[first : last + 1]),
        "attention_kernels_ms": sum(e["dur"] for e in step if re.search(attention, e["name"])) / 1e3,
        "attention_calls": layers,
        "heads": span(heads) if heads else None,
        # per stream: its span, and when its first kernel starts and its last ends after the
        # trunk's last attention
        "heads_by_stream": {
            str(sid): span(seg) + ((seg[0]["ts"] - trunk_end) / 1e3, (max(map(_end, seg)) - trunk_end) / 1e3)
            for sid, seg in streams.items()
        },
        "top": [(name, round(ms, 3), calls[name]) for name, ms in ms_by_name.most_common(top)],
    }


def _row(t: tuple) -> str:
    return f"{t[0]:7.3f} ms wall, {t[1]:7.3f} ms of kernels, {t[2]:5d} kernels"


def report(s: dict) -> str:
    """`summarize`'s result as the lines printed."""
    lines = []
    if s["cycle"]:
        wall, busy = s["cycle"]
        lines.append(f"cycle                   {wall:7.3f} ms, GPU busy {busy:7.3f} ms (idle {wall - busy:.3f} ms)")
    lines.append(f"step                    {_row(s['step'])}")
    if s["before_first_attention"]:
        lines.append(f"before first attention  {_row(s['before_first_attention'])}")
    lines.append(f"trunk                   {_row(s['trunk'])}  ({s['attention_kernels_ms']:.3f} ms in "
                 f"{s['attention_calls']} cache attentions)")
    if s["heads"]:
        lines.append(f"heads                   {_row(s['heads'])}")
        for sid, t in s["heads_by_stream"].items():
            lines.append(f"  stream {sid:>4}           {_row(t[:3])}, from +{t[3]:.3f} to +{t[4]:.3f} ms "
                         "after the last attention")
    lines.append("top kernels (ms, calls):")
    lines.extend(f"  {ms:8.3f} {n:5d}  {name}" for name, ms, n in s["top"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--attention", default=CACHE_ATTENTION, help="regular expression for the cache attention's kernel")
    ap.add_argument("--layers", type=int, default=24, help="cache attentions a step (the global blocks)")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    try:
        summary = summarize(load(args.trace), args.attention, args.layers, args.top)
    except ValueError as e:
        raise SystemExit(f"{args.trace}: {e}") from None
    print(report(summary))
    return summary


if __name__ == "__main__":
    main()
