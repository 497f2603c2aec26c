"""Whether our own Triton kernels may serve a call outside the attention backends: the
blocks' fused q/k/v heads (`layers.heads.qkv_heads`) and frame attention
(`attention.dense.dense_attention`), the DPT head's resize (`layers.resize.resize_bilinear`)
and convolution epilogues (`layers.conv_epilogue.conv_epilogue`), the cache's writes
(`cache.frame_write.write_frame_kv`) and the camera head's cache attention
(`CameraCausalHead.attention_backend`).

They serve every call they apply to. Inside `plain_pytorch()` they step aside for the PyTorch
code they are tested against, so that a reference pass — the benchmark's correctness check,
which also picks the SDPA backend for the cache attention — shares no kernel of ours with the
fast path it checks. A context variable, so it covers the calls made inside the `with` and
nothing else (other threads keep their own). torch.compile fixes the choice when it traces a
block: compiled code keeps the kernels, which is why reference passes run eagerly (as
`mapstream.bench.reference_samples` does, before any compilation).
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib.util
from typing import Iterator

import torch

__all__ = ["fused_kernels_allowed", "our_kernels_may_serve", "plain_pytorch"]

HAS_TRITON = importlib.util.find_spec("triton") is not None
_PLAIN = contextvars.ContextVar("mapstream_plain_pytorch", default=False)


@contextlib.contextmanager
def plain_pytorch() -> Iterator[None]:
    """Calls inside use PyTorch's composition instead of our fused kernels."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def fused_kernels_allowed() -> bool:
    """False inside `plain_pytorch()` (always True while torch.compile traces)."""
    return torch.compiler.is_compiling() or not _PLAIN.get()


def our_kernels_may_serve(t: torch.Tensor) -> bool:
    """Whether one of our Triton kernels may serve a call on `t`: Triton installed, `t` on
    CUDA, and not inside `plain_pytorch()` (each kernel checks its shapes itself)."""
    return HAS_TRITON and t.is_cuda and fused_kernels_allowed()
