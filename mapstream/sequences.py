"""Batches of independent sequences, run one after another."""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["each_sequence"]


def each_sequence(images: torch.Tensor, run: Callable[[torch.Tensor], dict[str, Any]]) -> dict[str, Any]:
    """`run(sequence)` on every sequence [1, S, 3, H, W] of the batch `images`, one after
    another; tensors of the outputs are concatenated along the batch, plain values (settings
    echoed back) kept once when every sequence gave the same, anything else (e.g. the raw
    windows) listed per sequence."""
    if images.shape[0] == 1:
        return run(images)
    outs = [run(images[b : b + 1]) for b in range(images.shape[0])]
    merged: dict[str, Any] = {}
    for key in outs[0]:
        values = [out[key] for out in outs]
        if isinstance(values[0], torch.Tensor):
            merged[key] = torch.cat(values)
        else:
            plain = all(isinstance(v, (str, int, float, bool, type(None))) for v in values)
            merged[key] = values[0] if plain and all(v == values[0] for v in values[1:]) else values
    return merged
