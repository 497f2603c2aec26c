"""Attention backends: capability reasons and selection (CPU), and our Triton kernel's
arithmetic under Triton's CPU interpreter (the compiled kernel is tested on the GPU)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import mapstream
from conftest import run_interpreted
from mapstream.attention import SDPABackend, available_backends, select_backend


def test_every_backend_states_why_it_cannot_serve_a_cpu():
    reasons = available_backends(torch.device("cpu"), torch.bfloat16)
    assert reasons["sdpa"] == []
    assert "needs a CUDA device (got cpu)" in reasons["triton"]
    assert "needs a CUDA device (got cpu)" in reasons["flashinfer"]
    assert "needs fp16/bf16 K/V (got torch.float32)" in available_backends(torch.device("cpu"), torch.float32)["triton"]
    assert "needs a CUDA device (got cpu)" in reasons["triton-rows"]


def test_a_cuda_device_this_pytorch_does_not_see_is_a_reason_not_a_crash(monkeypatch):
    """Asking for CUDA where PyTorch has none (a CPU build, no driver) used to raise
    PyTorch's AssertionError from the capability query; every backend now says why."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reasons = available_backends(torch.device("cuda"), torch.bfloat16)
    for name in ("sdpa", "triton", "triton-rows", "flashinfer"):
        assert "this PyTorch sees no CUDA GPU" in reasons[name], name
    with pytest.raises(ValueError, match="this PyTorch sees no CUDA GPU"):
        select_backend("triton", torch.device("cuda"), torch.bfloat16)


def test_camera_head_falls_back_to_sdpa_without_cudnn_off_cuda():
    head = mapstream.build_model("tiny").camera_head
    backend = head.attention_backend(torch.device("cpu"), torch.float32)
    assert isinstance(backend, SDPABackend) and not backend.cudnn
    assert head.attention_backend(torch.device("cpu"), torch.float32) is backend  # chosen once


def test_auto_falls_back_to_sdpa_and_named_backends_explain_refusals():
    assert isinstance(select_backend("auto", torch.device("cpu"), torch.float32), SDPABackend)
    with pytest.raises(ValueError, match="cannot run on cpu.*needs a CUDA device"):
        select_backend("triton", torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ValueError, match="Unknown attention backend: 'flash'. Valid options are: auto, sdpa"):
        select_backend("flash", torch.device("cpu"), torch.bfloat16)
    if importlib.util.find_spec("flashinfer") is None:  # how to get it, or what to use instead
        with pytest.raises(ValueError, match=r"not installed \(pip install flashinfer-python, or use backend auto"):
            select_backend("flashinfer", torch.device("cpu"), torch.bfloat16)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernel_computes_attention_over_any_key_range_interpreted():
    reports = run_interpreted(Path(__file__).with_name("interpret_triton_kernel.py"))
    report = reports["flash"]
    assert report.pop("launch_hook/wrapped") == [
        "_flash_fwd", "_flash_fwd", "_merge_splits", "_flash_fwd_balanced", "_merge_splits"
    ]
    for name in ("plain", "split3", "balanced_8_spare"):
        assert report.pop(f"launch_hook/{name}") == {"equal": True}
    assert len(report) == 6 * 9 * 2
    for case, row in report.items():
        # float32 inputs: the interpreter's dots are exact float32 products.
        assert row["err"] < 1e-5, (case, row)
        assert row["token_major"] and row["shape"] == [2, 21, 32], (case, row)
    # Scores that rise (then fall) by far more than fp32's range of exponentials: the running
    # max and the fixed reference point give the same softmax.
    wide = reports["wide"]
    assert len(wide) == 2 * 3 and all(row["err"] < 1e-5 for row in wide.values()), wide
    # A fixed reference point from a key-norm estimate: the same softmax; the merge
    # recomputes a row block exactly when the estimate put its weights out of range: none
    # with the right estimate, all 2 row blocks x 2 heads with the far too large one (every
    # weight underflows), and some with the far too small one (a lone key's score may stay
    # in range, so all four only over the longer ranges).
    fixed = reports["fixed"]
    half = fixed.pop("half/balanced_3_spare/too_large/13-150")
    assert half["repairs"] == 0 and half["err"] < 5e-3, half  # fp16: the hint ignored
    assert len(fixed) == 4 * 2 * 3
    for case, row in fixed.items():
        assert row["err"] < 1e-5, (case, row)
        if "/right/" in case:
            assert row["repairs"] == 0, (case, row)
        elif "/too_large/" in case or not case.endswith("/40-41"):
            assert row["repairs"] == 4, (case, row)
        else:
            assert row["repairs"] >= 1, (case, row)
    # The rows kernel (camera head): fp32 arithmetic on fp32 or bf16 storage; the inputs
    # are the same bf16 values the float64 reference reads, so both are exact to fp32,
    # whether one program walks the keys or several share them (merged by a second kernel).
    rows = reports["rows"]
    assert len(rows) == 2 * 4 * 2 * 3
    for case, row in rows.items():
        assert row["err"] < 1e-6, (case, row)
        assert row["shape"] == [2, 3, 32] and row["dtype"] == "torch.float32", (case, row)


@pytest.mark.parametrize("kernel", ["flash", "rows"])
def test_triton_kernels_reject_bad_arguments(kernel):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from mapstream.attention.triton_flash import flash_attention
    from mapstream.attention.triton_rows import rows_attention

    attend = flash_attention if kernel == "flash" else rows_attention
    q, k = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    with pytest.raises(ValueError, match="shape mismatch"):
        attend(q, k, torch.randn(3, 9, 32))
    with pytest.raises(ValueError, match="head dim 24 is not supported"):
        attend(torch.randn(2, 5, 24), torch.randn(2, 9, 24), torch.randn(2, 9, 24))
    with pytest.raises(ValueError, match=r"key range \(4, 4\) is empty"):
        attend(q, k, k, kv_range=(4, 4))
    with pytest.raises(ValueError, match=r"key range \(3, 10\) is empty or outside"):
        attend(q, k, k, kv_range=(3, 10))
    with pytest.raises(ValueError, match="unit stride"):
        attend(q, k.transpose(1, 2).contiguous().transpose(1, 2), k)
    if kernel == "rows":
        for splits in (0, 3, 32):
            with pytest.raises(ValueError, match=f"splits={splits}: needs a power of two from 1 to 16"):
                attend(q, k, k, splits=splits)
    else:  # balance runs its own loop: key shares are refused, on any device
        from mapstream.attention.triton_flash import KernelConfig

        with pytest.raises(ValueError, match="balance runs the plain loop"):
            attend(q, k, k, config=KernelConfig(balance=True, splits=2))
        for key_norm in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="key_norm must be a positive finite float"):
                attend(q, k, k, key_norm=key_norm)
        with pytest.raises(ValueError, match=r"repairs must be an int32 tensor of shape \[1\]"):
            attend(q, k, k, key_norm=8.0, repairs=torch.zeros(1))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_rows_kernel_shares_keys_among_programs_only_beyond_one_tile():
    from mapstream.attention.triton_rows import default_splits

    assert [default_splits(t, 64) for t in (1, 64, 65, 128, 129, 200, 1000, 1024, 1025, 100_000)] == [
        1, 1, 2, 2, 4, 4, 16, 16, 16, 16,
    ]


def test_dense_attention_is_sdpa_off_the_kernels_cases():
    """CPU, fp32 and batches of frames go to PyTorch's SDPA unchanged (our kernel serves one
    half-precision frame on CUDA: tests/gpu)."""
    from mapstream.attention.dense import dense_attention

    torch.manual_seed(0)
    for shape, dtype in (((1, 2, 9, 16), torch.float32), ((3, 2, 9, 16), torch.bfloat16)):
        q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
        assert torch.equal(dense_attention(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_flash_launch_hook_refuses_the_tma_kernel():
    from mapstream.attention.triton_flash import KernelConfig, flash_attention

    q, k, v = torch.randn(2, 5, 16), torch.randn(2, 9, 16), torch.randn(2, 9, 16)
    with pytest.raises(ValueError, match="tma=False"):
        flash_attention(q, k, v, config=KernelConfig(tma=True), launch=lambda kernel: kernel)


def test_dense_attention_kernel_takes_one_half_precision_frame():
    """Which calls our kernel would take (on CUDA): the decision without the device."""
    from mapstream.attention.dense import _kernel_takes

    def qkv(shape=(1, 4, 9, 64), dtype=torch.bfloat16, keys=9):
        q = torch.randn(shape, dtype=dtype)
        kv = torch.randn(shape[0], shape[1], keys, shape[3], dtype=dtype)
        return q, kv, kv.clone()

    assert _kernel_takes(*qkv())
    assert _kernel_takes(*qkv(keys=31))  # keys need not match queries
    assert _kernel_takes(*qkv(dtype=torch.float16))
    assert not _kernel_takes(*qkv(shape=(2, 4, 9, 64)))  # a batch of frames: SDPA
    assert not _kernel_takes(*qkv(dtype=torch.float32))
    assert not _kernel_takes(*qkv(shape=(1, 4, 9, 48)))  # head dim not a power of two
    assert not _kernel_takes(*qkv(keys=0))
    q, k, v = qkv()
    assert not _kernel_takes(q, k[:, :2], v[:, :2])  # heads differ
    assert not _kernel_takes(q, k, v[:, :, :5])  # K and V lengths differ
    assert not _kernel_takes(q, k, v.float())
    assert not _kernel_takes(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)  # last stride


def test_plain_pytorch_turns_the_fused_kernels_off_inside_only():
    import threading

    from mapstream.attention.fused import fused_kernels_allowed, plain_pytorch

    assert fused_kernels_allowed()
    other = []
    with plain_pytorch():
        assert not fused_kernels_allowed()
        thread = threading.Thread(target=lambda: other.append(fused_kernels_allowed()))
        thread.start()
        thread.join()
    assert other == [True]  # another thread keeps its own setting
    assert fused_kernels_allowed()
    with pytest.raises(RuntimeError):
        with plain_pytorch():
            raise RuntimeError("boom")
    assert fused_kernels_allowed()  # restored after an exception


def test_camera_head_attention_is_sdpa_inside_plain_pytorch(monkeypatch):
    """The camera head picks our rows kernel where it runs, but never for a reference pass;
    the choice is kept per setting, so leaving the context gives the kernel back."""
    import mapstream.attention.choice as choice
    from mapstream.attention.fused import plain_pytorch

    rows = object()
    monkeypatch.setattr(choice, "select_backend", lambda name, device, dtype: rows)
    monkeypatch.setattr(choice, "_chosen", {})
    head = mapstream.build_model("tiny").camera_head
    assert head.attention_backend(torch.device("cpu"), torch.float32) is rows
    with plain_pytorch():
        backend = head.attention_backend(torch.device("cpu"), torch.float32)
    assert isinstance(backend, SDPABackend) and not backend.cudnn
    assert head.attention_backend(torch.device("cpu"), torch.float32) is rows


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_balanced_grid_gives_spare_slots_the_key_tails():
    """(programs, tails a spare program walks): at the protocol's shape (978 queries in
    64-row blocks, 16 heads = 256 row blocks) an H200 holds 264 programs, so 8 spare
    programs take 32 tails each; with no spare slot the plain grid runs (None)."""
    from mapstream.attention.triton_flash import KernelConfig, balanced_grid

    def grid(n_q, heads, slots):
        return balanced_grid(n_q, heads, torch.device("cpu"), KernelConfig(balance=True, slots=slots))

    assert grid(978, 16, 264) == (264, 32)
    assert grid(978, 16, 256) is None and grid(978, 16, 200) is None
    assert grid(978, 16, 257) == (257, 256)
    assert grid(300, 16, 264) == (160, 1)  # 80 row blocks: each tail its own spare program
    assert grid(978, 16, 300) == (256 + 43, 6)  # 44 spares would take 6 each: 43 needed
    # Off CUDA nothing tells the resident slots, unless given: no balancing.
    assert balanced_grid(978, 16, torch.device("cpu"), KernelConfig(balance=True)) is None


def test_attend_into_stores_the_result_in_the_given_tensor():
    """The default `attend_into` (SDPA here) writes `attend`'s result into `out`, whatever
    its strides, and returns it."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 3, n, 8, generator=g) for n in (5, 7, 7))
    out = torch.full((1, 5, 3, 8), float("nan")).transpose(1, 2)  # token-major storage
    backend = SDPABackend()
    assert backend.attend_into(q, k, v, out) is out
    assert torch.equal(out, backend.attend(q, k, v))
