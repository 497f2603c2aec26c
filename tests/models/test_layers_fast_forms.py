"""Layers with a faster form on CUDA: the DPT head's bilinear resize (F.interpolate on CPU,
our Triton kernel on CUDA, whose arithmetic is checked here under Triton's CPU interpreter
and compiled in tests/gpu), the q/k/v heads (split, per-head LayerNorm and RoPE in one
kernel on CUDA; likewise checked here and in tests/gpu) and the ViT's patchify as a matrix
product."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mapstream.layers import resize_bilinear


def test_cpu_resize_is_interpolate_plus_the_addend():
    x = torch.randn(2, 3, 5, 7).to(memory_format=torch.channels_last)
    add = torch.randn(3, 11, 4)
    want = F.interpolate(x, size=(11, 4), mode="bilinear", align_corners=True)
    assert torch.equal(resize_bilinear(x, (11, 4)), want)
    assert torch.equal(resize_bilinear(x, (11, 4), add=add), want + add)
    with pytest.raises(ValueError, match=r"needs x \[N, C, H, W\]"):
        resize_bilinear(torch.randn(3, 5, 7), (4, 4))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_resize_kernel_matches_interpolate_interpreted():
    script = Path(__file__).with_name("interpret_resize_kernel.py")
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 8
    for case, row in report.items():
        assert row["err"] < 1e-5 and row["err_add"] < 1e-5, (case, row)
        assert row["shape_ok"] and row["format_kept"], (case, row)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_qkv_heads_kernel_matches_norm_and_rope_interpreted():
    """2D (rotate-half, two axes) and 3D (interleaved) RoPE, per-stream tables, norm or RoPE
    alone, head dims 16 and 64, token counts off the tile size; fp32 to float rounding,
    bf16 to one unit in the last place, with the intermediates rounded to bf16 (the modules
    in bf16) or kept fp32 (autocast). Triton 3.6–3.9's interpreter rounds fp32 to bf16
    toward zero where the GPU rounds to nearest: the reference rounds as the interpreter
    does, checked at run time."""
    script = Path(__file__).with_name("interpret_heads_kernel.py")
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(report) == 21
    for case, row in report.items():
        for part, r in row.items():
            assert r["shape_ok"] and r["dtype_ok"], (case, part, r)
            if "float32" in case:
                assert r["max_abs"] < 1e-5, (case, part, r)
            else:
                assert r["max_ulps"] <= 1.0, (case, part, r)
        assert row["v"]["max_abs"] == 0.0, case


def test_patchify_as_a_matrix_product_equals_the_strided_convolution():
    """The ViT's patch embedding runs its 14x14 stride-14 convolution as one product of
    flattened patches and kernel (faster on CUDA); same function, same checkpoint weights."""
    from mapstream.layers.vit import _ConvPatchify

    torch.manual_seed(0)
    for patch, dim, (h, w) in [(14, 64, (28, 42)), (14, 32, (14, 14)), (7, 16, (21, 35))]:
        m = _ConvPatchify(patch, dim)
        x = torch.rand(3, 3, h, w)
        want = m.proj(x).flatten(2).transpose(1, 2)
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
        assert set(m.state_dict()) == {"proj.weight", "proj.bias"}
