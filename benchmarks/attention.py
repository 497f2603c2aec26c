"""Attention over the cache, alone: one frame's queries against a window of keys, through
every attention backend that can run here (the same interface the model calls), each
checked against fp32 attention and timed as the median of many calls.

Backends made for a few query rows run only when named (`--backends triton-rows`). Two
forms are timed: `attend` on keys/values that are views of the cache's [2, H, T, D]
storage, and `attend_range` over a key range [0, keys) of the whole capacity read from the
device (what a replayed CUDA graph calls). The default shape is the benchmark protocol's
global attention at 504x378 with a window of 64 frames: 978 queries, 16 heads of 64, 71,184
keys in a capacity of 77,696.

Usage: python benchmarks/attention.py [--backends triton sdpa ...] [--reps 50] [--out FILE]
       python benchmarks/attention.py --device cpu --dtype fp32 --queries 30 --keys 200 --capacity 256 (mechanism check)
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from mapstream.attention import BACKENDS, available_backends, select_backend
from mapstream.bench import write_result

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WARMUP_CALLS = 5
# Backends made for a few query rows (the camera head's); a frame's ~1k queries take them
# far longer than the others, so they run only when named.
FEW_ROWS_ONLY = ("triton-rows",)


def median_us(fn, device: torch.device, reps: int) -> float:
    """Median µs of `fn` over `reps` calls after a warm-up: CUDA events on a GPU, the host
    clock elsewhere."""
    for _ in range(WARMUP_CALLS):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) * 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
    return sorted(times)[len(times) // 2]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def measure(name: str, q, storage, keys: int, reps: int) -> dict:
    """One backend's error against fp32 attention and its time, for both forms."""
    backend = select_backend(name, q.device, q.dtype)
    k, v = storage[0:1, :, :keys], storage[1:2, :, :keys]
    key_range = torch.tensor([0, keys], device=q.device, dtype=torch.int32)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flop = 4 * q.shape[1] * q.shape[2] * keys * q.shape[3]
    row: dict = {"attend_rel_err": relative_error(backend.attend(q, k, v), ref)}
    row["attend_us"] = median_us(lambda: backend.attend(q, k, v), q.device, reps)
    row["attend_tflops"] = flop / row["attend_us"] / 1e6
    whole_k, whole_v = storage[0:1], storage[1:2]
    row["range_rel_err"] = relative_error(backend.attend_range(q, whole_k, whole_v, key_range), ref)
    row["range_us"] = median_us(lambda: backend.attend_range(q, whole_k, whole_v, key_range), q.device, reps)
    row["range_tflops"] = flop / row["range_us"] / 1e6
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--backends", nargs="*", default=None,
                    help=f"any of {', '.join(BACKENDS)} (default: every usable one made for a frame's queries)")
    ap.add_argument("--queries", type=int, default=978)
    ap.add_argument("--keys", type=int, default=71184)
    ap.add_argument("--capacity", type=int, default=77696, help="the storage's key slots (>= --keys)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = ap.parse_args(argv)
    if args.capacity < args.keys:
        ap.error("--capacity must be at least --keys")
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    unusable = {name: reasons for name, reasons in available_backends(device, dtype).items() if reasons}
    names = args.backends
    if names is None:
        names = [n for n in BACKENDS if n not in unusable and n not in FEW_ROWS_ONLY]
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, args.heads, args.queries, args.dim, device=device, generator=g).to(dtype)
    # The cache's layout: keys and values of every slot side by side, [2, H, capacity, D].
    storage = torch.randn(2, args.heads, args.capacity, args.dim, device=device, generator=g).to(dtype)
    result: dict = {"shape": {k: getattr(args, k) for k in ("queries", "keys", "capacity", "heads", "dim")},
                    "device": str(device), "dtype": args.dtype, "backends": {}}
    with torch.no_grad():
        for name in names:
            if name in unusable:
                result["backends"][name] = {"unusable": unusable[name]}
            else:
                result["backends"][name] = measure(name, q, storage, args.keys, args.reps)
            print(json.dumps({name: result["backends"][name]}), flush=True)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == "__main__":
    main()
