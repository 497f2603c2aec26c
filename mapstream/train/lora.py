"""What a run trains: the fine-tuning modes, and LoRA adapters on the trunk's attention projections.

A LoRA adapter is a parametrization of a projection's `weight` (`torch.nn.utils.parametrize`):
the layer's weight reads `W + (alpha / rank) B A` wherever the network uses it, including the
fused kernels that take `linear.weight` directly, so no forward path needs to know about
adapters. `A` starts random and `B` at zero, so an adapted model starts as the base model.
`merged_state_dict` writes the adapted weights under the official keys, which is what
`mapstream.load_model` reads.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

__all__ = ["LoRA", "LORA_TARGETS", "add_lora", "select_trainable", "merged_state_dict", "HEADS"]

LORA_TARGETS = ("aggregator.frame_blocks", "aggregator.global_blocks")
"""The trunk's blocks whose attention projections (`attn.qkv`, `attn.proj`) get adapters."""
HEADS = ("camera_head", "depth_head", "point_head")
# The ViT's mask token is a pretraining leftover the forward never reads: it takes no part in
# the loss, and DDP would wait forever for its gradient.
_UNUSED = ("aggregator.patch_embed.mask_token",)


class LoRA(nn.Module):
    """`weight -> weight + (alpha / rank) B A` for a `[out, in]` weight."""

    def __init__(self, out_features: int, in_features: int, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        a = torch.empty(rank, in_features)
        bound = 1 / math.sqrt(in_features)  # nn.Linear's own initial range
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank))
        self.scale = alpha / rank

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + (self.scale * (self.lora_B @ self.lora_A)).to(weight.dtype)


def add_lora(model: nn.Module, rank: int, alpha: float, seed: int = 0) -> list[str]:
    """Adapters on every `attn.qkv` and `attn.proj` under LORA_TARGETS, the base weights frozen;
    returns the adapted layers' names."""
    generator = torch.Generator().manual_seed(seed)
    adapted = []
    for name, module in model.named_modules():
        if not name.startswith(LORA_TARGETS) or not name.endswith(("attn.qkv", "attn.proj")):
            continue
        if not isinstance(module, nn.Linear) or parametrize.is_parametrized(module, "weight"):
            continue
        lora = LoRA(module.out_features, module.in_features, rank, alpha, generator)
        lora.to(device=module.weight.device)
        parametrize.register_parametrization(module, "weight", lora)
        adapted.append(name)
    if not adapted:
        raise ValueError("the model has no trunk attention projection to adapt")
    return adapted


def select_trainable(model: nn.Module, mode: str, *, freeze_patch_embed: bool = False,
                     freeze_frame_blocks: bool = False) -> list[str]:
    """Set `requires_grad` for fine-tuning `mode` ("full", "heads", "lora": see TrainConfig.finetune);
    returns the trained parameters' names."""
    frozen = list(_UNUSED)
    if freeze_patch_embed:
        frozen.append("aggregator.patch_embed.")
    if freeze_frame_blocks:
        frozen.append("aggregator.frame_blocks.")
    names = []
    for name, p in model.named_parameters():
        if mode == "lora":
            train = ".lora_A" in name or ".lora_B" in name
        elif mode == "heads":
            train = name.startswith(HEADS)
        elif mode == "full":
            train = not name.startswith(tuple(frozen))
        else:
            raise ValueError(f"unknown fine-tuning mode {mode!r}")
        train = train and not name.startswith(_UNUSED) and not name.endswith("parametrizations.weight.original")
        p.requires_grad_(train)
        if train:
            names.append(name)
    if not names:
        raise ValueError(f"fine-tuning mode {mode!r} leaves nothing to train")
    return names


@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict under its own keys, each adapted weight with its adapter merged in."""
    out: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    for key, value in model.state_dict().items():
        if ".parametrizations." not in key:
            out[key] = value.detach()
        elif key.endswith(".parametrizations.weight.original"):
            owner = key[: -len(".parametrizations.weight.original")]
            out[owner + ".weight"] = modules[owner].weight.detach()
    return out
