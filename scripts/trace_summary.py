"""Where one streaming step's GPU time goes, from a trace written by `profile_step.py --trace`.

Takes the last step of the trace (from the largest idle gap between the previous step's
last cache attention and this step's first) and prints, in ms: the cycle from the previous
step's first cache attention to this one's with the time the GPU was busy in it (what is left
is host time the GPU waited for, e.g. between steps); the step's span and kernel time;
the part before the first cache attention (patch embedding, first frame block); the trunk
from the first to the last cache attention (the attention kernels' share apart); the heads
after it, per CUDA stream (they run side by side); and the kernels with the most time.

Usage: python scripts/trace_summary.py TRACE.json[.gz] [--attention REGEX] [--layers 24] [--top 15]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(gpu, key=lambda e: e["ts"])


def _span(seg: list[dict]) -> tuple[float, float, int]:
    """(wall ms from the first start to the last end, kernel ms summed, kernel count)."""
    end = max(e["ts"] + e["dur"] for e in seg)
    return (end - seg[0]["ts"]) / 1e3, sum(e["dur"] for e in seg) / 1e3, len(seg)


def _busy_ms(seg: list[dict]) -> float:
    """ms in which at least one of the kernels in `seg` ran (streams overlap)."""
    busy, end = 0.0, float("-inf")
    for e in sorted(seg, key=lambda e: e["ts"]):
        start, stop = max(e["ts"], end), e["ts"] + e["dur"]
        if stop > start:
            busy += stop - start
        end = max(end, stop)
    return busy / 1e3


def _short(name: str) -> str:
    return re.sub(r"\(.*", "", re.sub(r"<.*", "", name))[:70]


# The cache attention's kernel: balanced (the sm90 default since session 10) or the plain grid.
CACHE_ATTENTION = r"_flash_fwd_(balanced|tma)\b"


def summarize(path: str, attention: str = CACHE_ATTENTION, layers: int = 24, top: int = 15) -> dict:
    kernels = _load(path)
    att = [i for i, e in enumerate(kernels) if re.search(attention, e["name"])]
    if len(att) < layers:
        raise SystemExit(f"{len(att)} {attention!r} kernels in {path}, fewer than one step's {layers}")
    per_step = layers
    first_att = att[-per_step]
    prev_att = att[-per_step - 1] if len(att) > per_step else None
    lo = 0
    if prev_att is not None:
        # The step starts after the largest idle gap since the previous step's last attention:
        # idle against the latest end so far (on two streams a kernel may end long before
        # another that started earlier).
        idle, end = [], float("-inf")
        for i in range(prev_att, first_att):
            end = max(end, kernels[i]["ts"] + kernels[i]["dur"])
            idle.append((kernels[i + 1]["ts"] - end, i + 1))
        lo = max(idle)[1]
    step = kernels[lo:]
    first, last = first_att - lo, att[-1] - lo
    cycle = None
    if prev_att is not None and len(att) >= 2 * per_step:
        seg = kernels[att[-2 * per_step] : first_att]
        cycle = ((kernels[first_att]["ts"] - seg[0]["ts"]) / 1e3, _busy_ms(seg))
    out = {
        "cycle": cycle,
        "step": _span(step),
        "before_first_attention": _span(step[:first]),
        "trunk": _span(step[first : last + 1]),
        "attention_kernels_ms": sum(e["dur"] for e in step if re.search(attention, e["name"])) / 1e3,
        "attention_calls": per_step,
        "heads": _span(step[last + 1 :]) if last + 1 < len(step) else None,
        "heads_by_stream": {},
    }
    streams = collections.defaultdict(list)
    for e in step[last + 1 :]:
        streams[e.get("args", {}).get("stream")].append(e)
    trunk_end = step[last]["ts"] + step[last]["dur"]
    for sid, seg in streams.items():
        # + when the stream's first kernel starts and its last ends, after the last attention
        out["heads_by_stream"][str(sid)] = _span(seg) + (
            (seg[0]["ts"] - trunk_end) / 1e3, (max(e["ts"] + e["dur"] for e in seg) - trunk_end) / 1e3)
    by_name = collections.Counter()
    calls = collections.Counter()
    for e in step:
        by_name[_short(e["name"])] += e["dur"] / 1e3
        calls[_short(e["name"])] += 1
    out["top"] = [(n, round(ms, 3), calls[n]) for n, ms in by_name.most_common(top)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--attention", default=CACHE_ATTENTION,
                    help="regex for the cache-attention kernel's name (the frames' own attention runs _flash_fwd)")
    ap.add_argument("--layers", type=int, default=24, help="cache attentions a step (global blocks)")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    s = summarize(args.trace, args.attention, args.layers, args.top)
    fmt = lambda t: f"{t[0]:7.3f} ms wall, {t[1]:7.3f} ms of kernels, {t[2]:5d} kernels"  # noqa: E731
    if s["cycle"]:
        print(f"cycle                   {s['cycle'][0]:7.3f} ms, GPU busy {s['cycle'][1]:7.3f} ms "
              f"(idle {s['cycle'][0] - s['cycle'][1]:.3f} ms)")
    print(f"step                    {fmt(s['step'])}")
    print(f"before first attention  {fmt(s['before_first_attention'])}")
    print(f"trunk                   {fmt(s['trunk'])}  ({s['attention_kernels_ms']:.3f} ms in "
          f"{s['attention_calls']} cache attentions)")
    if s["heads"]:
        print(f"heads                   {fmt(s['heads'])}")
        for sid, t in s["heads_by_stream"].items():
            print(f"  stream {sid:>4}           {fmt(t[:3])}, from +{t[3]:.3f} to +{t[4]:.3f} ms after the last attention")
    print("top kernels (ms, calls):")
    for name, ms, n in s["top"]:
        print(f"  {ms:8.3f} {n:5d}  {name}")


if __name__ == "__main__":
    main()
