"""Backend registry and capability-based selection."""
from __future__ import annotations

import importlib
import logging

import torch

from .backend import AttentionBackend

__all__ = ["BACKENDS", "select_backend", "available_backends"]

log = logging.getLogger(__name__)

# name -> "module:Class", imported only when needed.
BACKENDS: dict[str, str] = {
    "sdpa": "mapstream.attention.sdpa:SDPABackend",
    "flashinfer": "mapstream.attention.flashinfer:FlashInferBackend",
    "triton": "mapstream.attention.triton_backend:TritonBackend",
    # A few queries a call (the camera head picks it where it runs); not in "auto", which
    # serves the aggregator's ~1k queries a frame.
    "triton-rows": "mapstream.attention.triton_backend:TritonRowsBackend",
}
# Preference order for "auto": fastest first at the protocol's shape on a GPU, the
# reference last.
_AUTO_ORDER = ("triton", "flashinfer", "sdpa")


def _load(name: str) -> type[AttentionBackend]:
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def available_backends(device: torch.device, dtype: torch.dtype) -> dict[str, list[str]]:
    """Every backend with the reasons it cannot serve (device, dtype); empty = usable."""
    return {name: _load(name).unsupported_reasons(device, dtype) for name in BACKENDS}


def select_backend(name: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """Instantiate backend `name` (or the best usable one for "auto"), or raise with reasons."""
    device = torch.device(device)
    if name == "auto":
        rejected = {}
        for candidate in _AUTO_ORDER:
            reasons = _load(candidate).unsupported_reasons(device, dtype)
            if not reasons:
                log.info("attention backend: %s (auto)", candidate)
                return _load(candidate)()
            rejected[candidate] = reasons
        raise RuntimeError(f"no attention backend can serve {device}/{dtype}: {rejected}")
    if name not in BACKENDS:
        raise ValueError(f"Unknown attention backend: {name!r}. Valid options are: auto, {', '.join(BACKENDS)}")
    reasons = _load(name).unsupported_reasons(device, dtype)
    if reasons:
        raise ValueError(f"attention backend {name!r} cannot run on {device} with {dtype}: {'; '.join(reasons)}")
    return _load(name)()
