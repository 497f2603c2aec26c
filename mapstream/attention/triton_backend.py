"""Our Triton kernels as attention backends (CUDA only): the flash-attention kernel
(`triton_flash.py`) for the aggregator, the rows kernel (`triton_rows.py`) for the camera
head's few queries.

Imported lazily: a missing Triton never breaks `import mapstream`.
"""
from __future__ import annotations

import importlib.util

import torch

from .backend import AttentionBackend, KeyNormHint, device_reasons

__all__ = ["TritonBackend", "TritonRowsBackend"]


def _triton_reasons(device: torch.device) -> list[str]:
    reasons = device_reasons(device, cuda_only=True)
    if importlib.util.find_spec("triton") is None:
        reasons.append("the triton package is not installed")
    return reasons


class _KernelBackend(AttentionBackend):
    """A backend around one of our kernels `fn(q, k, v, kv_range=..., **hints)` on [H, N, D]
    views; `takes_key_norm`: the kernel uses the key-norm hint."""

    takes_key_norm = False

    def __init__(self, kernel) -> None:
        self._kernel = kernel

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_norm: KeyNormHint | None = None) -> torch.Tensor:
        return self._one_sequence(q, k, v, None, key_norm)

    def attend_range(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_range: torch.Tensor, *, key_norm: KeyNormHint | None = None
    ) -> torch.Tensor:
        return self._one_sequence(q, k, v, kv_range, key_norm)

    def _hints(self, key_norm: KeyNormHint | None) -> dict:
        if not self.takes_key_norm or key_norm is None:
            return {}
        return {"key_norm": key_norm.bound, "repairs": key_norm.repairs}

    def _one_sequence(self, q, k, v, kv_range, key_norm) -> torch.Tensor:
        if q.shape[0] != 1:
            raise ValueError(f"the {self.name} backend serves one sequence at a time (batch size 1)")
        return self._kernel(q[0], k[0], v[0], kv_range=kv_range, **self._hints(key_norm)).unsqueeze(0)


class TritonBackend(_KernelBackend):
    name = "triton"
    description = "mapstream's Triton flash attention over the strided cache view (CUDA sm80+, fp16/bf16)"
    device_range = True
    takes_key_norm = True

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        reasons = _triton_reasons(device)
        if device.type == "cuda" and not reasons and torch.cuda.get_device_capability(device) < (8, 0):
            reasons.append("needs compute capability 8.0 or newer (bf16 tensor cores)")
        if dtype not in (torch.float16, torch.bfloat16):
            reasons.append(f"needs fp16/bf16 K/V (got {dtype})")
        return reasons

    def __init__(self) -> None:
        from .triton_flash import flash_attention  # lazy: only when selected

        super().__init__(flash_attention)

    def attend_into(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, *, key_norm: KeyNormHint | None = None
    ) -> torch.Tensor:
        token_major = out[0].transpose(0, 1)  # the kernel's output layout: [Nq, H, D] storage
        if q.shape[0] != 1 or out.shape != q.shape or not token_major.is_contiguous():
            return super().attend_into(q, k, v, out, key_norm=key_norm)
        self._kernel(q[0], k[0], v[0], out=token_major, **self._hints(key_norm))
        return out


class TritonRowsBackend(_KernelBackend):
    name = "triton-rows"
    description = ("mapstream's Triton kernel for a few queries over a key range read on the device, "
                   "fp32 arithmetic, any float dtype (CUDA; the camera head)")
    device_range = True

    @classmethod
    def unsupported_reasons(cls, device: torch.device, dtype: torch.dtype) -> list[str]:
        reasons = _triton_reasons(device)
        if not dtype.is_floating_point:
            reasons.append(f"needs floating-point K/V (got {dtype})")
        return reasons

    def __init__(self) -> None:
        from .triton_rows import rows_attention  # lazy: only when selected

        super().__init__(rows_attention)
