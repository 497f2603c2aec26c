"""Whether the blocks' fused CUDA kernels may serve a call (`layers.heads.qkv_heads`,
`attention.dense.dense_attention`).

They serve every call they apply to. Inside `plain_pytorch()` they step aside for the PyTorch
composition they are tested against, so that a reference pass — the benchmark's correctness
check — shares no kernel with the fast path it checks. A context variable, so it covers the
calls made inside the `with` and nothing else (other threads keep their own). torch.compile
fixes the choice when it traces a block: compiled code keeps the kernels, which is why
reference passes run eagerly (as `mapstream.bench.reference_samples` does, before any
compilation).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch

__all__ = ["fused_kernels_allowed", "plain_pytorch"]

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
