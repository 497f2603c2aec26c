"""One call of the Triton cache-attention kernel at the benchmark shape, for Nsight Compute.

Usage (device): ncu --clock-control none -k regex:_flash_fwd -s 3 -c 1 --section ... \\
                    python3 scripts/ncu_attention.py
Runs the default configuration four times (the first three warm up / are skipped by -s 3).
"""
from __future__ import annotations

import torch

from mapstream.attention.triton_flash import flash_attention


def main() -> None:
    torch.manual_seed(0)
    nq, heads, d = 978, 16, 64
    nk = 72 * 978 + 128 * 6
    lo = 978
    storage = torch.randn(2, heads, nk + 4000, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, nq, 3, heads, d, device="cuda", dtype=torch.bfloat16)[0, :, 0].transpose(0, 1)
    rng = torch.tensor([lo, nk], device="cuda", dtype=torch.int32)
    for _ in range(4):
        flash_attention(q, storage[0], storage[1], kv_range=rng)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
