"""An exponential moving average of the trained parameters.

The average of weights over the last ~1 / (1 - decay) steps is usually a better model than
the last weights, whose noise follows the last batches. Only trained parameters are averaged
(frozen ones equal their average); for LoRA runs the adapters' factors are averaged.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    """`shadow <- decay * shadow + (1 - decay) * param` after each step, for the trained
    parameters of `model` (by name)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(p.detach(), 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self.shadow):
            raise ValueError("the checkpoint's EMA holds other parameters than this run trains")
        for name, value in state.items():
            self.shadow[name].copy_(value)

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """`model` with the averaged values in place of its parameters, restored afterwards."""
        params = dict(model.named_parameters())
        kept = {n: params[n].detach().clone() for n in self.shadow}
        try:
            with torch.no_grad():
                for n, v in self.shadow.items():
                    params[n].copy_(v)
            yield model
        finally:
            with torch.no_grad():
                for n, v in kept.items():
                    params[n].copy_(v)
