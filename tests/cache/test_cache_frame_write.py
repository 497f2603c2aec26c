"""A step's K/V write into a cache layer (`mapstream.cache.frame_write`): PyTorch's copies on
CPU, our Triton kernel on CUDA (checked here under Triton's CPU interpreter; on the GPU in
tests/gpu)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from conftest import run_interpreted
from mapstream.cache.frame_write import _kernel_takes, write_frame_kv


@pytest.mark.parametrize("device_index", [False, True])
def test_write_stores_k_and_v_at_the_start_and_nothing_else(device_index):
    kv = torch.randn(2, 3, 20, 8)
    k, v = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    want = kv.clone()
    want[0, :, 7:12], want[1, :, 7:12] = k, v
    write_frame_kv(kv, k, v, torch.arange(7, 12) if device_index else 7)
    assert torch.equal(kv, want)


def test_write_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"cannot write k \[3, 5, 8\], v \[3, 5, 8\] into a layer of shape \[2, 4, 20, 8\]"):
        write_frame_kv(torch.zeros(2, 4, 20, 8), torch.zeros(3, 5, 8), torch.zeros(3, 5, 8), 0)
    with pytest.raises(ValueError, match="cannot write"):
        write_frame_kv(torch.zeros(2, 3, 20, 8), torch.zeros(3, 5, 8), torch.zeros(3, 4, 8), 0)


def test_kernel_takes_unit_strides_power_of_two_dims_and_full_index_tensors():
    kv, k = torch.zeros(2, 3, 20, 8), torch.zeros(3, 5, 8)
    assert _kernel_takes(kv, k, k, 3) and _kernel_takes(kv, k, k, torch.arange(3, 8))
    assert not _kernel_takes(kv, k, k, torch.arange(3, 7))  # not one index a token
    assert not _kernel_takes(kv, k, k, torch.arange(3, 8).float())
    assert not _kernel_takes(kv, k, k.half(), 3)
    odd = torch.zeros(2, 3, 20, 6)
    assert not _kernel_takes(odd, torch.zeros(3, 5, 6), torch.zeros(3, 5, 6), 3)
    assert not _kernel_takes(kv, torch.zeros(3, 8, 5).transpose(1, 2), k, 3)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_write_kernel_matches_the_copies_interpreted():
    """Int and device-tensor starts, one token to a whole arena, strided sources (views of a
    q/k/v projection), a layer view of a stacked storage (the other layers untouched), bf16,
    and fp32 sources into bf16 storage (rounded; the interpreter rounds toward zero where the
    GPU and PyTorch round to nearest, so that case is allowed one unit)."""
    report = run_interpreted(Path(__file__).with_name("interpret_frame_write.py"))
    assert len(report) == 12
    for case, row in report.items():
        assert row["other_layers_untouched"], case
        if row["rounds"]:
            assert row["max_units"] <= 1.0, (case, row)
        else:
            assert row["equal"], (case, row)
