"""CUDA-only checks (skipped without a GPU): backends against the SDPA reference, the bf16
fast path against the fp32 path on real photos, and flat GPU memory on long streams.

Numbers are also written as JSON to $MAPSTREAM_GPU_REPORT (if set) for docs/BENCHMARKS.md.
"""
from __future__ import annotations

import gc
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

import mapstream
from conftest import DATA
from mapstream.attention import SDPABackend, available_backends, select_backend

pytestmark = pytest.mark.cuda
REPORT: dict = {}


def _report(key, value):
    REPORT[key] = value
    path = os.environ.get("MAPSTREAM_GPU_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(REPORT, f, indent=2)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _profiled(fn):
    """(fn(), {CUDA kernel name: launches}) with `fn` run under the profiler to completion."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    kernels = {e.key: e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA}
    return result, kernels


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
@pytest.mark.parametrize("kv_len", [54, 97, 1000, 7000])
def test_backends_match_sdpa_at_awkward_sizes(kv_len, backend):
    reasons = available_backends(torch.device("cuda"), torch.bfloat16)[backend]
    if reasons:
        pytest.skip("; ".join(reasons))
    g = torch.Generator(device="cuda").manual_seed(kv_len)
    storage = torch.randn(2, 16, kv_len + 13, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = storage[0, :, 5 : 5 + kv_len][None], storage[1, :, 5 : 5 + kv_len][None]  # strided views
    q = torch.randn(1, 16, 37, 64, device="cuda", generator=g)
    ref = SDPABackend().attend(q.double(), k.double(), v.double())
    got = select_backend(backend, torch.device("cuda"), torch.bfloat16).attend(q, k, v)
    err = _rel(got, ref)
    _report(f"{backend}_vs_sdpa_fp64_kv{kv_len}", err)
    assert torch.isfinite(got).all() and err < 1e-2


_KERNEL_VARIANTS = {"plain": {}, "tma": {"tma": True}}


@pytest.mark.parametrize("variant", list(_KERNEL_VARIANTS))
def test_triton_kernel_variants_with_the_key_range_in_device_memory(variant):
    if available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("triton unavailable")
    from mapstream.attention.triton_flash import KernelConfig, flash_attention

    if "tma" in variant and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA loads need compute capability 9.0")
    config = KernelConfig(**_KERNEL_VARIANTS[variant])
    g = torch.Generator(device="cuda").manual_seed(7)
    storage = torch.randn(2, 16, 9000, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    q = torch.randn(1000, 3, 16, 64, device="cuda", generator=g, dtype=torch.bfloat16)[:, 0].transpose(0, 1)
    kv_range = torch.zeros(2, dtype=torch.int32, device="cuda")
    out = torch.full((1000, 16, 64), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    graph = torch.cuda.CUDAGraph()
    flash_attention(q, storage[0], storage[1], kv_range=torch.tensor([0, 5], device="cuda"), config=config)
    with torch.cuda.graph(graph):
        flash_attention(q, storage[0], storage[1], kv_range=kv_range, out=out, config=config)
    for lo, hi in [(978, 8999), (0, 1), (131, 4000), (0, 9000)]:
        kv_range.copy_(torch.tensor([lo, hi]))
        graph.replay()  # one captured graph serves every range
        ref = SDPABackend().attend(q[None].double(), storage[None, 0, :, lo:hi].double(), storage[None, 1, :, lo:hi].double())
        err = _rel(out.transpose(0, 1), ref[0])
        _report(f"triton_{variant}_graph_range_{lo}_{hi}", err)
        assert torch.isfinite(out).all() and err < 1e-2, (lo, hi, err)


def _photos(n=12):
    folder = DATA / "courthouse"
    if not folder.exists():
        pytest.skip(f"{folder} not found")
    from mapstream.io.images import list_images, load_images

    return load_images(list_images(folder)[:n], image_size=518)


@pytest.fixture(scope="module")
def full_fp32():
    model = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map", backend="sdpa"))
    return model.cuda().eval()


def _stream(model, images, precision, keyframe_interval=1, fast=False):
    with model.session(num_scale_frames=4, keyframe_interval=keyframe_interval, precision=precision, fast=fast) as s:
        return s.run(images.cuda())


def test_bf16_fast_paths_agree_with_fp32_on_real_photos(full_fp32):
    images = _photos()
    ref = _stream(full_fp32, images, "fp32", keyframe_interval=2)
    fast = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map")).cuda().eval().cast_for_inference("bf16")
    results = {}
    variants = [(b, False) for b in ("sdpa", "flashinfer", "triton")]
    variants += [("flashinfer", True), ("triton", True), ("triton", "whole")]
    for backend, graphs in variants:
        if available_backends(torch.device("cuda"), torch.bfloat16)[backend]:
            continue
        fast.set_backend(backend)
        out = _stream(fast, images, "bf16", keyframe_interval=2, fast=graphs)
        for key in ("pose_enc", "depth", "depth_conf"):
            assert torch.isfinite(out[key]).all(), (backend, key)
        errs = {key: _rel(out[key], ref[key]) for key in ("pose_enc", "depth", "depth_conf")}
        errs["depth_median_abs_rel"] = float(((out["depth"] - ref["depth"]).abs() / ref["depth"]).median())
        results[backend + {False: "", True: "+graphs", "whole": "+whole-graph"}[graphs]] = errs
        assert errs["depth"] < 5e-2 and errs["pose_enc"] < 1e-1, (backend, graphs, errs)
    if not available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        # The headline variant: triton attention + CUDA graphs + torch.compile'd pieces.
        del fast
        fast = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map", compile=True))
        fast = fast.cuda().eval().cast_for_inference("bf16")
        fast.set_backend("triton")
        # Then the bench's bf16-heads variant: the heads in bf16 too (last: it casts in place).
        for label, heads in (("triton+graphs+compile", False), ("triton+graphs+compile+bf16-heads", True)):
            if heads:
                fast.cast_for_inference("bf16", heads=True)
            for mode in (True, "whole"):
                out = _stream(fast, images, "bf16", keyframe_interval=2, fast=mode)
                errs = {key: _rel(out[key], ref[key]) for key in ("pose_enc", "depth", "depth_conf")}
                assert all(out[k].dtype == torch.float32 and torch.isfinite(out[k]).all() for k in errs)
                results[label + ("" if mode is True else "+whole")] = errs
                assert errs["depth"] < 5e-2 and errs["pose_enc"] < 1e-1, (label, mode, errs)
    _report("bf16_vs_fp32_real_photos", results)
    assert results


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_camera_head_attention_is_one_rows_kernel_a_call_and_never_cudnn(dtype):
    """The camera head's cache attention runs our rows kernel, once per trunk block and pass
    (cuDNN would plan on the host for every new key count, which grows every frame)."""
    head = mapstream.build_model("lingbot-map").camera_head.cuda().eval().to(dtype)
    tokens = torch.randn(1, 1, 2048, device="cuda", dtype=dtype)
    cache = head.new_cache()
    with torch.no_grad():
        for _ in range(3):
            head(tokens, cache=cache)
        _, kernels = _profiled(lambda: [head(tokens, cache=cache) for _ in range(3)])
    calls = sum(n for name, n in kernels.items() if "_rows_fwd" in name)
    assert calls == 3 * head.num_iterations * len(head.trunk), list(kernels)
    assert not [name for name in kernels if "cudnn" in name.lower()]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_camera_trunk_block_of_one_token_is_four_row_linear_kernels(dtype, compiled):
    """A camera-head trunk block (2048 wide, one token) around a stand-in attention: its four
    products each run as one row-linear kernel with the norm before and the GELU or the
    scaled residual after it (no cuBLAS, no elementwise kernels), eager and inside
    torch.compile, within float (fp32) or bf16 rounding of `plain_pytorch()`'s composition."""
    from mapstream.attention import plain_pytorch
    from mapstream.layers import Block

    torch.manual_seed(0)
    block = Block(2048, 16, norm_eps=1e-5, layer_scale_init=0.01).cuda().eval()
    with torch.no_grad():
        for norm in (block.norm1, block.norm2):
            torch.nn.init.normal_(norm.weight, 1.0, 0.3)
            torch.nn.init.normal_(norm.bias, 0.0, 0.3)
        block.ls1.gamma.normal_(0.0, 0.5)
        block.ls2.gamma.normal_(0.0, 0.5)
    block = block.to(dtype)
    x = (torch.randn(1, 1, 2048, device="cuda") * 2 + 0.5).to(dtype)

    def run(b):
        q, k, v = b.attention_inputs(x)
        return b.attention_output(x, q * 0.5 + v)  # any [B, H, 1, D] in place of the attention

    with torch.no_grad():
        with plain_pytorch():
            want = run(block)
        if compiled:
            block.attention_inputs = torch.compile(block.attention_inputs, dynamic=False)
            block.attention_output = torch.compile(block.attention_output, dynamic=False)
        run(block)  # warm-up (compilation)
        got, kernels = _profiled(lambda: run(block))
    assert sum(n for name, n in kernels.items() if "_row_linear_fwd" in name) == 4, kernels
    assert not [name for name in kernels if "gemv" in name.lower() or "gemm" in name.lower()], kernels
    err = _rel(got, want)
    _report(f"camera_trunk_block_row_linear_{str(dtype)[6:]}_{'compiled' if compiled else 'eager'}", err)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert err < (1e-5 if dtype == torch.float32 else 1e-2), err


@pytest.mark.parametrize("splits", [None, 1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_kernel_matches_float64_and_follows_a_device_range_in_a_graph(dtype, splits):
    """One program or several sharing the keys (None: the default for 1,500 keys, 16)."""
    from mapstream.attention.triton_rows import rows_attention

    torch.manual_seed(0)
    storage = torch.randn(2, 16, 1500, 128, device="cuda").to(dtype)
    k, v = storage[0], storage[1]
    q = torch.randn(16, 1, 128, device="cuda")
    rng = torch.tensor([0, 1], device="cuda", dtype=torch.int32)
    rows_attention(q, k, v, kv_range=rng, splits=splits)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rows_attention(q, k, v, kv_range=rng, splits=splits)
    for lo, hi in [(0, 1), (0, 3), (0, 97), (5, 1024), (700, 1500)]:
        rng.copy_(torch.tensor([lo, hi]))
        graph.replay()
        ref = F.scaled_dot_product_attention(q.double(), k[:, lo:hi].double(), v[:, lo:hi].double())
        err = float((out.double() - ref).norm() / ref.norm())
        assert err < 1e-5, (dtype, splits, lo, hi, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resize_kernel_matches_interpolate_at_the_dpt_sizes(dtype):
    """The DPT head's resizes at 504x378 (channels-last, as the head runs): our kernel equals
    F.interpolate (+ an addend) up to one rounding of the output dtype; the position
    embedding given as its two tables gives exactly what the embedding as a map gives."""
    from mapstream.heads.dpt import dpt_position_tables
    from mapstream.layers import resize_bilinear

    torch.manual_seed(0)
    for shape, size in [((1, 256, 27, 36), (54, 72)), ((1, 256, 108, 144), (216, 288)), ((1, 128, 216, 288), (378, 504))]:
        x = torch.randn(shape, device="cuda").to(dtype).to(memory_format=torch.channels_last)
        add = torch.randn(shape[1], *size, device="cuda").to(dtype)
        want = F.interpolate(x.float(), size=size, mode="bilinear", align_corners=True) + add.float()
        got = resize_bilinear(x, size, add=add)
        assert got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
        tol = 1e-5 if dtype == torch.float32 else 2 ** -7
        assert float(((got.float() - want).abs() / want.abs().clamp_min(1.0)).max()) < tol, (shape, dtype)
        tables = dpt_position_tables(shape[1], *size, size[1] / size[0], x.device)
        tables = type(tables)(tables.cols.to(dtype), tables.rows.to(dtype))
        assert torch.equal(resize_bilinear(x, size, add=tables), resize_bilinear(x, size, add=tables.dense()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dpt_head_convolutions_run_their_epilogues_in_one_kernel(dtype):
    """The DPT head at 504x378 (channels-last weights, as `cast_for_inference` lays them out):
    every convolution with a bias but the last runs bias, residuals and ReLU in one
    `_conv_epilogue_fwd` pass, the last (1x1, to depth and confidence) and both activations in
    one `_pointwise_output_fwd` pass, no broadcast bias add is left on PyTorch's unvectorized
    path, and the depth and confidence stay within the dtype's rounding of the PyTorch
    composition (`plain_pytorch`)."""
    from mapstream.attention import plain_pytorch
    from mapstream.heads.dpt import DPTHead

    torch.manual_seed(0)
    head = DPTHead(2048).cuda().eval().to(dtype).to(memory_format=torch.channels_last)
    layers = [torch.randn(1, 1, 6 + 27 * 36, 2048, device="cuda", dtype=dtype) for _ in range(4)]
    with torch.no_grad():
        with plain_pytorch():
            want = head(layers, (378, 504), 6)
        head(layers, (378, 504), 6)  # warm-up (compilation)
        torch.cuda.synchronize()
        got, calls = _profiled(lambda: head(layers, (378, 504), 6))
    biased = [m for m in head.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and m.bias is not None]
    assert calls.get("_conv_epilogue_fwd", 0) == len(biased) - 1 == 27, calls
    assert calls.get("_pointwise_output_fwd", 0) == 1, calls
    assert not [name for name in calls if "exp_kernel" in name], calls
    slow_adds = sum(n for name, n in calls.items() if "elementwise_kernel<128" in name and "CUDAFunctor_add" in name)
    assert slow_adds <= 4, calls  # only the four position embeddings' broadcast adds are left
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        assert float((g.float() - w.float()).norm() / w.float().norm()) < tol


def test_mlp_gelu_runs_in_the_products_epilogue_in_half_precision():
    """The trunk's MLP (1024 -> 4096 -> 1024, 978 tokens) on CUDA: in bf16 (weights or
    autocast) fc1's GELU is cuBLASLt's epilogue, so no elementwise kernel runs, and the result
    stays within bf16 rounding of the exact composition; in fp32 and inside `plain_pytorch()`
    it is exactly fc2(gelu(fc1(x)))."""
    import copy

    from mapstream.attention import plain_pytorch
    from mapstream.layers import Mlp

    torch.manual_seed(0)
    mlp = Mlp(1024, 4096).cuda().eval()
    x = torch.randn(1, 978, 1024, device="cuda")
    half = copy.deepcopy(mlp).to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(mlp(x), mlp.fc2(F.gelu(mlp.fc1(x))))
        with plain_pytorch():
            want = half(xb)
        assert torch.equal(want, half.fc2(F.gelu(half.fc1(xb))))
        half(xb)  # warm-up (cuBLASLt's heuristics)
        got, calls = _profiled(lambda: half(xb))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            auto = mlp(x)
            with plain_pytorch():
                auto_want = mlp(x)
    assert not [name for name in calls if "elementwise" in name], calls
    assert len(calls) <= 2, calls  # the two products
    for g, w in ((got, want), (auto, auto_want)):
        assert g.dtype == torch.bfloat16 and torch.isfinite(g).all()
        err = _rel(g, w)
        _report("mlp_gelu_epilogue_vs_exact", err)
        assert err < 1e-2


def test_compiled_fc2_splits_its_reduction_within_bf16_rounding():
    """A trunk block's feed-forward over one 504x378 frame (978 tokens, bf16 autocast) under
    torch.compile: fc2 (4096 -> 1024) is traced as one batched product of two half-depth fp32
    halves, and the compiled result stays within bf16 rounding of the plain composition.
    Eagerly no split is traced."""
    from mapstream.attention import plain_pytorch
    from mapstream.layers import Block

    torch.manual_seed(0)
    block = Block(1024, 16).cuda().eval()
    with torch.no_grad():
        block.ls2.gamma.uniform_(0.5, 1.5)
    x = torch.randn(1, 978, 1024, device="cuda")
    traced = []

    def recording(gm, example_inputs):
        traced.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        with plain_pytorch():
            want = block.feed_forward(x)
        torch.compile(block.feed_forward, backend=recording, dynamic=False)(x)
        torch._dynamo.reset()
        got = torch.compile(block.feed_forward, dynamic=False)(x)
        torch._dynamo.reset()
    assert any("bmm" in t for t in traced), traced
    assert torch.isfinite(got).all()
    err = _rel(got, want)
    _report("compiled_split_fc2_vs_plain", err)
    assert err < 1e-2


def _trunk_attention(dtype):
    """A trunk block's attention projections (1024 wide, 16 heads of 64, q/k LayerNorms with
    weights and biases away from 1 and 0, so the norms' affine part is exercised), seeded."""
    from mapstream.layers import Attention

    torch.manual_seed(0)
    attn = Attention(1024, 16, qk_norm=True).cuda()
    for norm in (attn.q_norm, attn.k_norm):
        torch.nn.init.normal_(norm.weight, 1.0, 0.3)
        torch.nn.init.normal_(norm.bias, 0.0, 0.3)
    return attn.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["2d", "3d", "3d_two_streams"])
def test_qkv_heads_is_one_kernel_matching_the_modules(dtype, kind):
    """The trunk blocks' q, k, v at 504x378 (978 tokens a frame, 16 heads of 64): one kernel
    a call, eager and under torch.compile (traced into the graph), both equal to
    the modules' composition computed in fp32 with the same rounding points (LayerNorm
    result and rotation table rounded to the dtype, one rounding at the end)."""
    import dataclasses

    from mapstream.layers import patch_positions_2d, rope2d, rope3d, token_positions_3d
    from mapstream.layers.heads import qkv_heads

    attn = _trunk_attention(dtype)
    if kind == "2d":
        rotary = rope2d(patch_positions_2d(27, 36, 6, torch.device("cuda")), 64, 100.0)
    else:
        tables = [rope3d(token_positions_3d(torch.tensor([t], device="cuda"), 27, 36, 6), (16, 24, 24), 10000.0)
                  for t in (130, 7)]
        rotary = tables[0]
        if kind == "3d_two_streams":
            rotary = dataclasses.replace(rotary, cos=torch.stack([r.cos for r in tables]).unsqueeze(1),
                                         sin=torch.stack([r.sin for r in tables]).unsqueeze(1))
    batch = 2 if kind == "3d_two_streams" else 1
    with torch.no_grad():
        qkv = attn.qkv(torch.randn(batch, 978, 1024, device="cuda", dtype=dtype))
        heads = lambda t: qkv_heads(t, 16, attn.q_norm, attn.k_norm, rotary)  # noqa: E731
        got = heads(qkv)
        _, kernels = _profiled(lambda: heads(qkv))
        compiled_heads = torch.compile(heads, fullgraph=True, dynamic=False)
        compiled = compiled_heads(qkv)
        _, compiled_kernels = _profiled(lambda: compiled_heads(qkv))
        q, k, v = qkv.float().unflatten(-1, (3, 16, 64)).permute(2, 0, 3, 1, 4).unbind(0)
        table = dataclasses.replace(rotary, cos=rotary.cos.to(dtype).float(), sin=rotary.sin.to(dtype).float())
        normed = [F.layer_norm(t, (64,), n.weight.float(), n.bias.float(), n.eps).to(dtype).float()
                  for t, n in ((q, attn.q_norm), (k, attn.k_norm))]
        want = [table.apply(t).to(dtype) for t in normed] + [v.to(dtype)]
        scale = [t.abs().amax(-1, keepdim=True) for t in normed] + [v.abs().clamp_min(1e-30)]
    assert list(kernels) == ["_qkv_heads_fwd"], kernels
    # Compiled, the op is traced into the graph (fullgraph) and its kernel is the graph's one
    # kernel; Inductor builds it with its own compile options, so bits may differ.
    assert len(compiled_kernels) == 1, compiled_kernels
    # Where the two LayerNorms' fp32 statistics differ in the last bits, a LayerNorm result
    # can round the other way (one unit of the dtype); the rotation carries that into both
    # channels of its pair: so the bound is one unit of the row's largest normed value, and
    # nearly every element must sit within one unit of its own value.
    # fp32: a few units of the row's scale (rsqrt and the statistics' summation order).
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20
    for g, c, w, sc in zip(got, compiled, want, scale):
        assert g.shape == (batch, 16, 978, 64) and g.dtype == dtype
        for out in (g, c):
            diff = (out.float() - w.float()).abs()
            beyond_own_unit = float((diff > ulp * w.float().abs() + 1e-6).float().mean()) if dtype == torch.bfloat16 else 0.0
            worst = float((diff / (ulp * sc)).max())
            assert worst <= 1.0 and beyond_own_unit < 1e-3, (kind, dtype, worst, beyond_own_unit)


def test_qkv_heads_under_autocast_rounds_once_to_the_autocast_dtype():
    """Sessions run bf16 weights under autocast, where the modules' norms and rotation give
    fp32 q, k that every consumer rounds to bf16: the kernel returns that rounding directly
    (one kernel, within one unit of the rounded composition)."""
    from mapstream.layers import rope3d, token_positions_3d
    from mapstream.layers.heads import qkv_heads

    attn = _trunk_attention(torch.bfloat16)
    rotary = rope3d(token_positions_3d(torch.tensor([130], device="cuda"), 27, 36, 6), (16, 24, 24), 10000.0)
    x = torch.randn(1, 978, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        qkv = attn.qkv(x)
        got, kernels = _profiled(lambda: qkv_heads(qkv, 16, attn.q_norm, attn.k_norm, rotary))
        q, k, v = qkv.unflatten(-1, (3, 16, 64)).permute(2, 0, 3, 1, 4).unbind(0)
        want = [rotary.apply(attn.q_norm(q)), rotary.apply(attn.k_norm(k)), v]
    assert list(kernels) == ["_qkv_heads_fwd"], kernels
    assert want[0].dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in got)
    for g, w in zip(got, want):
        rounded = w.to(torch.bfloat16).float()
        diff = (g.float() - rounded).abs()
        assert bool((diff <= 2.0 ** -7 * rounded.abs() + 1e-6).all()), float(diff.max())
        assert float((diff > 0).float().mean()) < 1e-2


def test_fast_true_takes_the_whole_step_where_the_backend_reads_key_ranges_on_the_device():
    """`Session(fast=True)` on CUDA: one graph a step with the Triton backend (it reads the
    visible key range from device memory), pieces with SDPA (it would attend over the whole
    cache arena, masked)."""
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    chosen = {}
    for backend in ("triton", "sdpa"):
        model.set_backend(backend)
        with model.session(num_scale_frames=2, precision="bf16", fast=True) as s:
            chosen[backend] = s.whole_step
    assert chosen == {"triton": True, "sdpa": False}


@pytest.mark.parametrize("fast", [False, "pieces", "whole"], ids=["eager", "pieces", "whole-step"])
def test_session_steps_run_the_fused_heads_and_our_frame_attention(fast):
    """A bf16 session step (bf16 weights under autocast, as sessions run) goes through the
    fused q/k/v heads in every frame and global block and through our kernel for every
    frame's own attention (ViT and frame blocks), never SDPA: guards against a silent
    fallback, such as the autocast refusal that kept the fused heads out of the first
    measurement of session 6."""
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    c = model.config
    images = torch.rand(5, 3, 56, 70, device="cuda")
    with model.session(num_scale_frames=2, precision="bf16", fast=fast) as s:
        for i in range(4):
            s.step(images[i])
        torch.cuda.synchronize()
        _, calls = _profiled(lambda: s.step(images[4]))
    assert calls.get("_qkv_heads_fwd", 0) >= 2 * c.depth, calls
    assert calls.get("_flash_fwd", 0) == c.vit_depth + c.depth, calls
    assert not [n for n in calls if any(w in n.lower() for w in ("sdpa", "fmha", "pytorch_flash"))], calls
    # Every cache write (aggregator and camera head) is one kernel for both k and v.
    assert calls.get("_write_frame_kv", 0) >= c.depth, calls
    assert not [n for n in calls if "index_copy" in n], calls


@pytest.mark.parametrize("start_on_device", [False, True], ids=["int", "tensor"])
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                    (torch.bfloat16, torch.float32)], ids=["bf16", "fp32", "fp32_into_bf16"])
def test_frame_write_is_one_kernel_matching_the_copies(dtypes, start_on_device):
    """A 504x378 frame's k, v (views of its q/k/v projection) written into one layer of a
    stacked cache storage: one kernel, bit-identical to PyTorch's copies (also when it
    rounds fp32 to bf16), the other layers untouched."""
    from mapstream.cache.frame_write import write_frame_kv

    kv_dtype, dtype = dtypes
    storage = torch.randn(3, 2, 16, 72 * 978, 64, device="cuda").to(kv_dtype)
    qkv = torch.randn(978, 3, 16, 64, device="cuda").to(dtype)
    k, v = qkv[:, 1].transpose(0, 1), qkv[:, 2].transpose(0, 1)
    start = 5 * 978
    want = storage.clone()
    want[1, 0, :, start : start + 978] = k
    want[1, 1, :, start : start + 978] = v
    where = torch.arange(start, start + 978, device="cuda") if start_on_device else start
    _, kernels = _profiled(lambda: write_frame_kv(storage[1], k, v, where))
    assert list(kernels) == ["_write_frame_kv"], kernels
    assert torch.equal(storage, want)


@pytest.mark.parametrize("layout", ["heads", "vit_views"])
def test_dense_attention_of_one_frame_is_our_kernel(layout):
    """One bf16 frame at 504x378 (978 tokens, 16 heads of 64): one `_flash_fwd` call and no
    cuDNN, a token-major result, one kernel under torch.compile too (traced into the
    graph), and as close to fp32 SDPA as cuDNN's bf16 kernel is; q/k/v either contiguous
    heads (frame blocks) or strided views of the projection (the ViT's blocks). Two frames
    at once go to SDPA."""
    from mapstream.attention.dense import dense_attention

    torch.manual_seed(0)
    if layout == "heads":
        q, k, v = (torch.randn(1, 16, 978, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    else:
        qkv = torch.randn(1, 978, 3, 16, 64, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    with torch.no_grad():
        got = dense_attention(q, k, v)
        _, kernels = _profiled(lambda: dense_attention(q, k, v))
        compiled_attention = torch.compile(dense_attention, fullgraph=True, dynamic=False)
        compiled = compiled_attention(q, k, v)
        _, compiled_kernels = _profiled(lambda: compiled_attention(q, k, v))
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        cudnn = F.scaled_dot_product_attention(q, k, v)
        two = torch.cat((q, q)), torch.cat((k, k)), torch.cat((v, v))
        assert torch.equal(dense_attention(*two), F.scaled_dot_product_attention(*two))
    assert list(kernels) == ["_flash_fwd"], kernels
    assert len(compiled_kernels) == 1 and "cudnn" not in next(iter(compiled_kernels)).lower(), compiled_kernels
    assert got.shape == q.shape and got.transpose(1, 2).is_contiguous()
    err, err_compiled, err_cudnn = _rel(got, want), _rel(compiled, want), _rel(cudnn, want)
    _report(f"dense_attention_rel_err_{layout}", {"ours": err, "compiled": err_compiled, "cudnn": err_cudnn})
    assert max(err, err_compiled) < max(1.5 * err_cudnn, 5e-3), (err, err_compiled, err_cudnn)


@pytest.mark.parametrize(
    "precision, fast, backend",
    [("fp32", False, "sdpa"), ("fp32", True, "sdpa"), ("bf16", True, "triton")],
    ids=["eager", "graphs-pieces", "graphs-whole-step"],
)
def test_gpu_memory_is_flat_on_a_long_stream(full_fp32, precision, fast, backend):
    """Flat after the window and the trajectory memory are full, eager and replayed from
    graphs: in pieces (SDPA; the camera head's own graph pool and second stream included) and
    as the whole-step graph that `fast=True` takes with the Triton backend, captured again
    whenever the trajectory memory's growth or thinning moves the cache's storage."""
    images = _photos(16).cuda()
    cache = dict(cache_scale_frames=4, sliding_window=8, trajectory_capacity=64)
    full_fp32.set_backend(backend)
    torch.cuda.synchronize()
    try:
        with full_fp32.session(num_scale_frames=4, precision=precision, **cache, fast=fast) as s:
            assert s.whole_step == (backend == "triton" and bool(fast))
            marks = {}
            for i in range(400):
                s.step(images[i % 16])
                if i in (150, 399):
                    torch.cuda.synchronize()
                    marks[i] = torch.cuda.memory_allocated()
    finally:
        full_fp32.set_backend("sdpa")
    mode = "eager" if not fast else "whole" if backend == "triton" else "pieces"
    _report(f"gpu_memory_allocated_frames_150_399_{mode}", marks)
    assert marks[399] == marks[150]


@pytest.mark.parametrize("kf", [1, 2])
def test_whole_step_graph_serves_every_cache_state(kf):
    """One captured graph per session serves the window filling, eviction into the trajectory
    memory, its thinning, unstored frames and a reset: predictions equal the eager path's
    with the same kernel, and a reset leaves nothing stale (the replayed second pass equals
    the first bit for bit)."""
    if available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("triton backend unavailable")
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval().cast_for_inference("bf16")
    model.set_backend("triton")
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
    g = torch.Generator().manual_seed(5)
    frames = torch.rand(18, 3, 28, 42, generator=g).cuda()

    def run(fast):
        with model.session(num_scale_frames=2, keyframe_interval=kf, precision="bf16", **cache, fast=fast) as s:
            first = s.run_frames(frames)
            key = [graphed._whole.key for graphed in s._graphed.values()]
            s.reset()
            second = s.run_frames(frames)
            assert key == [graphed._whole.key for graphed in s._graphed.values()]  # no new capture
            return first, second, s.state.aggregator.stats().trajectory_frames

    eager, _, traj = run(False)
    first, second, _ = run("whole")
    assert traj >= 3
    for a, b, c in zip(first, second, eager):
        assert torch.equal(a.depth, b.depth) and torch.equal(a.pose_enc, b.pose_enc)
        torch.testing.assert_close(a.depth, c.depth, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(a.pose_enc, c.pose_enc, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("fast", ["pieces", "whole"])
def test_graphs_of_fp32_weights_under_bf16_autocast_read_live_casts(fast):
    """fp32 weights with precision bf16 (no `cast_for_inference`): the captured graphs must
    not hold autocast's cached casts of the weights, freed when its context exits. Every
    capture empties PyTorch's allocator cache (a later graph's, e.g. after the camera cache
    grew: a 400-frame stream crashed on an illegal address that way); between steps the
    test does the same, then takes blocks the size of each cast weight and fills them with
    NaN, so a graph that read freed casts would fault or put NaN in the outputs. They equal
    the eager session's."""
    reasons = available_backends(torch.device("cuda"), torch.bfloat16)["triton"]
    if fast == "whole" and reasons:
        pytest.skip("; ".join(reasons))
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())  # autocast caches these
    model.set_backend("triton" if fast == "whole" else "sdpa")
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
    frames = torch.rand(14, 3, 28, 42, generator=torch.Generator().manual_seed(8)).cuda()

    def run(fast_mode):
        poison: list[torch.Tensor] = []
        outputs = []
        with model.session(num_scale_frames=2, precision="bf16", **cache, fast=fast_mode) as s:
            for frame in frames:
                outputs += s.step(frame)
                poison.clear()
                torch.cuda.empty_cache()
                poison += [torch.full_like(p, float("nan"), dtype=torch.bfloat16) for p in model.parameters()]
        return outputs

    eager, graphed = run(False), run(fast)
    for a, b in zip(graphed, eager):
        torch.testing.assert_close(a.depth, b.depth, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fast", [False, "pieces", "whole"], ids=["eager", "pieces", "whole-step"])
def test_fp16_sessions_agree_with_fp32(fast):
    """precision="fp16" (what "auto" picks on GPUs without bf16), weights cast to fp16: the
    Triton cache attention then drops the key-norm hint (fp16 cannot hold the small softmax
    weights it allows) and runs with the running max. Eager and both graph decompositions
    stay within fp16 rounding of the fp32 session through eviction and thinning, NaN never."""
    if fast == "whole" and available_backends(torch.device("cuda"), torch.float16)["triton"]:
        pytest.skip("triton backend unavailable")
    reference = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    half = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval().cast_for_inference("fp16")
    half.set_backend("triton" if fast == "whole" else "sdpa")
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
    frames = torch.rand(12, 3, 56, 70, generator=torch.Generator().manual_seed(9)).cuda()
    with reference.session(num_scale_frames=2, precision="fp32", fast=False, **cache) as s:
        want = s.run_frames(frames)
    with half.session(num_scale_frames=2, precision="fp16", **cache, fast=fast) as s:
        got = s.run_frames(frames)
        assert s.whole_step == (fast == "whole")
    for a, b in zip(got, want):
        assert torch.isfinite(a.depth).all() and torch.isfinite(a.pose_enc).all()
        assert _rel(a.depth, b.depth) < 2e-2 and _rel(a.pose_enc, b.pose_enc) < 3e-2, (a.index, _rel(a.depth, b.depth))


def test_value_check_of_frames_on_the_gpu_answers_through_one_asynchronous_copy():
    """`ValueCheck` on CUDA frames: nothing waits until `wait()`, which passes good frames and
    names the NaN frame or the out-of-range values of bad ones."""
    from mapstream.validation import ValueCheck

    frames = torch.rand(1, 3, 3, 28, 42, device="cuda")
    ValueCheck(frames).wait()
    bad = frames.clone()
    bad[0, 2, 1, 5, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf values \\(at batch 0 frame 2\\)"):
        ValueCheck(bad).wait()
    with pytest.raises(ValueError, match=r"\[0, 1\] \(up to 0.25 beyond.*\), got \[0, 2\]"):
        ValueCheck(frames * 0 + torch.tensor([0.0, 2.0, 1.0], device="cuda")[:, None, None]).wait()


def test_value_check_on_a_second_stream_answers_while_the_current_stream_is_busy():
    """`ValueCheck(stream=...)` runs after the work that produced the frames (all work queued
    so far, or up to its `ready` event) but beside what the caller queues on the current
    stream after that (a session step's first graph): `wait()` answers while a long kernel
    queued there is still running; a bad frame is still rejected."""
    from mapstream.validation import ValueCheck

    side = torch.cuda.Stream()
    frames = torch.rand(1, 1, 3, 28, 42, device="cuda")
    check = ValueCheck(frames, stream=side)
    torch.cuda._sleep(400_000_000)  # ~0.2 s of the current stream, queued after the check
    check.wait()
    assert not torch.cuda.current_stream().query(), "the check waited for work queued after it"
    torch.cuda.synchronize()
    # As a session step does it: the frames' `ready` event, then the first graph (here a
    # long kernel), then the check, which waits for the event only.
    ready = torch.cuda.Event()
    ready.record()
    torch.cuda._sleep(400_000_000)
    ValueCheck(frames, stream=side, ready=ready).wait()
    assert not torch.cuda.current_stream().query(), "the check waited for work queued after `ready`"
    torch.cuda.synchronize()
    bad = frames.clone()
    bad[0, 0, 1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf values"):  # (locating it may wait)
        ValueCheck(bad, stream=side).wait()


@pytest.mark.parametrize("fast", ["pieces", "whole"], ids=["pieces", "whole-step"])
def test_graphed_dense_heads_are_warmed_up_under_cudnn_benchmark_mode_and_captured_without(monkeypatch, fast):
    """The graphed step's dense heads pick their convolution kernels by cuDNN's timing
    (`graphs._conv_search`) while warming up; the capture after finds them in cuDNN's cache
    and never times (timing synchronises, which would break the capture); the global flag is
    back off after every step, and the outputs equal the eager session's."""
    if fast == "whole" and available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("the whole step needs the Triton backend")
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    model.set_backend("triton" if fast == "whole" else "sdpa")
    head = model.depth_head
    seen = []
    original = head._forward_frames

    def recording(*args, **kwargs):
        seen.append((torch.backends.cudnn.benchmark, torch.cuda.is_current_stream_capturing()))
        return original(*args, **kwargs)

    monkeypatch.setattr(head, "_forward_frames", recording)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    images = torch.rand(5, 3, 56, 70, device="cuda")
    with model.session(num_scale_frames=2, precision="bf16", fast=False) as s:
        want = [p for i in range(5) for p in s.step(images[i])]
    eager_calls = len(seen)
    with model.session(num_scale_frames=2, precision="bf16", fast=fast) as s:
        got = []
        for i in range(5):
            got += s.step(images[i])
            assert not torch.backends.cudnn.benchmark
    assert not any(benchmark for benchmark, _ in seen[:eager_calls]), seen
    graphed = seen[eager_calls:]
    # The scale phase runs eagerly (heuristics); the first graphed step warms up (benchmark
    # mode) and captures (not); replays call no Python.
    first = graphed.index((True, False))
    assert first >= 1 and not any(benchmark for benchmark, _ in graphed[:first]), seen
    rest = graphed[first:]
    assert len(rest) >= 2 and rest == [(True, False), (False, True)] * (len(rest) // 2), seen
    for a, b in zip(got, want):  # bf16 trunk: the tolerance of the other graphed-vs-eager tests
        torch.testing.assert_close(a.depth, b.depth, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fast", ["pieces", "whole"])
def test_a_graph_keeps_the_dense_heads_position_tables_when_their_cache_drops_them(fast):
    """The depth head keeps its position tables for 20 sizes at most and then drops them all.
    A graph captured at one size reads them by address: other sizes run meanwhile (in another
    session of the same model) must not free memory it reads. Its replays after equal the
    eager steps."""
    if fast == "whole" and available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("the whole step needs the Triton backend")
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval().cast_for_inference("bf16")
    model.set_backend("triton" if fast == "whole" else "sdpa")
    g = torch.Generator().manual_seed(3)
    frames = torch.rand(5, 3, 28, 56, generator=g).cuda()
    with model.session(num_scale_frames=1, precision="bf16", fast=False) as s:
        want = s.run_frames(frames)
    with model.session(num_scale_frames=1, precision="bf16", fast=fast) as s:
        first = s.run_frames(frames)
        tables = {id(t) for t in model.depth_head.position_tables()}
        with model.session(num_scale_frames=1, precision="bf16", fast=False) as other:
            for width in (28, 42, 70, 84, 98, 112):
                other.reset()
                other.run_frames(torch.rand(2, 3, 28, width, generator=g).cuda())
                torch.zeros(1 << 22, device="cuda")  # allocations that would reuse freed memory
        assert not tables & {id(t) for t in model.depth_head.position_tables()}  # the cache dropped them
        s.reset()
        again = s.run_frames(frames)
    for a, b, c in zip(first, again, want):
        assert torch.equal(a.depth, b.depth) and torch.equal(a.pose_enc, b.pose_enc)
        torch.testing.assert_close(b.depth, c.depth, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(b.pose_enc, c.pose_enc, rtol=2e-2, atol=2e-2)


def test_compiled_between_layers_fuses_across_the_blocks_boundaries():
    """A compiled network compiles the work between two cache attentions as one function: on the
    tiny model in bf16 each block's last residual add fuses with the next block's first norm,
    so `between_layers(i)` launches at least two kernels fewer than `leave_layer(i - 1)` and
    `enter_layer(i)` compiled apart, and computes the same values (to bf16 rounding)."""
    from mapstream.layers import patch_positions_2d, rope2d
    model = mapstream.build_model("tiny", compile=True)
    model = mapstream.fill_synthetic_(model).cuda().eval().cast_for_inference("bf16")
    agg, c = model.aggregator, model.config
    g = torch.Generator(device="cuda").manual_seed(3)
    per_frame = c.num_special_tokens + 2 * 3
    seq = torch.randn(1, per_frame, c.embed_dim, device="cuda", generator=g).to(torch.bfloat16)
    attended = torch.randn(1, c.num_heads, per_frame, c.head_dim, device="cuda", generator=g).to(torch.bfloat16)
    rotary = rope2d(patch_positions_2d(2, 3, c.num_special_tokens, "cuda"), c.head_dim, c.rope2d_frequency)

    def apart():
        leaving = agg.leave_layer(1, seq, attended)
        return (leaving, *agg.enter_layer(2, leaving.view(1, per_frame, -1), rotary, None))

    with torch.no_grad():
        for _ in range(2):  # compile, warm up
            apart(), agg.between_layers(2, seq, attended, per_frame, rotary, None)
        want, apart_calls = _profiled(apart)
        got, together_calls = _profiled(lambda: agg.between_layers(2, seq, attended, per_frame, rotary, None))
    assert sum(together_calls.values()) <= sum(apart_calls.values()) - 2, (together_calls, apart_calls)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kv_len", [97, 1000, 7000, 71_000])
@pytest.mark.parametrize("n_q", [978, 300])
def test_balanced_cache_attention_matches_fp64_in_a_graph(kv_len, n_q):
    """`KernelConfig.balance` (spare resident slots take the row blocks' key tails, merged
    by a second kernel) on this GPU, with the key range read from device memory in a
    replayed CUDA graph: within bf16 rounding of float64 attention, and of the plain grid."""
    from mapstream.attention.triton_flash import KernelConfig, balanced_grid, flash_attention

    if not torch.cuda.get_device_capability() >= (9, 0):
        pytest.skip("the TMA kernel needs sm90")
    config = KernelConfig(tma=True, balance=True)
    assert balanced_grid(n_q, 16, torch.device("cuda"), config) is not None  # the balanced path runs
    g = torch.Generator(device="cuda").manual_seed(kv_len + n_q)
    storage = torch.randn(2, 16, kv_len + 300, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    q = torch.randn(16, n_q, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    rng = torch.tensor([0, 0], device="cuda", dtype=torch.int32)
    out = torch.empty(n_q, 16, 64, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    flash_attention(q, storage[0], storage[1], kv_range=(3, 3 + kv_len), out=out, config=config)  # compile
    with torch.cuda.graph(graph):
        flash_attention(q, storage[0], storage[1], kv_range=rng, out=out, config=config)
    for lo, hi in ((3, 3 + kv_len), (kv_len // 3, kv_len), (5, 6)):
        rng.copy_(torch.tensor([lo, hi], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        ref = F.scaled_dot_product_attention(q[None].double(), storage[0, :, lo:hi][None].double(), storage[1, :, lo:hi][None].double())[0]
        got = out.transpose(0, 1)
        plain = flash_attention(q, storage[0], storage[1], kv_range=(lo, hi), config=KernelConfig(tma=True))
        err = _rel(got, ref)
        _report(f"balanced_nq{n_q}_kv{hi - lo}", err)
        assert torch.isfinite(got).all() and err < 1e-2, (lo, hi, err)
        assert _rel(got, plain) < 5e-3, (lo, hi)


def test_triton_attend_into_writes_the_graphs_input_without_a_copy():
    """Pieces mode hands the Triton backend the static tensor the next graph reads
    (token-major, as the kernel writes): the kernel stores there itself, no copy kernel
    runs, and the values are `attend`'s."""
    backend = select_backend("triton", torch.device("cuda"), torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(1, 16, 978, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 16, 5000, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    want = backend.attend(q, k, v)
    into = torch.full((1, 978, 16, 64), float("nan"), device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    got, calls = _profiled(lambda: backend.attend_into(q, k, v, into))
    assert got is into and torch.equal(into, want)
    assert not [n for n in calls if "copy" in n.lower() or "memcpy" in n.lower() or "elementwise" in n], calls


@pytest.mark.parametrize("estimate", ["bound", "far_too_large", "far_too_small"])
@pytest.mark.parametrize("kv_len", [97, 7000, 71_000])
def test_fixed_reference_point_matches_fp64_and_is_repaired_in_a_graph(kv_len, estimate):
    """The balanced grid with each row's softmax reference point fixed from a key-norm
    estimate (`flash_attention(key_norm=...)`), keys out of a LayerNorm as in the global
    blocks, replayed from a CUDA graph over several key ranges: within bf16 rounding of
    float64 and of the running-max kernel. With the LayerNorm's bound no row block is
    computed again; with an estimate 1000x too large every one is (all weights underflow);
    with one far too small for keys 20x longer than the LayerNorm's, some are (overflow)."""
    from mapstream.attention.triton_flash import KernelConfig, flash_attention
    from mapstream.layers import layer_norm_bound

    if not torch.cuda.get_device_capability() >= (9, 0):
        pytest.skip("the TMA kernel needs sm90")
    config = KernelConfig(tma=True, balance=True)
    n_q, heads, dim = 978, 16, 64
    g = torch.Generator(device="cuda").manual_seed(kv_len)
    norm = torch.nn.LayerNorm(dim, device="cuda")
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.3 * torch.randn(dim, device="cuda", generator=g))
        norm.bias.copy_(0.1 * torch.randn(dim, device="cuda", generator=g))
        k = norm(torch.randn(heads, kv_len + 300, dim, device="cuda", generator=g)).to(torch.bfloat16)
        q = norm(torch.randn(heads, n_q, dim, device="cuda", generator=g)).to(torch.bfloat16)
    v = torch.randn(heads, kv_len + 300, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    key_norm = {"bound": layer_norm_bound(norm), "far_too_large": 1000.0 * layer_norm_bound(norm),
                "far_too_small": 0.01}[estimate]
    if estimate == "far_too_small":
        k = k * 20.0
    rng = torch.tensor([0, 0], device="cuda", dtype=torch.int32)
    repairs = torch.zeros(1, device="cuda", dtype=torch.int32)
    out = torch.empty(n_q, heads, dim, device="cuda", dtype=torch.bfloat16)
    kwargs = dict(out=out, config=config, key_norm=key_norm, repairs=repairs)
    flash_attention(q, k, v, kv_range=(3, 3 + kv_len), **kwargs)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flash_attention(q, k, v, kv_range=rng, **kwargs)
    blocks = -(-n_q // config.block_m) * heads
    for lo, hi in ((3, 3 + kv_len), (kv_len // 3, kv_len), (5, 6)):
        rng.copy_(torch.tensor([lo, hi], dtype=torch.int32))
        out.fill_(float("nan"))
        repairs.zero_()
        graph.replay()
        ref = F.scaled_dot_product_attention(q[None].double(), k[:, lo:hi][None].double(), v[:, lo:hi][None].double())[0]
        running = flash_attention(q, k, v, kv_range=(lo, hi), config=config)
        got = out.transpose(0, 1)
        err = _rel(got, ref)
        _report(f"fixed_{estimate}_kv{hi - lo}", err)
        assert torch.isfinite(got).all() and err < 1e-2, (lo, hi, err)
        assert _rel(got, running) < 5e-3, (lo, hi)
        done = int(repairs.item())
        if estimate == "bound":
            assert done == 0, (lo, hi)
        elif estimate == "far_too_large":
            assert done == blocks, (lo, hi, done)
        else:
            assert 0 < done <= blocks, (lo, hi, done)


def _bf16_triton_model():
    model = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map")).cuda().eval().cast_for_inference("bf16")
    model.set_backend("triton")
    return model


def test_fast_path_fixes_the_cache_attentions_reference_point_without_repairs_on_real_photos():
    """With the Triton backend every cache attention of a streaming step is handed its global
    block's key-norm bound and runs the fixed-reference kernel (its merge `_merge_or_repair`
    once a layer in the profile of a step); on real photos no row block had to be computed
    again, so the bound is tight enough for the speed it was built for."""
    from mapstream.layers import layer_norm_bound

    model = _bf16_triton_model()
    depth = model.config.depth
    backend = model.attention_backend(torch.device("cuda"), torch.bfloat16)
    hints = []
    kernel = backend._kernel

    def spied(*args, **kwargs):
        hints.append(kwargs.get("key_norm"))
        return kernel(*args, **kwargs)

    backend._kernel = spied
    images = _photos().cuda()
    # In pieces every cache attention is a Python call that the spy sees (a whole-step
    # graph replays its captured calls: the next test covers it).
    with model.session(num_scale_frames=4, precision="bf16", fast="pieces") as s:
        for frame in images[:-1]:
            s.step(frame)
        torch.cuda.synchronize()
        _, calls = _profiled(lambda: s.step(images[-1]))
    bounds = [layer_norm_bound(block.attn.k_norm) for block in model.aggregator.global_blocks]
    # The scale block (4 frames at once) and 8 single frames, every layer with its bound.
    assert hints == bounds * (1 + len(images) - 4), hints[:depth]
    assert calls.get("_merge_or_repair", 0) == depth and "_merge_splits" not in calls, calls
    assert model.aggregator.key_norm_hints.repaired_blocks() == [0] * depth


@pytest.mark.parametrize("fast", ["pieces", "whole"], ids=["pieces", "whole-step"])
def test_a_key_norm_bound_far_too_loose_is_repaired_then_withdrawn(monkeypatch, fast):
    """Global block 3 given a bound 1000x too large: its first fixed-reference calls compute
    every row block again (counted), the next steps give it the running max (one
    `_merge_splits` among the `_merge_or_repair`s of a step, the whole-step graph captured
    again), and the predictions equal those of a model with the right bounds."""
    from mapstream.layers.block import Attention

    images = _photos().cuda()
    want = _stream(_bf16_triton_model(), images, "bf16", fast=fast)
    model = _bf16_triton_model()
    loose = model.aggregator.global_blocks[3].attn
    right = Attention.key_norm_bound
    monkeypatch.setattr(Attention, "key_norm_bound", lambda self: right(self) * (1000.0 if self is loose else 1.0))
    depth = model.config.depth
    with model.session(num_scale_frames=4, keyframe_interval=1, precision="bf16", fast=fast) as s:
        got = [p for frame in images[:-1] for p in s.step(frame)]
        torch.cuda.synchronize()
        last, calls = _profiled(lambda: s.step(images[-1]))
    got += last
    repaired = model.aggregator.key_norm_hints.repaired_blocks()
    assert repaired[3] > 0 and repaired[:3] + repaired[4:] == [0] * (depth - 1), repaired
    assert calls.get("_merge_splits", 0) == 1 and calls.get("_merge_or_repair", 0) == depth - 1, calls
    assert len(got) == len(images)
    pose = torch.stack([p.pose_enc for p in got])
    depth_map = torch.stack([p.depth for p in got])
    assert _rel(pose.cpu(), want["pose_enc"][0].cpu()) < 1e-2
    assert _rel(depth_map.cpu(), want["depth"][0, ..., 0].cpu()) < 1e-2


def test_the_flythrough_draws_the_same_frames_on_the_gpu_as_on_the_cpu(tmp_path):
    """`mapstream render` draws with torch on either device: the GPU's splatting (projection in
    float64, depth test and tie-break by scatter-min) gives the CPU's pixels, and a rendered
    video decodes to the same number of frames."""
    av = pytest.importorskip("av")
    from mapstream.export import Reconstruction
    from mapstream.render import RenderOptions, look_at, pinhole, render_flythrough, splat

    g = torch.Generator().manual_seed(3)
    points = torch.randn(200_000, 3, generator=g, dtype=torch.float64) + torch.tensor([0.0, 0.0, 6.0], dtype=torch.float64)
    colors = torch.randint(0, 256, (200_000, 3), generator=g, dtype=torch.uint8)
    K, T = pinhole(360, 480, 60.0), look_at([0.3, -1.0, 0.0], [0.0, 0.0, 6.0], [0.0, -1.0, 0.0])
    cpu = splat(points.float(), colors, K, T, (360, 480), radius=1)
    gpu = splat(points.float().cuda(), colors.cuda(), K, T, (360, 480), radius=1).cpu()
    differ = (cpu != gpu).any(-1).float().mean().item()
    assert differ < 1e-3, f"{differ:.2%} of the pixels differ"  # a 1-ulp rounding at a pixel edge at most

    recon = Reconstruction(
        images=torch.randint(0, 256, (4, 24, 32, 3), generator=g, dtype=torch.uint8).numpy(),
        depth=torch.full((4, 24, 32), 2.0).numpy(), depth_conf=torch.full((4, 24, 32), 3.0).numpy(),
        T_world_cam=torch.eye(4)[:3].repeat(4, 1, 1).numpy(), K=torch.tensor([[30.0, 0, 16], [0, 30.0, 12], [0, 0, 1]]).repeat(4, 1, 1).numpy(),
        pose_enc=torch.zeros(4, 9).numpy(), names=[f"f{i}" for i in range(4)],
    )
    path = render_flythrough(recon, tmp_path / "fly.mp4", RenderOptions(height=64), device="cuda", progress=False)
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 4


def test_the_step_copies_beside_graph_0_wait_for_a_growing_trajectory_memory(monkeypatch):
    """The step's cache copies run beside graph 0 on a second stream; when planning moves the
    trajectory memory to a larger arena (its copy queued on the current stream behind graph 0),
    they must follow that copy instead. A long graph 0 is imitated by a GPU sleep queued just
    before the growth: the whole-step session still equals the eager one after the growth
    (with the copies beside graph 0 at that step, poses differed by 6.5e-2 from frame 69 on)."""
    if available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("triton backend unavailable")
    from mapstream.cache.manager import StreamCacheManager

    grown, grow = [], StreamCacheManager._grow_trajectory

    def slow_grow(self):
        grown.append(self.frames_stored)
        torch.cuda._sleep(400_000_000)  # ≈ 0.2 s of a busy current stream
        return grow(self)

    monkeypatch.setattr(StreamCacheManager, "_grow_trajectory", slow_grow)
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval().cast_for_inference("bf16")
    model.set_backend("triton")
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=None)
    frames = torch.rand(80, 3, 28, 42, generator=torch.Generator().manual_seed(5)).cuda()

    def run(fast):
        with model.session(num_scale_frames=2, precision="bf16", **cache, fast=fast) as s:
            return s.run_frames(frames)

    eager = run(False)
    grown.clear()
    whole = run("whole")
    assert grown, "the trajectory memory never grew: the test does not reach the case"
    for a, b in zip(whole, eager):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-3, atol=1e-3)


def test_bench_records_the_gpus_energy_clock_and_capping_over_its_steady_frames():
    """`run_benchmark` on the tiny preset: NVML's readings cover exactly the steady frames
    (from `steady_from` on), with a positive energy a frame, a plausible SM clock and the
    enforced power limit; the same readings, taken by hand around a burst of products, follow
    the work (more calls, more joules)."""
    from mapstream.bench import BenchConfig, run_benchmark
    from mapstream.gpu_power import PowerLog, open_reader

    reader = open_reader(torch.device("cuda"))
    if reader is None:
        pytest.skip("no NVML on this machine")
    cfg = BenchConfig(preset="tiny", width=56, height=42, scale_frames=2, stream_frames=70, window=3,
                      steady_from=12, warmup_frames=2, stage_breakdown=False, check_every=100)
    result = run_benchmark(cfg)
    power = result["gpu_power"]
    assert power is not None, result
    assert power["frames"] == 60  # frames 12 .. 71
    assert power["J_per_frame"] > 0 and power["mean_W"] > 10 and power["power_limit_W"] > 50
    assert 100 <= power["sm_mhz"]["min"] <= power["sm_mhz"]["mean"] <= power["sm_mhz"]["max"] < 5000
    assert 0.0 <= power["capped_frames"] <= 1.0
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    joules = []
    for calls in (50, 1000):  # ≈ 9 and 175 ms: NVML's counter moves every few ms
        log = PowerLog(reader)
        log.start()
        for _ in range(calls):
            a @ a
        torch.cuda.synchronize()
        log.after_frame()
        joules.append(log.summary()["J_per_frame"])
    assert joules[1] > 3 * joules[0] and joules[1] > 0, joules


@pytest.mark.parametrize("join", ["shared", "anchor"])
def test_windows_on_the_gpu_are_the_windows_on_the_cpu(join, monkeypatch):
    """Windowed inference in fp32 on CUDA (SDPA, eager) against the CPU: the same windows,
    Sim(3) joins (the shared join's SVD runs on the GPU) and stitched output. cuDNN's TF32
    convolutions are off: with them the patch embedding alone moves the poses by 3e-4."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    frames = torch.rand(1, 13, 3, 28, 42, generator=torch.Generator().manual_seed(7))
    config = model.stream_config.with_settings(
        window_size=5, overlap=3, num_scale_frames=2, window_join=join, precision="fp32", backend="sdpa", fast=False
    )
    cpu = mapstream.windowed_inference(model, frames, config)
    gpu = mapstream.windowed_inference(model.cuda(), frames.cuda(), config)
    assert cpu["chunk_scales"].shape[1] == 5
    torch.testing.assert_close(gpu["chunk_transforms"].cpu(), cpu["chunk_transforms"], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(gpu["pose_enc"].cpu(), cpu["pose_enc"], rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(gpu["depth"].cpu(), cpu["depth"], rtol=1e-3, atol=1e-4)


def test_the_unpacking_kernel_writes_the_visible_range_as_unpack_rows_bit_for_bit():
    """`unpack_range` (how an FP8 cache is read on the GPU) with the range as ints or in device
    memory: the range's rows equal the CPU's `unpack_rows` exactly in bf16, fp16 and fp32;
    rows outside it are zeros."""
    from mapstream.cache.fp8 import pack_rows, unpack_rows
    from mapstream.cache.fp8_kernel import unpack_range
    from mapstream.cache.manager import readable

    g = torch.Generator(device="cuda").manual_seed(1)
    heads, total, dim = 16, 3000, 64
    arena = torch.zeros(2, heads, total + 11, dim + 4, dtype=torch.uint8, device="cuda")
    x = torch.randn(heads, total, dim, device="cuda", generator=g) * torch.logspace(-4, 4, total, device="cuda")[:, None]
    arena[1, :, 5 : 5 + total] = pack_rows(x)
    rows = arena[1, :, 5 : 5 + total]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        on_cpu = unpack_rows(rows.cpu(), dtype)
        assert torch.equal(readable(rows, dtype).cpu(), on_cpu), dtype  # the cache's read: the kernel on CUDA
        for lo, hi in [(0, total), (977, 2931), (64, 65)]:
            for kv_range in ((lo, hi), torch.tensor([lo, hi], dtype=torch.int32, device="cuda")):
                out = torch.full((heads, total, dim), float("nan"), dtype=dtype, device="cuda")
                unpack_range(rows, kv_range, dtype, out=out)
                assert torch.equal(out[:, lo:hi].cpu(), on_cpu[:, lo:hi]), (dtype, lo, hi)
                assert (out[:, :lo] == 0).all() and (out[:, hi:] == 0).all(), (dtype, lo, hi)


def test_an_fp8_cache_agrees_with_fp32_within_twice_the_bf16_caches_error_on_real_photos(full_fp32):
    """On real photos: the FP8 cache's pose and depth error against the fp32 path within twice
    the bf16 cache's (the eager path unpacks the rows before SDPA, the whole-step graph with
    the unpacking kernel before the Triton kernel), and the two FP8 paths agree."""
    images = _photos()
    ref = _stream(full_fp32, images, "fp32", keyframe_interval=2)
    model = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map")).cuda().eval().cast_for_inference("bf16")
    results, outs = {}, {}
    for label, backend, fast, kv_dtype in (("bf16", "triton", "whole", "auto"), ("fp8-eager-sdpa", "sdpa", False, "fp8"),
                                           ("fp8-whole-triton", "triton", "whole", "fp8")):
        model.set_backend(backend)
        with model.session(num_scale_frames=4, keyframe_interval=2, precision="bf16", fast=fast,
                           kv_dtype=kv_dtype) as s:
            outs[label] = s.run(images.cuda())
        results[label] = {key: _rel(outs[label][key], ref[key]) for key in ("pose_enc", "depth", "depth_conf")}
    _report("fp8_cache_vs_fp32_real_photos", results)
    for label in ("fp8-eager-sdpa", "fp8-whole-triton"):
        for key in ("pose_enc", "depth"):
            assert results[label][key] <= 2 * results["bf16"][key], (label, key, results)
    assert _rel(outs["fp8-whole-triton"]["depth"], outs["fp8-eager-sdpa"]["depth"]) < 2e-2


@pytest.mark.parametrize("kv, fast", [("auto", "whole"), ("fp8", "whole"), ("auto", "pieces")])
def test_a_closed_session_gives_back_its_gpu_memory_while_it_is_still_referenced(kv, fast):
    """Closing releases the cache pages and the captured graphs' memory pools at once (the
    garbage collector is off: nothing waits for its cycle search), and a session leaves no
    cuBLAS workspace behind (cuBLAS keeps one for every stream it ran on, for the life of the
    process: the fast path's warm-up and side streams are the thread's, reused by every
    session it runs): a service keeps closed sessions around (for their results) without
    their memory. The first session warms what every session shares (weight casts, kernels,
    those streams); the second must leave exactly that behind."""
    from mapstream.cache import shared_pools

    if available_backends(torch.device("cuda"), torch.bfloat16)["triton"]:
        pytest.skip("triton backend unavailable")
    model = mapstream.fill_synthetic_(mapstream.build_model("small")).cuda().eval().cast_for_inference("bf16")
    model.set_backend("triton")
    frames = torch.rand(12, 3, 112, 140, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    kept, marks = [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            session = model.session(num_scale_frames=2, sliding_window=4, fast=fast, kv_dtype=kv)
            with torch.no_grad():
                for frame in frames:
                    session.step(frame)
            session.close()
            kept.append(session)
            shared_pools().trim()
            torch.cuda.synchronize()
            marks.append(torch.cuda.memory_allocated())
    finally:
        gc.enable()
    assert kept[1].whole_step == (fast == "whole")
    assert marks[1] == marks[0], marks


@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_a_quantized_trunk_streams_through_the_whole_step_graph_as_eagerly_on_real_photos(full_fp32, weights):
    """The official architecture with 8-bit trunk weights (torchao) on real photos: the whole-step
    graph (Triton cache attention, our fused kernels stepping aside for quantized layers)
    computes what the eager SDPA path computes on the same quantized network: the two paths
    stay closer than half of what the quantization itself changes (8-bit activations turn the
    backends' bf16 rounding differences into steps of their own, so the paths cannot agree
    more closely than on the quantization's scale; on an H100 int8 weights keep them a tenth
    of it apart, fp8 products about a third); the pose and depth error against the fp32 path
    is reported beside the bf16 trunk's."""
    pytest.importorskip("torchao")
    if weights == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 trunk weights need compute capability 8.9+")
    images = _photos()
    ref = _stream(full_fp32, images, "fp32", keyframe_interval=2)
    results, outs = {}, {}
    for label, trunk in (("bf16", "auto"), (weights, weights)):
        model = mapstream.fill_synthetic_(mapstream.build_model("lingbot-map")).cuda().eval()
        model.cast_for_inference("bf16").quantize_trunk(trunk)
        for backend, fast in (("sdpa", False), ("triton", "whole")):
            model.set_backend(backend)
            with model.session(num_scale_frames=4, keyframe_interval=2, precision="bf16", fast=fast) as s:
                outs[label, backend] = s.run(images.cuda())
        results[label] = {key: _rel(outs[label, "triton"][key], ref[key]) for key in ("pose_enc", "depth")}
        del model
    for key in ("pose_enc", "depth"):
        effect = _rel(outs[weights, "triton"][key], outs["bf16", "triton"][key])
        paths = _rel(outs[weights, "triton"][key], outs[weights, "sdpa"][key])
        results[weights][f"{key}_quantization_effect"], results[weights][f"{key}_paths_apart"] = effect, paths
    _report(f"trunk_weights_{weights}_vs_fp32_real_photos", results)
    for key in ("pose_enc", "depth"):
        assert math.isfinite(results[weights][key]) and results[weights][key] > 0
        assert results[weights][f"{key}_paths_apart"] < 0.5 * results[weights][f"{key}_quantization_effect"], (key, results)
