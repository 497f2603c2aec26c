"""Run mapstream's Triton attention kernel on packed FP8 rows (`mapstream.cache.fp8`) under
Triton's CPU interpreter and print, as JSON, its relative error against float64 attention over
the same rows unpacked, for every grid and several key ranges (see test_attention_backends.py).
"""
from __future__ import annotations

import json

import torch

from interpret_triton_kernel import _numpy_compat


def main() -> None:
    _numpy_compat()
    from mapstream.attention.triton_flash import KernelConfig, flash_attention
    from mapstream.cache.fp8 import pack_rows, unpack_rows

    torch.manual_seed(0)
    heads, total, dim, n_q = 2, 200, 32, 21
    # Rows of very different magnitudes (each keeps its own scale), in a strided, offset arena.
    k = torch.randn(heads, total, dim) * torch.logspace(-1, 1, total).view(1, total, 1)
    v = torch.randn(heads, total, dim) * 3.0
    arena = torch.zeros(2, heads, total + 7, dim + 4, dtype=torch.uint8)
    arena[0, :, 3 : 3 + total], arena[1, :, 3 : 3 + total] = pack_rows(k), pack_rows(v)
    keys, values = arena[0, :, 3 : 3 + total], arena[1, :, 3 : 3 + total]
    k64, v64 = unpack_rows(keys, torch.float64), unpack_rows(values, torch.float64)
    q = torch.randn(heads, n_q, dim)
    configs = {
        "plain": KernelConfig(block_m=16, block_n=32),
        "tma_asked": KernelConfig(block_m=16, block_n=32, tma=True),  # packed rows are read through pointers
        "split3": KernelConfig(block_m=16, block_n=32, splits=3),
        "balanced_1_spare": KernelConfig(block_m=16, block_n=32, balance=True, slots=5),
    }
    report = {}
    for name, config in configs.items():
        for lo, hi in [(0, 200), (5, 77), (40, 41)]:
            for hinted in (False, True):
                repairs = torch.zeros(1, dtype=torch.int32)
                hint = dict(key_norm=float(k64.norm(dim=-1).max()), repairs=repairs) if hinted else {}
                out = flash_attention(q, keys, values, kv_range=torch.tensor([lo, hi], dtype=torch.int32),
                                      config=config, **hint)
                ref = torch.softmax(q.double() @ k64[:, lo:hi].transpose(1, 2) / dim**0.5, -1) @ v64[:, lo:hi]
                report[f"{name}/{lo}-{hi}/{'hint' if hinted else 'max'}"] = {
                    "err": float((out.double() - ref).norm() / ref.norm()), "shape": list(out.shape),
                    "repairs": int(repairs)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
