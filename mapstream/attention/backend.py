"""The attention-backend interface.

A backend computes softmax attention of queries over a set of keys/values handed over as
tensors (views into the cache; order of keys is irrelevant, there is no mask). It never
sees or changes cache bookkeeping. Backends state what they cannot do through
`unsupported_reasons`, so a selector can explain its choice.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
import torch.nn.functional as F

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    device_range: ClassVar[bool] = False
    """`attend_range` reads the key range on the device at the cost of the range alone, so
    one captured CUDA graph serves every cache state (otherwise it masks all keys)."""

    @classmethod
    @abstractmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        """Why this backend cannot run on `device` with `dtype` (empty list: it can)."""

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, H, Nq, D], k/v [1, H, Nk, D] (any strides with a unit last stride) ->
        out [1, H, Nq, D] in q's dtype, scale 1/sqrt(D), no mask."""

    def attend_range(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_range: torch.Tensor) -> torch.Tensor:
        """Attention over keys [lo, hi) of k/v [1, H, T, D], with (lo, hi) = kv_range, an int
        tensor [2] on the device (no host sync, graph-safe). Same result as
        `attend(q, k[:, :, lo:hi], v[:, :, lo:hi])`.

        This default masks the keys outside the range, so it costs attention over all T;
        backends with `device_range` read only the range.
        """
        position = torch.arange(k.shape[-2], device=k.device)
        visible = (position >= kv_range[0]) & (position < kv_range[1])
        if q.dtype != k.dtype:
            q = q.to(k.dtype)
        return F.scaled_dot_product_attention(q, k, v.to(k.dtype), attn_mask=visible[None, :])

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
