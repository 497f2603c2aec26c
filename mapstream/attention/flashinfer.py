"""FlashInfer single-request prefill over the cache's contiguous K/V view (CUDA only).

The cache hands attention one contiguous token range per layer, so the non-paged kernel
applies directly (the paged form would only add a page-table indirection). Imported
lazily: a missing FlashInfer never breaks `import mapstream`.
"""
from __future__ import annotations

import importlib.util

import torch

from .backend import AttentionBackend, KeyNormHint, device_reasons

__all__ = ["FlashInferBackend"]


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    description = "FlashInfer single_prefill_with_kv_cache over the contiguous cache view (CUDA, fp16/bf16)"

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        reasons = device_reasons(device, cuda_only=True)
        if dtype not in (torch.float16, torch.bfloat16):
            reasons.append(f"needs fp16/bf16 K/V (got {dtype})")
        if importlib.util.find_spec("flashinfer") is None:
            reasons.append("the flashinfer package is not installed (pip install flashinfer-python, or use backend auto / triton / sdpa)")
        return reasons

    def __init__(self) -> None:
        import flashinfer  # noqa: F401  (lazy: only when selected)

        self._fi = flashinfer

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_norm: KeyNormHint | None = None) -> torch.Tensor:
        # FlashInfer takes one request without a batch axis: q [Nq, H, D] (NHD), k/v in HND.
        dtype = k.dtype
        out = self._fi.single_prefill_with_kv_cache(
            q[0].transpose(0, 1).to(dtype).contiguous(),
            k[0],
            v[0],
            causal=False,
            kv_layout="HND",
            # fa2 explicitly: FlashInfer 0.5.3's fa3 single-prefill kernel dies with a
            # floating-point exception on Hopper, where "auto" would pick it.
            backend="fa2",
        )
        return out.transpose(0, 1).unsqueeze(0).to(q.dtype)
