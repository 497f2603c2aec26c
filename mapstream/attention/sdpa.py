"""PyTorch scaled_dot_product_attention: runs everywhere; the reference backend."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .backend import AttentionBackend, KeyNormHint, device_reasons

__all__ = ["SDPABackend"]

_WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class SDPABackend(AttentionBackend):
    name = "sdpa"
    description = "torch.nn.functional.scaled_dot_product_attention (CPU and CUDA)"

    def __init__(self, *, cudnn: bool = True) -> None:
        """cudnn=False keeps PyTorch from choosing its cuDNN kernel on CUDA. cuDNN builds a
        plan on the host for every new key count, which costs milliseconds: fine when shapes
        repeat, ruinous for a small attention whose key count grows every frame (the camera
        head in bf16, 16 calls a frame)."""
        self.cudnn = cudnn

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        return device_reasons(device, cuda_only=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_norm: KeyNormHint | None = None) -> torch.Tensor:
        # Compute in the cache's dtype: casting q is cheap, casting the cache is not.
        if q.dtype != k.dtype:
            q = q.to(k.dtype)
        if v.dtype != k.dtype:
            v = v.to(k.dtype)
        if self.cudnn or q.device.type != "cuda":
            return F.scaled_dot_product_attention(q, k, v)
        with sdpa_kernel(_WITHOUT_CUDNN):
            return F.scaled_dot_product_attention(q, k, v)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cudnn={self.cudnn})"
