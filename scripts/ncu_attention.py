"""One call of a cache-attention kernel at the benchmark shape, for Nsight Compute.

Usage (device): ncu --clock-control none -k regex:KERNEL -s 3 -c 1 --set full \\
                    python3 scripts/ncu_attention.py [triton[:flag,...]|gluon|pingpong]
KERNEL: _flash_fwd (triton, the default), _gluon_flash_fwd / _pingpong_fwd for the
experimental Gluon kernels; `triton:tree_max,wide_sum` turns KernelConfig flags on. Runs
the kernel four times (the first three warm up and are skipped by -s 3). For per-line stall
reasons add `--import-source yes` and open the report's source page (the ping-pong kernel's
overlap problem, docs/BENCHMARKS.md session 4).
"""
from __future__ import annotations

import sys
from dataclasses import replace

import torch


def main(kernel: str = "triton") -> None:
    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    nk = 72 * 978 + 128 * 6
    lo = 978
    storage = torch.randn(2, heads, nk + 4000, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, nq, 3, heads, d, device="cuda", dtype=torch.bfloat16)[0, :, 0].transpose(0, 1)
    rng = torch.tensor([lo, nk], device="cuda", dtype=torch.int32)
    if kernel.split(":")[0] == "triton":
        from mapstream.attention.triton_flash import default_config, flash_attention

        # "triton:tree_max,wide_sum" switches KernelConfig flags on over the default.
        flags = [f for f in kernel.partition(":")[2].split(",") if f]
        config = replace(default_config(q.device), **{f: True for f in flags})

        def call():
            flash_attention(q, storage[0], storage[1], kv_range=rng, config=config)
    elif kernel == "gluon":
        from mapstream.attention.experimental.gluon_flash import gluon_flash_attention

        def call():
            gluon_flash_attention(q, storage[0], storage[1], rng, stages=3)
    elif kernel == "pingpong":
        from mapstream.attention.experimental.gluon_pingpong import pingpong_attention

        def call():
            pingpong_attention(q, storage[0], storage[1], rng, stages=4)
    else:
        raise SystemExit(f"unknown kernel {kernel!r}: triton, gluon or pingpong")
    for _ in range(4):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(*sys.argv[1:2])
