"""torch.compile of the per-frame parts whose shapes are static within a phase.

The ViT blocks, the frame blocks, the parts before and after the cache attention of the
global blocks and of the camera head's trunk blocks, and the camera head's steps around its
trunk are compiled; the cache attentions themselves (their key counts change every frame)
stay eager, so compilation never sees a dynamic shape. The DPT heads stay eager by default:
compiled, their fp32 convolutions measured 2.7 ms a frame against 1.0 ms eager on an H200
(docs/BENCHMARKS.md), more than the fused elementwise work saves; `heads=True` compiles
them anyway.
"""
from __future__ import annotations

import torch

from .gct import GCTStream

__all__ = ["compile_model"]


def compile_model(
    model: GCTStream, *, backend: str = "inductor", mode: str | None = None, heads: bool = False
) -> GCTStream:
    """Compile `model`'s static parts in place (idempotent) and return it; `heads=True`
    compiles the DPT heads too."""
    if getattr(model, "_mapstream_compiled", False):
        return model
    agg = model.aggregator

    def compiled(fn):
        return torch.compile(fn, backend=backend, mode=mode, dynamic=False)

    for blocks in (agg.patch_embed.blocks, agg.frame_blocks):
        for i, block in enumerate(blocks):
            blocks[i] = compiled(block)
    trunks = [agg.global_blocks]
    if model.camera_head is not None:
        trunks.append(model.camera_head.trunk)
    for blocks in trunks:
        for block in blocks:
            block.attention_inputs = compiled(block.attention_inputs)
            block.attention_output = compiled(block.attention_output)
    if model.camera_head is not None:
        camera = model.camera_head
        for name in ("normalize", "modulate", "update_pose"):
            setattr(camera, name, compiled(getattr(camera, name)))
    for head in (model.depth_head, model.point_head) if heads else ():
        if head is not None:
            head._forward_frames = compiled(head._forward_frames)
    model._mapstream_compiled = True
    return model
