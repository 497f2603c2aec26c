"""The one place that chooses attention backends, and keeps each choice for reuse.

Two kinds of cache attention run per step. The aggregator's global blocks attend with about
a thousand queries a frame: the backend is the one a stream's configuration names ("auto":
the fastest usable, `select_backend`). The camera head's trunk attends with one query a
frame over a key count that grows every frame: our Triton rows kernel where it runs (one
kernel a call, fp32 arithmetic, the key range read on the device), else SDPA without cuDNN,
which plans on the host for every new key count. Inside `plain_pytorch()` (reference passes)
the camera head always takes the latter.
"""
from __future__ import annotations

import threading

import torch

from .backend import AttentionBackend
from .fused import fused_kernels_allowed
from .registry import select_backend
from .sdpa import SDPABackend

__all__ = ["frame_backend", "camera_backend"]

_chosen: dict[tuple, AttentionBackend] = {}
_lock = threading.Lock()


def frame_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    """The backend `name` ("auto", "sdpa", "triton", ...) for the aggregator's cache attention
    with K/V of `dtype` on `device`; chosen once per (name, device type, dtype)."""
    key = ("frame", name, torch.device(device).type, dtype)
    with _lock:
        if key not in _chosen:
            _chosen[key] = select_backend(name, torch.device(device), dtype)
        return _chosen[key]


def camera_backend(device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    """The backend of the camera head's cache attention on `device` for K/V of `dtype`."""
    ours = fused_kernels_allowed()
    key = ("camera", torch.device(device).type, dtype, ours)
    with _lock:
        if key not in _chosen:
            backend: AttentionBackend = SDPABackend(cudnn=False)
            if ours:
                try:
                    backend = select_backend("triton-rows", torch.device(device), dtype)
                except ValueError:  # it says why (no CUDA, no Triton); the fallback serves every case
                    pass
            _chosen[key] = backend
        return _chosen[key]
