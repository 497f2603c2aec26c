"""Layers with a faster form on CUDA: the DPT head's bilinear resize (F.interpolate on CPU,
our Triton kernel on CUDA, whose arithmetic is checked here under Triton's CPU interpreter
and compiled in tests/gpu), the q/k/v heads (split, per-head LayerNorm and RoPE in one
kernel on CUDA; likewise checked here and in tests/gpu) and the ViT's patchify as a matrix
product."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import run_interpreted
from mapstream.layers import resize_bilinear
from mapstream.layers.resize import SeparableAddend


def test_cpu_resize_is_interpolate_plus_the_addend():
    x = torch.randn(2, 3, 5, 7).to(memory_format=torch.channels_last)
    add = torch.randn(3, 11, 4)
    want = F.interpolate(x, size=(11, 4), mode="bilinear", align_corners=True)
    assert torch.equal(resize_bilinear(x, (11, 4)), want)
    assert torch.equal(resize_bilinear(x, (11, 4), add=add), want + add)
    with pytest.raises(ValueError, match=r"needs x \[N, C, H, W\]"):
        resize_bilinear(torch.randn(3, 5, 7), (4, 4))
    # A separable addend: channels 0-1 vary along x only, channel 2 along y only.
    tables = SeparableAddend(torch.randn(4, 2), torch.randn(11, 1))
    dense = tables.dense()
    assert dense.shape == (3, 11, 4)
    assert torch.equal(dense[:2], tables.cols.t()[:, None].expand(2, 11, 4))
    assert torch.equal(dense[2], tables.rows[:, 0, None].expand(11, 4))
    assert torch.equal(resize_bilinear(x, (11, 4), add=tables), want + dense)
    with pytest.raises(ValueError, match=r"separable addend of \(3, 11, 4\).*resized to \(11, 5\)"):
        resize_bilinear(x, (11, 5), add=tables)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_resize_kernel_matches_interpolate_interpreted():
    report = run_interpreted(Path(__file__).with_name("interpret_resize_kernel.py"))
    assert len(report) == 8
    for case, row in report.items():
        assert row["err"] < 1e-5 and row["err_add"] < 1e-5 and row["err_separable"] < 1e-5, (case, row)
        assert row["shape_ok"] and row["format_kept"], (case, row)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_qkv_heads_kernel_matches_norm_and_rope_interpreted():
    """2D (rotate-half, two axes) and 3D (interleaved) RoPE, per-stream tables, norm or RoPE
    alone, head dims 16 to 128, token counts off the tile size; fp32 to float rounding, bf16
    within one unit of the row's largest normed value (a LayerNorm result may round the
    other way when the two statistics differ in fp32's last bits) and nearly all elements
    within one unit of their own, with the intermediates rounded to bf16 (the modules in
    bf16) or kept fp32 (autocast). Triton 3.6–3.9's interpreter rounds fp32 to bf16
    toward zero where the GPU rounds to nearest: the reference rounds as the interpreter
    does, checked at run time."""
    report = run_interpreted(Path(__file__).with_name("interpret_heads_kernel.py"))
    assert len(report) == 30
    for case, row in report.items():
        for part, r in row.items():
            assert r["shape_ok"] and r["dtype_ok"], (case, part, r)
            if "float32" in case:
                assert r["max_abs"] < 1e-5, (case, part, r)
            else:
                assert r["max_units_of_row"] <= 1.0 and r["beyond_own_unit"] < 1e-2, (case, part, r)
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


def test_qkv_heads_kernel_takes_what_it_computes():
    """Which calls the fused kernel would take (on CUDA), decided without the device: the
    other cases keep the PyTorch composition."""
    import dataclasses

    from torch import nn

    from mapstream.layers import patch_positions_2d, rope2d
    from mapstream.layers.heads import _kernel_takes

    heads, dim, tokens = 2, 16, 10
    qkv = torch.randn(1, tokens, 3 * heads * dim)
    norm = nn.LayerNorm(dim)
    rotary = rope2d(patch_positions_2d(3, 3, 1, torch.device("cpu")), dim)
    assert _kernel_takes(qkv, heads, norm, norm, rotary)
    assert _kernel_takes(qkv, heads, norm, norm, None)
    assert _kernel_takes(qkv, heads, None, None, rotary)
    assert _kernel_takes(qkv.bfloat16(), heads, norm, norm, rotary)  # fp32 LayerNorm weights are read as such
    assert not _kernel_takes(qkv, heads, None, None, None)  # nothing to fuse: views
    assert not _kernel_takes(qkv, heads, norm, None, rotary)
    assert not _kernel_takes(qkv.double(), heads, norm, norm, rotary)
    assert not _kernel_takes(torch.randn(1, tokens, 3 * heads * 24), heads, nn.LayerNorm(24), nn.LayerNorm(24), None)
    assert not _kernel_takes(torch.randn(1, tokens, 3 * heads * 8), heads, nn.LayerNorm(8), nn.LayerNorm(8), None)
    assert not _kernel_takes(qkv, heads, nn.LayerNorm(dim, elementwise_affine=False), norm, rotary)
    assert not _kernel_takes(qkv, heads, nn.LayerNorm(dim, bias=False), norm, rotary)
    assert not _kernel_takes(qkv.transpose(1, 2).contiguous().transpose(1, 2), heads, norm, norm, rotary)
    short = rope2d(patch_positions_2d(2, 2, 1, torch.device("cpu")), dim)  # 5 rows for 10 tokens
    assert not _kernel_takes(qkv, heads, norm, norm, short)
    # Per-stream tables [B, 1, N, D/2]: one per batch row, or one for all.
    stacked = lambda n: dataclasses.replace(  # noqa: E731
        rotary, cos=rotary.cos.expand(n, 1, -1, -1).contiguous(), sin=rotary.sin.expand(n, 1, -1, -1).contiguous())
    two = torch.randn(2, tokens, 3 * heads * dim)
    assert _kernel_takes(two, heads, norm, norm, stacked(2))
    assert _kernel_takes(two, heads, norm, norm, stacked(1))
    assert not _kernel_takes(two, heads, norm, norm, stacked(3))


def test_one_stacked_rotation_table_broadcasts_over_the_batch():
    """A [1, 1, N, D/2] table serves every batch row (batch stride 0), never reads past itself."""
    from mapstream.layers.heads import _table_strides

    table = torch.randn(1, 1, 10, 8)
    assert _table_strides(table, 10) == (0, 8)
    assert _table_strides(torch.randn(3, 1, 10, 8), 10) == (80, 8)
    assert _table_strides(torch.randn(10, 8), 10) == (0, 8)
    assert _table_strides(torch.randn(10, 8), 9) is None


def test_conv_epilogue_on_cpu_is_the_composition():
    """Off CUDA, `conv_epilogue` is relu?(conv(x) + adds...) computed by PyTorch, bit for bit."""
    from torch import nn

    from mapstream.layers.conv_epilogue import conv_epilogue

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 3, 3, padding=1)
    x = torch.randn(2, 4, 5, 6)
    a, b = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 5, 6)
    assert torch.equal(conv_epilogue(conv, x), conv(x))
    assert torch.equal(conv_epilogue(conv, x, adds=(a,), relu=True), F.relu(conv(x) + a))
    assert torch.equal(conv_epilogue(conv, x, adds=(a, b)), (conv(x) + a) + b)


def test_conv_epilogue_kernel_takes_plain_2d_convolutions_of_one_dtype():
    from torch import nn

    from mapstream.layers.conv_epilogue import _kernel_takes

    x = torch.randn(1, 4, 5, 6)
    assert _kernel_takes(nn.Conv2d(4, 3, 3, padding=1), x)
    assert _kernel_takes(nn.ConvTranspose2d(4, 3, 2, stride=2), x)
    assert _kernel_takes(nn.Conv2d(4, 3, 1, bias=False).bfloat16(), x.bfloat16())
    assert not _kernel_takes(nn.Conv2d(4, 3, 3, padding=1, padding_mode="reflect"), x)
    assert not _kernel_takes(nn.Conv2d(4, 3, 3, padding="same"), x)
    assert not _kernel_takes(nn.Conv2d(4, 3, 3).bfloat16(), x)  # fp32 input, bf16 weights
    assert not _kernel_takes(nn.Conv1d(4, 3, 3), torch.randn(1, 4, 5))
    assert not _kernel_takes(nn.Conv2d(4, 3, 3).double(), x.double())


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_conv_epilogue_kernel_matches_the_composition_interpreted():
    """Bias (or none), zero to two addends, ReLU or not, after 3x3, strided, 1x1 and transposed
    convolutions, NCHW and channels-last, fp32 and bf16: the kernel's output keeps the map's
    layout and stays as close to a float64 evaluation as PyTorch's composition does (fp32:
    1e-6 of the largest value; bf16: one unit of it; the interpreter rounds toward zero)."""
    report = run_interpreted(Path(__file__).with_name("interpret_conv_epilogue.py"))
    assert len(report) == 64
    for case, row in report.items():
        assert row["layout_ok"] and row["kept_format"], case
        bound = 1e-6 if "float32" in case else 2.0**-7
        assert row["kernel_err"] <= bound and row["composition_err"] <= bound, (case, row)


def test_dpt_head_routes_every_biased_convolution_through_the_epilogue(monkeypatch):
    """Where the kernels may serve, 27 of the DPT head's 28 biased convolutions run without
    their bias and hand bias, residuals and ReLU to the epilogue, and the last (1x1, to depth
    and confidence) goes with both activations to the output kernel (each stood in for here by
    the same arithmetic in PyTorch); the head's outputs equal the plain head's."""
    from mapstream.heads.dpt import DPTHead
    from mapstream.layers import conv_epilogue as ce
    from mapstream.layers import output_head as oh

    torch.manual_seed(0)
    head = DPTHead(64, features=16, out_channels=(8, 16, 32, 32), head_features=8).eval()
    layers = [torch.randn(1, 2, 6 + 4 * 5, 64) for _ in range(4)]
    with torch.no_grad():
        want = head(layers, (56, 70), 6)
    launched = []

    def stand_in(y, bias, adds, relu):
        launched.append(len(adds))
        out = y + bias.view(1, -1, 1, 1) if bias is not None else y
        for a in adds:
            out = out + a
        return F.relu(out) if relu else out

    outputs = []

    def output_stand_in(conv, h):
        outputs.append(conv)
        logits = conv(h).permute(0, 2, 3, 1)
        return torch.exp(logits[..., :-1]), 1 + torch.exp(logits[..., -1])

    for module in (ce, oh):
        monkeypatch.setattr(module, "our_kernels_may_serve", lambda t: True)
    monkeypatch.setattr(ce, "_launch", stand_in)
    monkeypatch.setattr(oh, "_launch", output_stand_in)
    with torch.no_grad():
        got = head(layers, (56, 70), 6)
    # Both frames in one chunk: 27 passes; the residual units' second convolutions carry their
    # skip (4) and, in the three fusion blocks with a skip input, the running map too (3).
    assert len(launched) == 27 and launched.count(1) == 4 and launched.count(2) == 3, launched
    assert outputs == [head.scratch.output_conv2[2]]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_conv_epilogue_falls_back_to_pytorch_when_the_layouts_differ(monkeypatch):
    """An addend whose strides differ from the convolution's output (here NCHW against a
    channels-last map) is added by PyTorch after its own bias add: same values, no kernel."""
    from torch import nn

    from mapstream.layers import conv_epilogue as ce

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 3, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 5, 6).to(memory_format=torch.channels_last)
    a = torch.randn(2, 3, 5, 6)  # NCHW
    monkeypatch.setattr(ce, "our_kernels_may_serve", lambda t: True)
    monkeypatch.setattr(ce, "_launch", lambda *args: pytest.fail("the kernel was launched"))
    got = ce.conv_epilogue(conv, x, adds=(a,), relu=True)
    torch.testing.assert_close(got, F.relu(conv(x) + a), rtol=1e-6, atol=1e-6)
    # A convolution without bias, addends or ReLU has no epilogue at all.
    plain = nn.Conv2d(4, 3, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    torch.testing.assert_close(ce.conv_epilogue(plain, x), plain(x), rtol=1e-6, atol=1e-6)


def test_layer_norm_bound_holds_for_any_input_and_is_nearly_reached():
    """The key-norm hint of the cache attention: no LayerNorm output (then rotated by RoPE,
    which keeps norms) is longer than `layer_norm_bound`; an input whose variance sits in the
    feature of the largest weight comes within a few percent of it."""
    from mapstream.layers import layer_norm_bound, rope2d, patch_positions_2d

    torch.manual_seed(0)
    dim = 64
    norm = torch.nn.LayerNorm(dim, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim) * 0.5 + 1.0)
        norm.bias.copy_(torch.randn(dim) * 0.1)
    bound = layer_norm_bound(norm)
    want = dim ** 0.5 * float(norm.weight.detach().abs().max()) + float(norm.bias.detach().norm())
    assert bound == pytest.approx(want, rel=1e-6)
    x = torch.cat([torch.randn(500, dim) * 10.0, torch.randn(500, dim) * 1e-3])
    spike = torch.full((1, dim), -1.0)
    spike[0, int(norm.weight.abs().argmax())] = dim - 1.0  # all variance in the largest weight's feature
    x = torch.cat([x, spike * 3.0])
    with torch.no_grad():
        y = norm(x)
    rotary = rope2d(patch_positions_2d(1, x.shape[0] - 1, 1, x.device), dim, 100.0)
    rotated = rotary.apply(y[None, None])[0, 0]
    assert float(y.norm(dim=-1).max()) <= bound
    assert float(rotated.norm(dim=-1).max()) <= bound * (1 + 1e-6)
    assert float(y[-1].norm()) >= 0.9 * bound
    norm.bias = None
    assert layer_norm_bound(norm) == pytest.approx(dim ** 0.5 * float(norm.weight.detach().abs().max()))


def test_vit_keeps_its_resized_position_embedding_until_the_stored_grid_changes():
    from mapstream.layers.vit import PatchEmbedViT

    vit = PatchEmbedViT(img_size=56, patch_size=14, dim=8, depth=1, num_heads=2, num_registers=1)
    with torch.no_grad():
        vit.pos_embed.normal_()
        first = vit.position_embedding(3, 5, torch.float32)
        assert vit.position_embedding(3, 5, torch.float32) is first  # resized once
        assert torch.equal(first, vit._resize_positions(3, 5, torch.float32))
        assert vit.position_embedding(4, 4, torch.float32) is vit.pos_embed  # the stored grid as is
        vit.pos_embed.mul_(2)  # new weights (as load_state_dict copies them): resized again
        again = vit.position_embedding(3, 5, torch.float32)
        torch.testing.assert_close(again, 2 * first)
        for w in range(6, 30):  # a stream of ever-new sizes
            vit.position_embedding(3, w, torch.float32)
        assert len(vit._resized) <= 8
    # With autograd the embedding is a function of the parameter, never a kept tensor.
    assert vit.position_embedding(3, 5, torch.float32).grad_fn is not None


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_row_linear_kernel_matches_the_composition_interpreted():
    """LayerNorm (affine or not) before the product, exact GELU or a scaled residual after it,
    row widths below, at and off the kernel's 512-wide chunks, output counts off its 4-row
    blocks: fp32 within float rounding of float64; bf16 within one rounding of the output
    (the norm's result rounded first, as the module hands it on)."""
    report = run_interpreted(Path(__file__).with_name("interpret_row_linear.py"))
    assert len(report) == 32
    for case, row in report.items():
        assert row["shape_ok"], case
        if "float32" in case:
            assert row["rel_err"] < 2e-6, (case, row)
        else:
            assert row["max_units"] < 1.05, (case, row)


def test_row_linear_takes_single_rows_of_one_dtype_without_autocast():
    from torch import nn

    from mapstream.layers.row_linear import _kernel_takes, _residual_ok, linear_residual, norm_linear

    linear, norm = nn.Linear(8, 6), nn.LayerNorm(8)
    row = torch.randn(1, 1, 8)
    assert _kernel_takes(row, linear, norm) and _kernel_takes(row, linear, None)
    assert not _kernel_takes(torch.randn(1, 2, 8), linear, norm)  # the trunk's many tokens
    assert not _kernel_takes(row.double(), linear, norm)
    assert not _kernel_takes(row.bfloat16(), linear, norm)  # weights of another dtype
    assert not _kernel_takes(row, nn.Linear(8, 6, bias=False), norm)
    assert not _kernel_takes(row, linear, nn.LayerNorm(4))
    assert not _kernel_takes(row, nn.Linear(4, 6), None)  # a width mismatch: PyTorch's error
    assert _residual_ok(torch.randn(1, 1, 6), torch.randn(6), row, linear)
    assert not _residual_ok(torch.randn(1, 6), torch.randn(6), row, linear)  # other leading axes
    assert not _residual_ok(torch.randn(1, 1, 6), torch.randn(1, 6), row, linear)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _kernel_takes(row, linear, norm)
    # Elsewhere (here: on the CPU) the composition, exactly.
    x, res, gamma = torch.randn(2, 3, 8), torch.randn(2, 3, 6), torch.randn(6)
    assert torch.equal(norm_linear(x, norm, linear), linear(norm(x)))
    assert torch.equal(norm_linear(x, norm, linear, gelu=True), F.gelu(linear(norm(x))))
    assert torch.equal(linear_residual(x, linear, res, gamma), res + linear(x) * gamma)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_dpt_output_kernel_matches_the_composition_interpreted():
    """The DPT head's last 1x1 convolution and activations in one kernel: the depth head's
    32 -> 2 and odd channel counts, contiguous and channels-last maps, pixel counts off the
    kernel's blocks; fp32 within float rounding of float64, bf16 within one rounding."""
    report = run_interpreted(Path(__file__).with_name("interpret_output_head.py"))
    assert len(report) == 12
    for case, row in report.items():
        assert row["shape_ok"], case
        bound = 1e-6 if "float32" in case else 2.0**-7
        assert row["value_rel"] < bound and row["conf_rel"] < bound, (case, row)


def test_dpt_output_takes_plain_1x1_convolutions_and_is_the_composition_elsewhere():
    from torch import nn

    from mapstream.layers.output_head import _kernel_takes, pointwise_output

    conv = nn.Conv2d(32, 2, 1)
    h = torch.randn(2, 32, 5, 7)
    assert _kernel_takes(conv, h) and _kernel_takes(conv, h.contiguous(memory_format=torch.channels_last))
    assert not _kernel_takes(nn.Conv2d(32, 2, 3, padding=1), h)
    assert not _kernel_takes(nn.Conv2d(32, 2, 1, bias=False), h)
    assert not _kernel_takes(nn.Conv2d(32, 1, 1), h)  # no value channel
    assert not _kernel_takes(conv, h.bfloat16())
    assert not _kernel_takes(conv, h.transpose(2, 3))  # not dense
    value, conf = pointwise_output(conv, h)  # on the CPU: the composition, exactly
    logits = conv(h).permute(0, 2, 3, 1)
    assert torch.equal(value, torch.exp(logits[..., :1])) and torch.equal(conf, 1 + torch.exp(logits[..., 1]))


def test_fc2_splits_its_reduction_only_where_half_the_chip_would_idle():
    """`split_pays`: the 504x378 trunk's fc2 (978 tokens, 4096 -> 1024: 64 tiles) splits on an
    H200's 132 multiprocessors; the projection (depth 1024), fc1 and q/k/v (256 and 192 tiles),
    a smaller chip, larger frames and unaligned depths do not. `split_linear` serves only code
    that torch.compile traces on CUDA, so eager and CPU calls keep the plain product."""
    from torch import nn

    from mapstream.layers.row_linear import linear_residual
    from mapstream.layers.split_linear import split_linear, split_pays

    fc2, proj, fc1, qkv = nn.Linear(4096, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 4096), nn.Linear(1024, 3072)
    assert split_pays(978, fc2, 132)
    assert split_pays(1024, fc2, 128) and not split_pays(1025, fc2, 128)  # 64 tiles vs 72
    assert not split_pays(978, proj, 132)
    assert not split_pays(978, fc1, 132) and not split_pays(978, qkv, 132)
    assert not split_pays(978, fc2, 100)  # 128 tiles would not fit in one wave
    assert not split_pays(1999, fc2, 132)  # 16 x 8 tiles already fill it
    assert not split_pays(978, nn.Linear(4104, 1024), 132)  # halves of 2052 are not 16-byte aligned
    x, residual, gamma = torch.randn(1, 978, 4096), torch.randn(1, 978, 1024), torch.randn(1024)
    assert split_linear(x, fc2) is None
    with torch.no_grad():
        assert torch.equal(linear_residual(x, fc2, residual, gamma), residual + fc2(x) * gamma)
