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
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v)
