"""The experimental Gluon kernel (mapstream/attention/experimental/gluon_flash.py) against our Triton
kernel on the cache-attention shape of the benchmark protocol (CUDA sm90).

Checks first: several key ranges (tails, offsets, fewer keys than a tile) against fp32 SDPA,
with the output poisoned (NaN) before each call. Then an interleaved A/B, every variant
replayed from a CUDA graph with the key range in device memory.

Usage: python scripts/bench_gluon_attention.py [OUT.json] [--fixed]

--fixed: the kernels with each row's softmax reference point fixed from a key-norm bound
(`key_norm`): our Triton kernel's balanced grid, the Gluon kernel that keeps P @ V in
flight through the next softmax and the ping-pong kernel, against the first two with the
running max.
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


NQ, HEADS, DIM = 978, 16, 64
NK = 72 * 978 + 128 * 6  # 8 anchors + 64 window frames + 128 trajectory frames
LO = 978  # keyframe steps skip the spare slot
RANGES = [(LO, NK), (0, NK), (0, 100), (5, 133), (LO, LO + 130), (7, 71), (3, 4)]


def _problem():
    """q [H, Nq, D] strided as the block produces it, k and v [H, T, D], the output buffer."""
    torch.manual_seed(0)
    storage = torch.randn(2, HEADS, NK + 4000, DIM, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, NQ, 3, HEADS, DIM, device="cuda", dtype=torch.bfloat16)[0, :, 0].transpose(0, 1)
    return q, storage[0], storage[1], torch.empty(NQ, HEADS, DIM, device="cuda", dtype=torch.bfloat16)


def _check_and_time(problem, checked: dict, timed: dict, ranges, rounds: int, res: dict, out_path) -> None:
    """Each of `checked` (name -> fn(range tensor)) over `ranges` against fp32 SDPA with the
    output poisoned first; then `timed` at the protocol's range, interleaved graph replays."""
    q, k, v, out = problem
    res.setdefault("checks", {})
    for a, b in ranges:
        rng = torch.tensor([a, b], device="cuda", dtype=torch.int32)
        ref = F.scaled_dot_product_attention(q[None].float(), k[None, :, a:b].float(), v[None, :, a:b].float())[0]
        for name, fn in checked.items():
            out.fill_(float("nan"))
            got = fn(rng)
            torch.cuda.synchronize()
            err = float((got.float() - ref).norm() / ref.norm())
            res["checks"][f"{a}-{b}/{name}"] = err
            print(f"check keys [{a}, {b}) {name}: rel. error {err:.2e}", flush=True)
    rng = torch.tensor([LO, NK], device="cuda", dtype=torch.int32)
    graphs = {}
    for name, fn in timed.items():
        try:
            graphs[name] = captured(lambda fn=fn: fn(rng))
        except Exception as e:  # noqa: BLE001
            print(name, "failed:", str(e)[:300], flush=True)
    flops = 4 * NQ * (NK - LO) * HEADS * DIM
    res["us"] = interleaved({name: graph.replay for name, graph in graphs.items()}, rounds, flops=flops)
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)
    bad = {key: e for key, e in res["checks"].items() if not e < 1e-2}
    if bad:
        raise SystemExit(f"checks failed: {bad}")


def fixed_main(out_path=None, rounds=7):
    """--fixed (see the module docstring)."""
    from mapstream.attention.triton_flash import KernelConfig

    problem = q, k, v, out = _problem()
    bound = float(k.float().norm(dim=-1).max())
    balanced = KernelConfig(tma=True, balance=True)

    def gluon(**options):
        return lambda rng: gluon_flash_attention(q, k, v, rng, out=out, **options)

    checked = {"gluon_fixed_s3": gluon(key_norm=bound), "gluon_fixed_s4": gluon(stages=4, key_norm=bound),
               "gluon_fixed_s3_wait0": gluon(key_norm=bound, pv_in_flight=False),
               "pingpong_fixed_s2": lambda rng: pingpong_attention(q, k, v, rng, out=out, stages=2, key_norm=bound)}
    timed = {
        "triton_running": lambda rng: flash_attention(q, k, v, kv_range=rng, out=out, config=balanced),
        "triton_fixed": lambda rng: flash_attention(q, k, v, kv_range=rng, out=out, config=balanced, key_norm=bound),
        "gluon_running_s3": gluon(stages=3),
        **checked,
    }
    _check_and_time(problem, checked, timed, RANGES + [(0, 384), (0, 385)], rounds, {"key_norm": bound}, out_path)


def main(out_path=None, rounds=5):
    problem = q, k, v, out = _problem()

    def pingpong(stages):
        return lambda rng: pingpong_attention(q, k, v, rng, out=out, stages=stages)

    gluon_s3 = lambda rng: gluon_flash_attention(q, k, v, rng, out=out, stages=3)  # noqa: E731
    checked = {"pingpong_s2": pingpong(2), "pingpong_s3": pingpong(3), "pingpong_s4": pingpong(4), "s3": gluon_s3}
    timed = {"triton_tl": lambda rng: flash_attention(q, k, v, kv_range=rng, out=out), "gluon_s3": gluon_s3,
             "pingpong_s2": pingpong(2), "pingpong_s3": pingpong(3), "pingpong_s4": pingpong(4)}
    _check_and_time(problem, checked, timed, RANGES, rounds, {}, out_path)


if __name__ == "__main__":
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    (fixed_main if "--fixed" in sys.argv else main)(paths[0] if paths else None)
