"""Our Triton flash-attention kernel (`triton_flash.py`) as an attention backend (CUDA only).

Imported lazily: a missing Triton never breaks `import mapstream`.
"""
from __future__ import annotations

import importlib.util

import torch

from .backend import AttentionBackend

__all__ = ["TritonBackend"]


class TritonBackend(AttentionBackend):
    name = "triton"
    description = "mapstream's Triton flash attention over the strided cache view (CUDA sm80+, fp16/bf16)"
    device_range = True

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        reasons = []
        if device.type != "cuda":
            reasons.append(f"needs a CUDA device (got {device.type})")
        elif torch.cuda.get_device_capability(device) < (8, 0):
            reasons.append("needs compute capability 8.0 or newer (bf16 tensor cores)")
        if dtype not in (torch.float16, torch.bfloat16):
            reasons.append(f"needs fp16/bf16 K/V (got {dtype})")
        if importlib.util.find_spec("triton") is None:
            reasons.append("the triton package is not installed")
        return reasons

    def __init__(self) -> None:
        from .triton_flash import flash_attention  # lazy: only when selected

        self._flash = flash_attention

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._one_sequence(q, k, v, None)

    def attend_range(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_range: torch.Tensor) -> torch.Tensor:
        return self._one_sequence(q, k, v, kv_range)

    def _one_sequence(self, q, k, v, kv_range) -> torch.Tensor:
        if q.shape[0] != 1:
            raise ValueError("the triton backend serves one sequence at a time (batch size 1)")
        return self._flash(q[0], k[0], v[0], kv_range=kv_range).unsqueeze(0)
