"""The trunk's linear layers with 8-bit weights, through torchao.

    "int8"   each weight stored as int8 with a scale per output row; products run in the
             trunk's precision on the weights read back (weight-only: half the bytes of bf16
             weights, on any device)
    "fp8"    e4m3 weights, and each activation row scaled into e4m3 on the fly: products on
             FP8 tensor cores (CUDA compute capability 8.9 and up)

Only `nn.Linear` layers of at least `MIN_FEATURES` inputs and outputs are quantized (the
trunk's qkv, projection and MLP layers); norms, embeddings and the heads keep their dtype.
A quantized weight is a torchao tensor subclass: our fused linear kernels, which read a
weight's storage directly, leave such layers to their own forward (`is_quantized`).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

__all__ = ["MIN_FEATURES", "TRUNK_WEIGHTS", "eligible_linears", "is_quantized", "quantize_linears", "quantized_bytes",
           "tensor_bytes"]

log = logging.getLogger(__name__)

TRUNK_WEIGHTS = ("auto", "int8", "fp8")
"""How the trunk's linear weights are stored: "auto" (in the trunk's precision), "int8", "fp8"."""

MIN_FEATURES = 128
"""Linear layers with fewer inputs or outputs keep their dtype (too few bytes to matter)."""

# Bytes a quantized weight holds besides one a value: per output row, a float32 scale and an
# int8 zero point (int8), or a float32 scale (fp8).
ROW_OVERHEAD = {"int8": 5, "fp8": 4}


def is_quantized(weight: torch.Tensor) -> bool:
    """Whether `weight` is held in a quantized form (a tensor subclass) rather than plainly."""
    return type(weight) not in (torch.Tensor, nn.Parameter)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes `t` holds: its storage's, or for a tensor subclass the sum of its inner tensors'."""
    if not is_quantized(t) or not hasattr(t, "__tensor_flatten__"):
        return t.numel() * t.element_size()
    names, _ = t.__tensor_flatten__()
    return sum(tensor_bytes(getattr(t, name)) for name in names)


def eligible_linears(module: nn.Module) -> list[nn.Linear]:
    """The linear layers of `module` that `quantize_linears` quantizes."""
    return [m for m in module.modules() if type(m) is nn.Linear and min(m.in_features, m.out_features) >= MIN_FEATURES]


def quantized_bytes(linear: nn.Linear, mode: str) -> int:
    """Bytes `linear`'s weight holds once quantized as `mode` ("int8" or "fp8")."""
    return linear.weight.numel() + linear.out_features * ROW_OVERHEAD[mode]


def _config(mode: str, device: torch.device):
    try:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int8WeightOnlyConfig
    except ImportError as err:
        raise RuntimeError(
            f"trunk weights {mode!r} are quantized by torchao, which is not installed: pip install torchao"
        ) from err
    if mode == "int8":
        return Int8WeightOnlyConfig()
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise ValueError(
            f"trunk weights 'fp8' need FP8 tensor cores (a CUDA GPU of compute capability 8.9 or more: Ada, "
            f"Hopper, Blackwell); {where} has none: use 'int8' (weight-only) or 'auto'"
        )
    return Float8DynamicActivationFloat8WeightConfig()


def quantize_linears(module: nn.Module, mode: str) -> int:
    """Quantize `module`'s large linear layers in place as `mode` says (module docstring);
    their weights must already be in the dtype they compute in. Returns how many were."""
    if mode not in TRUNK_WEIGHTS:
        raise ValueError(f"trunk weights must be one of {', '.join(TRUNK_WEIGHTS)}, got {mode!r}")
    if mode == "auto":
        return 0
    device = next(module.parameters()).device
    config = _config(mode, device)
    from torchao.quantization import quantize_

    chosen = [m for m in eligible_linears(module) if not is_quantized(m.weight)]
    picked = set(map(id, chosen))
    quantize_(module, config, filter_fn=lambda m, fqn: id(m) in picked)
    log.info("trunk: %d linear layers with %s weights", len(chosen), mode)
    return len(chosen)
