"""What the cache attention costs in energy, by tile configuration and by query count.

Under the protocol the H200 holds its 700 W power cap and lowers its SM clock (`probe_clocks.py`,
docs/BENCHMARKS.md session 22); the cache attention alone, back to back, draws the full
700 W. So the step's speed under the protocol follows its energy a frame, and work that costs
energy without adding output (tiles of padded query rows: 978 queries fill 16 row blocks of
64, the last with 18 rows) slows it even where the GPU would otherwise hide the time.

At the protocol's shape (16 heads, 71,232 keys normalized as after a LayerNorm, head dim 64, the
fixed reference point from the key-norm bound, one CUDA graph of 10 calls) this times and
meters (NVML's energy counter over ≈ 2 s of replays):
- `--configs`: tile configurations (64x128 with 4 warps, as the step; 128-row blocks of 8 warps);
- `--wide-rows`: row blocks of 128 and 256 queries (K/V tiles read from L2 half or a quarter as
  often; loading them is ≈ 0.06 J of a call's ≈ 0.43, `probe_energy_parts.py`), with the
  registers capped so that two programs of 8 warps share a multiprocessor (session 23: none
  costs less energy than the default);
- `--pingpong`: the experimental Gluon ping-pong kernel (128 rows a program, 1 a multiprocessor:
  half the K/V reads of the default), with the running max and with the fixed reference point;
- `--queries`: the default configuration at 960, 978 and 1,024 queries (15, 16 and 16 full row
  blocks): what the padded rows of the last row block cost.

Usage (device, from scripts/): python3 probe_energy.py [--configs] [--wide-rows] [--pingpong] [--queries] [--out FILE.json]
"""
from __future__ import annotations

import argparse

import torch

from _probe import energy, energy_reader, report
from _timing import timeit

from mapstream.attention.triton_flash import KernelConfig, flash_attention

HEADS, KEYS, DIM = 16, 71_232, 64


def measure(nvml, q, k, v, config: KernelConfig, key_norm: float) -> dict:
    """µs and J a call (graph of 10 calls), TFLOP/s, and the error against fp32 SDPA."""
    return measure_call(nvml, q, k, v, lambda: flash_attention(q, k, v, config=config, key_norm=key_norm))


def measure_call(nvml, q, k, v, call) -> dict:
    """`measure` of any attention call over q, k, v (all keys)."""
    try:
        got = call()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                call()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # a configuration the compiler or the GPU refuses
        return {"error": repr(exc)[:300]}
    us = timeit(graph.replay, reps=20) / 10
    e = energy(nvml, graph.replay)
    e["J_per_call"] = round(e["J_per_call"] / 10, 5)
    e["us_per_call"] = round(e["us_per_call"] / 10, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flops = 4 * q.shape[0] * q.shape[1] * k.shape[1] * q.shape[2]
    return {"us": round(us, 1), "TFLOP_s": round(flops / us / 1e6, 1), "energy": e,
            "max_abs_err_vs_fp32": float((got.float() - want).abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", action="store_true")
    parser.add_argument("--wide-rows", action="store_true")
    parser.add_argument("--pingpong", action="store_true")
    parser.add_argument("--queries", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    nvml = energy_reader()
    k = torch.nn.functional.layer_norm(torch.randn(HEADS, KEYS, DIM, device="cuda"), (DIM,)).to(torch.bfloat16)
    v = torch.randn(HEADS, KEYS, DIM, device="cuda", dtype=torch.bfloat16)
    key_norm = float(k.float().norm(dim=-1).max()) * 1.01
    q_all = torch.randn(HEADS, 1024, DIM, device="cuda", dtype=torch.bfloat16)
    res: dict = {}
    if args.configs:
        configs = {
            "64x128 w4 s3 (default)": KernelConfig(tma=True, balance=True),
            "128x128 w8 s2": KernelConfig(block_m=128, block_n=128, num_warps=8, num_stages=2, tma=True,
                                          balance=True, programs_per_sm=1),
            "128x64 w8 s3": KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, tma=True,
                                         balance=True, programs_per_sm=1),
        }
        for name, config in configs.items():
            res[f"config {name}"] = row = measure(nvml, q_all[:, :978], k, v, config, key_norm)
            print(name, row, flush=True)
    if args.wide_rows:
        wide = {
            "64x128 w4 s3 (default)": KernelConfig(tma=True, balance=True),
            "128x64 w8 s2 r128, 2/SM": KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=2, maxnreg=128,
                                                     tma=True, balance=True),
            "128x64 w8 s3 r128, 2/SM": KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, maxnreg=128,
                                                     tma=True, balance=True),
            "128x128 w8 s2 r128, 2/SM": KernelConfig(block_m=128, block_n=128, num_warps=8, num_stages=2, maxnreg=128,
                                                      tma=True, balance=True),
            "256x64 w16 s2 r128, 1/SM": KernelConfig(block_m=256, block_n=64, num_warps=16, num_stages=2, maxnreg=128,
                                                      tma=True, balance=True, programs_per_sm=1),
        }
        for rounds in range(2):
            for name, config in wide.items():
                row = measure(nvml, q_all[:, :978], k, v, config, key_norm)
                res.setdefault(f"wide {name}", []).append(row)
                print(name, row, flush=True)
    if args.pingpong:
        from mapstream.attention.experimental.gluon_pingpong import pingpong_attention

        q = q_all[:, :978]
        rng = torch.tensor([0, KEYS], device="cuda", dtype=torch.int32)
        calls = {"64x128 w4 s3 (default)": lambda: flash_attention(q, k, v, config=KernelConfig(tma=True, balance=True),
                                                                   key_norm=key_norm)}
        for stages in (2, 3, 4):
            calls[f"pingpong s{stages}"] = lambda st=stages: pingpong_attention(q, k, v, rng, stages=st)
            calls[f"pingpong s{stages} fixed"] = lambda st=stages: pingpong_attention(q, k, v, rng, stages=st,
                                                                                     key_norm=key_norm)
        for rounds in range(2):
            for name, call in calls.items():
                row = measure_call(nvml, q, k, v, call)
                res.setdefault(f"pingpong {name}", []).append(row)
                print(name, row, flush=True)
    if args.queries:
        for rounds in range(2):  # twice, interleaved: the clock drifts with the GPU's heat
            for n_q in (960, 978, 1024):
                row = measure(nvml, q_all[:, :n_q], k, v, KernelConfig(tma=True, balance=True), key_norm)
                res.setdefault(f"queries {n_q}", []).append(row)
                print(n_q, row, flush=True)
    report(res, args.out)


if __name__ == "__main__":
    main()
