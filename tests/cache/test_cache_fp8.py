"""FP8 cache rows: e4m3 values with a scale per row, packed as bytes; what they keep of a
key or value, and a stream whose cache stores them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mapstream
from mapstream.cache.fp8 import FP8_MAX, pack_rows, packed_width, unpack_rows


def test_a_row_keeps_its_largest_value_and_every_value_within_e4m3s_rounding():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, 64, generator=g) * torch.logspace(-3, 3, 50).view(1, 50, 1)  # rows of any magnitude
    x[0, 0] = 0.0
    rows = pack_rows(x)
    assert rows.dtype == torch.uint8 and rows.shape == (3, 50, packed_width(64)) == (3, 50, 68)
    back = unpack_rows(rows, torch.float32)
    assert torch.equal(back[0, 0], torch.zeros(64))  # a zero row stays zero
    amax = x.abs().amax(-1, keepdim=True)
    scale = amax / FP8_MAX
    # e4m3 keeps 3 mantissa bits: a normal value (>= 2^-6 of its scale) within 2^-4 of itself,
    # a subnormal one within half its spacing (2^-10 of the scale).
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)
    assert ((back - x).abs() <= bound).all()
    np_max = x.abs().argmax(-1, keepdim=True)
    torch.testing.assert_close(back.gather(-1, np_max), x.gather(-1, np_max), rtol=1e-6, atol=0)
    # Each row's own scale: a row a million times smaller is kept as finely.
    rel = ((back - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-30))[1:]
    assert rel.max() < 0.05


def test_packed_rows_read_the_same_through_any_view():
    x = torch.randn(2, 5, 7, 16)
    rows = pack_rows(x)
    strided = torch.zeros(2, 5, 9, packed_width(16), dtype=torch.uint8)
    strided[:, :, 1:8] = rows
    view = strided[:, :, 1:8]
    assert not view.is_contiguous()
    assert torch.equal(unpack_rows(view, torch.float32), unpack_rows(rows, torch.float32))
    assert torch.equal(unpack_rows(rows[..., 3:5, :].transpose(0, 1), torch.float64),
                       unpack_rows(rows, torch.float64)[..., 3:5, :].transpose(0, 1))
    with pytest.raises(TypeError, match="uint8"):
        unpack_rows(x, torch.float32)


def test_a_stream_with_an_fp8_cache_stores_half_of_bf16_and_predicts_close_to_the_plain_one():
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    frames = torch.rand(24, 3, 28, 42, generator=torch.Generator().manual_seed(1))
    preds, held = {}, {}
    for kv_dtype in ("auto", "fp8"):
        with model.session(num_scale_frames=2, sliding_window=4, trajectory_capacity=4, kv_dtype=kv_dtype) as s:
            preds[kv_dtype] = [p for f in frames for p in s.step(f)] + s.flush()
            stats = s.state.aggregator.stats()
            held[kv_dtype] = stats.bytes_held
            assert stats.trajectory_frames == 4  # frames were evicted and thinned
            camera = s.state.camera.stats()
    head_dim = model.config.head_dim
    # The CPU's plain cache is fp32 (4 bytes a value); FP8 keeps 1 a value and 4 a row.
    assert held["fp8"] * 4 * head_dim == held["auto"] * packed_width(head_dim)
    assert camera.bytes_held > 0  # the camera head's cache keeps the trunk's precision
    assert len(preds["fp8"]) == len(preds["auto"]) == 24
    for a, b in zip(preds["fp8"], preds["auto"]):
        assert (a.depth - b.depth).norm() / b.depth.norm() < 0.02
        assert (a.pose_enc - b.pose_enc).norm() / b.pose_enc.norm() < 0.05
    assert not all(torch.equal(a.depth, b.depth) for a, b in zip(preds["fp8"], preds["auto"]))


def test_the_gpu_unpacking_kernel_writes_the_range_as_unpack_rows_and_nothing_else_interpreted():
    """The kernel that unpacks the visible range for attention, under Triton's CPU interpreter:
    float32 and float16 results equal `unpack_rows` bit for bit; bfloat16 within one bf16
    step (the interpreter rounds to bf16 by truncation, the GPU to nearest: tests/gpu checks
    the bits there); rows outside the range are written as zeros."""
    pytest.importorskip("triton")
    from conftest import run_interpreted

    report = run_interpreted(Path(__file__).with_name("interpret_fp8_unpack.py"))
    assert len(report) == 3 * 6
    for name, result in report.items():
        assert result["outside_zero"] and result["returned_ok"], name
        if name.startswith("torch.bfloat16"):
            assert result["inside_error"] <= 2.0**-7, name
        else:
            assert result["inside_equal"], name
