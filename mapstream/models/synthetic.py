"""Deterministic synthetic weights (the golden data's weight rule, `crc32-randn-v2-fov`).

Every tensor is drawn from its own CPU generator seeded by the CRC-32 of its state-dict key,
so the values do not depend on model construction order. Used for tests and benchmarks
(speed does not depend on weight values); never a substitute for trained weights.
"""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn

__all__ = ["RULE_VERSION", "synthetic_tensor", "synthetic_state_dict", "fill_synthetic_"]

RULE_VERSION = "crc32-randn-v2-fov"

# The pose branch's last layer: its rows 7, 8 produce the ReLU-activated fields of view.
# Scaled and shifted by exact binary fractions so random weights give FoVs near 1 rad
# (otherwise most are clipped to 0 and the focal length is infinite).
_FOV_WEIGHT = "camera_head.pose_branch.fc2.weight"
_FOV_BIAS = "camera_head.pose_branch.fc2.bias"


def synthetic_tensor(key: str, shape: tuple[int, ...] | torch.Size, salt: str = "") -> torch.Tensor:
    """The float32 value of state-dict entry `key` under the rule."""
    shape = tuple(int(s) for s in shape)
    seed = zlib.crc32((f"{salt}:{key}" if salt else key).encode("utf-8"))
    z = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    if key.endswith("weight") and len(shape) >= 2:
        value = z * (1.0 / math.sqrt(math.prod(shape[1:])))
    elif (key.endswith("weight") or key.endswith("gamma")) and len(shape) == 1:
        value = z * 0.02 + 1.0
    else:  # biases, tokens, positional embeddings
        value = z * 0.02
    if key == _FOV_WEIGHT:
        value[7:9] = value[7:9] * 0.0625
    elif key == _FOV_BIAS:
        value[7:9] = value[7:9] + 0.3125
    return value


def synthetic_state_dict(entries, salt: str = "") -> dict[str, torch.Tensor]:
    """State dict for (key, shape) pairs, e.g. `(k, v.shape) for k, v in model.state_dict().items()`."""
    return {key: synthetic_tensor(key, shape, salt) for key, shape in entries}


@torch.no_grad()
def fill_synthetic_(model: nn.Module, salt: str = "") -> nn.Module:
    """Fill every floating-point state-dict entry of `model` in place; returns the model."""
    for key, tensor in model.state_dict(keep_vars=True).items():
        if tensor.is_floating_point():
            tensor.data.copy_(synthetic_tensor(key, tensor.shape, salt).to(tensor.dtype))
    return model
