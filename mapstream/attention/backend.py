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

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @classmethod
    @abstractmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        """Why this backend cannot run on `device` with `dtype` (empty list: it can)."""

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, H, Nq, D], k/v [1, H, Nk, D] (any strides with a unit last stride) ->
        out [1, H, Nq, D] in q's dtype, scale 1/sqrt(D), no mask."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
