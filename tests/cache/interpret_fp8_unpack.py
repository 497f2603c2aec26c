"""Run the cache's FP8 unpacking kernel (`mapstream.cache.fp8_kernel`) under Triton's CPU
interpreter and print, as JSON, for several key ranges and result types: whether the rows in
the range equal `unpack_rows` bit for bit (and their largest relative difference), whether
every row outside it was written as zeros, and whether the result is the `out` given (or, with
none given, a new tensor of every row).
Started by test_cache_fp8.py in a fresh process with TRITON_INTERPRET=1."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "attention"))
from interpret_triton_kernel import _numpy_compat  # noqa: E402


def main() -> None:
    _numpy_compat()
    from mapstream.cache.fp8 import pack_rows, unpack_rows
    from mapstream.cache.fp8_kernel import unpack_range

    torch.manual_seed(0)
    heads, total, dim = 3, 150, 32
    x = torch.randn(heads, total, dim) * torch.logspace(-3, 3, total).view(1, total, 1)
    arena = torch.zeros(2, heads, total + 9, dim + 4, dtype=torch.uint8)
    arena[1, :, 5 : 5 + total] = pack_rows(x)
    rows = arena[1, :, 5 : 5 + total]  # a strided, offset view, as the cache hands out
    report = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        want = unpack_rows(rows, dtype)
        for lo, hi in [(0, 150), (7, 70), (64, 65), (149, 150), (30, 30)]:
            out = torch.full((heads, total, dim), float("nan"), dtype=dtype)
            in_memory = (lo + hi) % 2 == 0  # the range as a tensor (read by the kernel) or as ints
            kv_range = torch.tensor([lo, hi], dtype=torch.int32) if in_memory else (lo, hi)
            returned = unpack_range(rows, kv_range, dtype, out=out)
            outside = torch.cat((out[:, :lo], out[:, hi:]), dim=1)
            report[f"{dtype}/{lo}-{hi}"] = {
                "inside_equal": bool(torch.equal(out[:, lo:hi], want[:, lo:hi])),
                "inside_error": float(((out[:, lo:hi].float() - want[:, lo:hi].float()).abs()
                                       / want[:, lo:hi].float().abs().clamp_min(1e-30)).max()) if hi > lo else 0.0,
                "outside_zero": bool((outside == 0).all()),
                "returned_ok": returned is out,
            }
        fresh = unpack_range(rows, torch.tensor([0, total], dtype=torch.int32), dtype)
        report[f"{dtype}/fresh"] = {"inside_equal": bool(torch.equal(fresh, want)), "outside_zero": True,
                                    "inside_error": float(((fresh.float() - want.float()).abs()
                                                           / want.float().abs().clamp_min(1e-30)).max()),
                                    "returned_ok": list(fresh.shape) == [heads, total, dim]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
