"""torch.compile of the per-frame parts whose shapes are static within a phase.

The ViT blocks, the frame blocks and the global blocks' parts before and after their cache
attention are compiled; the cache attention itself (its key count changes every frame) and
the heads stay eager, so compilation never sees a dynamic shape.
"""
from __future__ import annotations

import torch

from .gct import GCTStream

__all__ = ["compile_model"]


def compile_model(model: GCTStream, *, backend: str = "inductor", mode: str | None = None) -> GCTStream:
    """Compile `model`'s static parts in place (idempotent) and return it."""
    if getattr(model, "_mapstream_compiled", False):
        return model
    agg = model.aggregator

    def compiled(fn):
        return torch.compile(fn, backend=backend, mode=mode, dynamic=False)

    for blocks in (agg.patch_embed.blocks, agg.frame_blocks):
        for i, block in enumerate(blocks):
            blocks[i] = compiled(block)
    for block in agg.global_blocks:
        block.attention_inputs = compiled(block.attention_inputs)
        block.attention_output = compiled(block.attention_output)
    model._mapstream_compiled = True
    return model
