"""The experimental Gluon kernel (mapstream/attention/experimental/gluon_flash.py) against our Triton
kernel on the cache-attention shape of the benchmark protocol (CUDA sm90).

Checks first: several key ranges (tails, offsets, fewer keys than a tile) against fp32 SDPA,
with the output poisoned (NaN) before each call. Then an interleaved A/B, every variant
replayed from a CUDA graph with the key range in device memory.

Usage: python scripts/bench_gluon_attention.py [OUT.json] [--fixed]

--fixed: the kernels with each row's softmax reference point fixed from a key-norm bound
(`key_norm`): our Triton kernel's balanced grid and the Gluon kernel that keeps P @ V in
flight through the next softmax, against both with the running max.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from _timing import captured, interleaved
from mapstream.attention.experimental.gluon_flash import gluon_flash_attention
from mapstream.attention.experimental.gluon_pingpong import pingpong_attention
from mapstream.attention.triton_flash import flash_attention


def fixed_main(out_path=None, rounds=7):
    """--fixed (see the module docstring)."""
    from mapstream.attention.triton_flash import KernelConfig

    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    nk = 72 * 978 + 128 * 6
    lo = 978
    flops = 4 * nq * (nk - lo) * heads * d
    storage = torch.randn(2, heads, nk + 4000, d, device="cuda", dtype=torch.bfloat16)
    k, v = storage[0], storage[1]
    q = torch.randn(1, nq, 3, heads, d, device="cuda", dtype=torch.bfloat16)[0, :, 0].transpose(0, 1)
    bound = float(k.float().norm(dim=-1).max())
    res = {"checks": {}, "us": {}, "key_norm": bound}
    out = torch.empty(nq, heads, d, device="cuda", dtype=torch.bfloat16)
    balanced = KernelConfig(tma=True, balance=True)
    for a, b in [(lo, nk), (0, nk), (0, 100), (5, 133), (lo, lo + 130), (7, 71), (3, 4), (0, 384), (0, 385)]:
        rng = torch.tensor([a, b], device="cuda", dtype=torch.int32)
        ref = F.scaled_dot_product_attention(q[None].float(), k[None, :, a:b].float(), v[None, :, a:b].float())[0]
        for name, fn in (("gluon_fixed_s3", lambda: gluon_flash_attention(q, k, v, rng, out=out, key_norm=bound)),
                         ("gluon_fixed_s4", lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=4, key_norm=bound)),
                         ("gluon_fixed_s3_wait0", lambda: gluon_flash_attention(q, k, v, rng, out=out, key_norm=bound,
                                                                                pv_in_flight=False))):
            out.fill_(float("nan"))
            got = fn()
            torch.cuda.synchronize()
            err = float((got.float() - ref).norm() / ref.norm())
            res["checks"][f"{a}-{b}/{name}"] = err
            print(f"check keys [{a}, {b}) {name}: rel. error {err:.2e}", flush=True)
    rng = torch.tensor([lo, nk], device="cuda", dtype=torch.int32)
    variants = {
        "triton_running": lambda: flash_attention(q, k, v, kv_range=rng, out=out, config=balanced),
        "triton_fixed": lambda: flash_attention(q, k, v, kv_range=rng, out=out, config=balanced, key_norm=bound),
        "gluon_running_s3": lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=3),
        "gluon_fixed_s3": lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=3, key_norm=bound),
        "gluon_fixed_s4": lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=4, key_norm=bound),
        "gluon_fixed_s3_wait0": lambda: gluon_flash_attention(q, k, v, rng, out=out, key_norm=bound, pv_in_flight=False),
    }
    graphs = {}
    for name, fn in variants.items():
        try:
            graphs[name] = captured(fn)
        except Exception as e:  # noqa: BLE001
            print(name, "failed:", str(e)[:300], flush=True)
    res["us"] = interleaved({name: graph.replay for name, graph in graphs.items()}, rounds, flops=flops)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    bad = {k: e for k, e in res["checks"].items() if not e < 1e-2}
    if bad:
        raise SystemExit(f"checks failed: {bad}")


def main(out_path=None, rounds=5):
    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    nk = 72 * 978 + 128 * 6
    lo = 978
    flops = 4 * nq * (nk - lo) * heads * d
    storage = torch.randn(2, heads, nk + 4000, d, device="cuda", dtype=torch.bfloat16)
    k, v = storage[0], storage[1]
    q = torch.randn(1, nq, 3, heads, d, device="cuda", dtype=torch.bfloat16)[0, :, 0].transpose(0, 1)
    res = {"checks": {}, "us": {}}
    out = torch.empty(nq, heads, d, device="cuda", dtype=torch.bfloat16)
    for a, b in [(lo, nk), (0, nk), (0, 100), (5, 133), (lo, lo + 130), (7, 71), (3, 4)]:
        rng = torch.tensor([a, b], device="cuda", dtype=torch.int32)
        ref = F.scaled_dot_product_attention(q[None].float(), k[None, :, a:b].float(), v[None, :, a:b].float())[0]
        for name, fn in (("pingpong_s2", lambda: pingpong_attention(q, k, v, rng, out=out, stages=2)),
                         ("pingpong_s3", lambda: pingpong_attention(q, k, v, rng, out=out, stages=3)),
                         ("pingpong_s4", lambda: pingpong_attention(q, k, v, rng, out=out, stages=4)),
                         ("s3", lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=3))):
            out.fill_(float("nan"))
            got = fn()
            torch.cuda.synchronize()
            err = float((got.float() - ref).norm() / ref.norm())
            res["checks"][f"{a}-{b}/{name}"] = err
            print(f"check keys [{a}, {b}) {name}: rel. error {err:.2e}", flush=True)
    rng = torch.tensor([lo, nk], device="cuda", dtype=torch.int32)
    variants = {
        "triton_tl": lambda: flash_attention(q, k, v, kv_range=rng, out=out),
        "gluon_s3": lambda: gluon_flash_attention(q, k, v, rng, out=out, stages=3),
        "pingpong_s2": lambda: pingpong_attention(q, k, v, rng, out=out, stages=2),
        "pingpong_s3": lambda: pingpong_attention(q, k, v, rng, out=out, stages=3),
        "pingpong_s4": lambda: pingpong_attention(q, k, v, rng, out=out, stages=4),
    }
    graphs = {}
    for name, fn in variants.items():
        try:
            graphs[name] = captured(fn)
        except Exception as e:  # noqa: BLE001
            print(name, "failed:", str(e)[:300], flush=True)
    res["us"] = interleaved({name: graph.replay for name, graph in graphs.items()}, rounds, flops=flops)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    bad = {k: e for k, e in res["checks"].items() if not e < 1e-2}
    if bad:
        raise SystemExit(f"checks failed: {bad}")


if __name__ == "__main__":
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    (fixed_main if "--fixed" in sys.argv else main)(paths[0] if paths else None)
