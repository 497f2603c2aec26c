"""Argument checks shared by our Triton attention kernels (`triton_flash`, `triton_rows`)."""
from __future__ import annotations

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q [H, Nq, D], k/v [H, T, D], D a power of two from 16 to 256, unit last strides."""
    heads, _, dim = q.shape
    if k.shape[0] != heads or v.shape[:2] != k.shape[:2] or k.shape[2] != dim or v.shape[2] != dim:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if dim not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim {dim} is not supported (needs a power of two from 16 to 256)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride in its last dimension")


def key_bounds(k: torch.Tensor, kv_range: torch.Tensor | tuple[int, int] | None) -> tuple[bool, int, int]:
    """(range read from device memory?, lo, hi) for a kernel call over keys of k [H, T, D]:
    a tensor range is read by the kernel (lo = hi = 0 here), None means all T keys."""
    if isinstance(kv_range, torch.Tensor):
        return True, 0, 0
    if kv_range is None:
        return False, 0, k.shape[1]
    lo, hi = int(kv_range[0]), int(kv_range[1])
    if not 0 <= lo < hi <= k.shape[1]:
        raise ValueError(f"key range {(lo, hi)} is empty or outside the {k.shape[1]} keys")
    return False, lo, hi
