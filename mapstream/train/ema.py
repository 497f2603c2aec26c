"""An exponential moving average of the trained parameters.

The average of weights over the last ~1 / (1 - decay) steps is usually a better model than
the last weights, whose noise follows the last batches. Only trained parameters are averaged
(frozen ones equal their average); for LoRA runs the adapters' factors are averaged.

The decay warms up: update n (from 0) uses min(decay, (1 + n) / (10 + n)). A constant decay
would keep the initial weights in the average with weight decay^n (15 % after 1900 steps at
0.999), and a blend of random and trained weights is a worse model than either; with the
warm-up the average forgets its start as fast as it averages its recent past.
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
        self.updates = 0
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def current_decay(self) -> float:
        """The decay the next update uses (see the module docstring)."""
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        weight = 1.0 - self.current_decay()
        for name, p in model.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(p.detach(), weight)
        self.updates += 1

    def state_dict(self) -> dict[str, object]:
        return {"shadow": dict(self.shadow), "updates": self.updates}

    def load_state_dict(self, state: dict[str, object]) -> None:
        shadow = state["shadow"]
        if set(shadow) != set(self.shadow):
            raise ValueError("the checkpoint's EMA holds other parameters than this run trains")
        for name, value in shadow.items():
            self.shadow[name].copy_(value)
        self.updates = int(state["updates"])

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
