"""Weights stored in 8 bits: each large matrix as int8 with one float32 scale per output row.

Half the bytes of float16, at no cost measurable in the shipped small model's quality
(docs/TRAINING.md, "The shipped small model"): what lets a network of about twice the parameters
fit the size allowed for weights shipped inside the package. A file in this form says so in
its safetensors metadata (``weight_storage: int8-rows``), and
`mapstream.checkpoint.read_state_dict` restores float weights on reading it, so every loader
(`load_model`, `mapstream run --model FILE`, training's `--model`) takes such a file as any other.

    tensors = quantize(model.state_dict())
    save_file(tensors, "model.safetensors", metadata={STORAGE_KEY: INT8_ROWS, "preset": "small"})
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["INT8_ROWS", "SCALE_SUFFIX", "STORAGE_KEY", "dequantize", "quantize"]

STORAGE_KEY = "weight_storage"
"""The metadata entry that names how a file's weights are stored."""

INT8_ROWS = "int8-rows"
"""Large floating tensors as int8, each row with its own float32 scale: a row is an output
channel (the first dimension), or for a tensor whose first dimension is 1 (a position table) a
vector of its last dimension."""

SCALE_SUFFIX = ".int8_row_scale"
"""A quantized tensor ``key``'s scales are stored under ``key + SCALE_SUFFIX``."""

MIN_NUMEL = 1024
"""Smaller tensors (norms, biases, layer scales, tokens) stay in their floating type: they are a
sliver of the bytes, and some of them set every activation's magnitude."""


def _quantizable(value: torch.Tensor, min_numel: int) -> bool:
    return value.is_floating_point() and value.ndim >= 2 and value.numel() >= min_numel


def _rows(value: torch.Tensor) -> int:
    return value.shape[0] if value.shape[0] > 1 else value.numel() // value.shape[-1]


def quantize(state: Mapping[str, torch.Tensor], *, min_numel: int = MIN_NUMEL) -> dict[str, torch.Tensor]:
    """`state` with every floating tensor of two or more dimensions and at least `min_numel`
    values rounded to int8 by rows (`INT8_ROWS`), symmetric about zero: a row's scale is
    its largest magnitude over 127, so each value is restored within half a scale step. Other
    tensors are kept as they are. Write the result with ``{STORAGE_KEY: INT8_ROWS}`` in the
    file's metadata."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith(SCALE_SUFFIX):
            raise ValueError(f"tensor {key!r} ends in {SCALE_SUFFIX!r}, the name 8-bit storage gives scales")
        if not _quantizable(value, min_numel):
            out[key] = value.detach().contiguous()
            continue
        rows = value.detach().to("cpu", torch.float32).reshape(_rows(value), -1)
        if not torch.isfinite(rows).all():
            raise ValueError(f"tensor {key!r} holds NaN or infinite values; 8-bit storage needs finite weights")
        scale = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        out[key] = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8).reshape(value.shape)
        out[key + SCALE_SUFFIX] = scale
    return out


def dequantize(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a file `quantize` wrote under the model's own key names, its 8-bit ones
    restored in float32 and the rest as stored. Raises ValueError when an int8 tensor and its
    scales do not come in pairs of matching rows."""
    scales = {key[: -len(SCALE_SUFFIX)]: value for key, value in tensors.items() if key.endswith(SCALE_SUFFIX)}
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if key.endswith(SCALE_SUFFIX):
            if key[: -len(SCALE_SUFFIX)] not in tensors:
                raise ValueError(f"8-bit scales {key!r} have no tensor {key[: -len(SCALE_SUFFIX)]!r}")
            continue
        if value.dtype != torch.int8:
            out[key] = value
            continue
        scale = scales.get(key)
        if scale is None:
            raise ValueError(f"8-bit tensor {key!r} has no scales ({key + SCALE_SUFFIX!r})")
        if scale.ndim != 1 or scale.numel() == 0 or value.numel() % scale.numel():
            raise ValueError(f"8-bit tensor {key!r} of shape {tuple(value.shape)} does not divide into rows for "
                             f"its scales of shape {tuple(scale.shape)}")
        rows = value.reshape(scale.numel(), -1).to(torch.float32) * scale.to(torch.float32)[:, None]
        out[key] = rows.reshape(value.shape)
    return out
