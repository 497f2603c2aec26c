"""The attention-backend interface.

A backend computes softmax attention of queries over a set of keys/values handed over as
tensors (views into the cache; order of keys is irrelevant, there is no mask). It never
sees or changes cache bookkeeping. Backends state what they cannot do through
`unsupported_reasons`, so a selector can explain its choice.

Every call takes an optional `key_norm` (`KeyNormHint`): an estimate of the longest key's
Euclidean norm, which a caller knows when its keys leave a LayerNorm (qk-norm;
`layers.layer_norm_bound`). It is a hint: a backend may use it to save work (ours fixes each
row's softmax reference point in advance), the result stays the same to rounding, and a
wrong estimate may cost time, never accuracy; the hint's counter says how often it did.
Backends that cannot use it ignore it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = ["AttentionBackend", "KeyNormHint", "device_reasons"]


def device_reasons(device: torch.device, *, cuda_only: bool) -> list[str]:
    """Why no backend could run on `device` (a CUDA device this PyTorch does not see), and
    with `cuda_only` why a CUDA-only backend cannot run there."""
    if device.type == "cuda":
        return [] if torch.cuda.is_available() else ["this PyTorch sees no CUDA GPU"]
    return [f"needs a CUDA device (got {device.type})"] if cuda_only else []


@dataclass(frozen=True)
class KeyNormHint:
    """What a caller knows about the keys of an attention call. `bound`: an estimate of the
    longest key's Euclidean norm. `repairs`: an int32 tensor [1] on the keys' device, or
    None, that a backend using the bound adds to for every block of query rows it had to
    compute again because the estimate put their softmax weights out of range."""

    bound: float
    repairs: torch.Tensor | None = None


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
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_norm: KeyNormHint | None = None) -> torch.Tensor:
        """q [1, H, Nq, D], k/v [1, H, Nk, D] (any strides with a unit last stride) ->
        out [1, H, Nq, D] in q's dtype, scale 1/sqrt(D), no mask."""

    def attend_into(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, key_norm: KeyNormHint | None = None
    ) -> torch.Tensor:
        """`attend` with the result stored in `out` [1, H, Nq, D] (any strides), which is
        returned: a replayed CUDA graph that reads `out` then needs no copy of the result.
        This default copies; backends that can write there directly do."""
        return out.copy_(self.attend(q, k, v, key_norm=key_norm))

    def attend_range(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_range: torch.Tensor, *, key_norm: KeyNormHint | None = None
    ) -> torch.Tensor:
        """Attention over keys [lo, hi) of k/v [1, H, T, D], with (lo, hi) = kv_range, an int
        tensor [2] on the device (no host sync, graph-safe). Same result as
        `attend(q, k[:, :, lo:hi], v[:, :, lo:hi])`.

        This default is plain masked attention over all T keys with fp32 scores and
        softmax (as fused kernels keep them): time and memory grow with Nq x T, which suits
        small problems (the camera head: one query a frame over about a thousand keys, where
        a fused masked kernel is slower still). Backends with `device_range` read
        only the range.
        """
        out_dtype = q.dtype
        position = torch.arange(k.shape[-2], device=k.device)
        hidden = (position < kv_range[0]) | (position >= kv_range[1])
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        weights = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
        return torch.matmul(weights, v.float()).to(out_dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
