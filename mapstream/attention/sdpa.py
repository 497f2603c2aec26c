"""PyTorch scaled_dot_product_attention: runs everywhere; the reference backend."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import AttentionBackend

__all__ = ["SDPABackend"]


class SDPABackend(AttentionBackend):
    name = "sdpa"
    description = "torch.nn.functional.scaled_dot_product_attention (CPU and CUDA)"

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        return []

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Compute in the cache's dtype: casting q is cheap, casting the cache is not.
        if q.dtype != k.dtype:
            q = q.to(k.dtype)
        if v.dtype != k.dtype:
            v = v.to(k.dtype)
        return F.scaled_dot_product_attention(q, k, v)
