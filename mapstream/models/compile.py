"""torch.compile of the per-frame parts whose shapes are static within a phase.

The ViT's blocks (as one function), the aggregator's work between two cache attentions
(`AggregatorStream.between_layers`), the frame blocks, the parts before and after the cache
attention of the global blocks and of the camera head's trunk blocks, the camera head's
steps around its trunk and the camera matrices of a prediction are compiled; the cache
attentions themselves (their key counts change every frame) stay eager, so compilation
never sees a dynamic shape. The DPT heads stay eager by default:
compiled, their fp32 convolutions measured 2.7 ms a frame against 1.0 ms eager on an H200
(docs/BENCHMARKS.md), more than the fused elementwise work saves; `heads=True` compiles
them anyway.
"""
from __future__ import annotations

import torch

from .gct import GCTStream

__all__ = ["compile_model"]


def compile_model(
    model: GCTStream, *, backend: str = "inductor", mode: str | None = None, heads: bool = False,
    shape_padding: bool = False,
) -> GCTStream:
    """Compile `model`'s static parts in place (idempotent) and return it; `heads=True`
    compiles the DPT heads too. shape_padding: let Inductor pad the products' row counts to
    a multiple of 8 (978 -> 984 tokens at 504x378), which costs a copy of the product's
    input in every block (see `_inductor_options`)."""
    if getattr(model, "_mapstream_compiled", False):
        return model
    agg = model.aggregator
    options = _inductor_options(mode, shape_padding) if backend == "inductor" else None

    def compiled(fn):
        if options is not None:
            return torch.compile(fn, backend=backend, options=options, dynamic=False)
        return torch.compile(fn, backend=backend, mode=mode, dynamic=False)

    # The ViT's blocks as one graph, the aggregator's work between two cache attentions as
    # another (one graph serves all layers: the blocks' weights are its inputs), so that
    # Inductor fuses each block's last residual add with the next block's first norm. The
    # frame blocks and global-block halves are also compiled one by one for the callers that
    # run a layer alone (the first and last layer, `enter_layer`/`leave_layer`).
    agg.patch_embed.run_blocks = compiled(agg.patch_embed.run_blocks)
    agg._between = compiled(agg._between)
    for i, block in enumerate(agg.frame_blocks):
        agg.frame_blocks[i] = compiled(block)
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
    model.camera_matrices = compiled(model.camera_matrices)
    for head in (model.depth_head, model.point_head) if heads else ():
        if head is not None:
            head._forward_frames = compiled(head._forward_frames)
    model._mapstream_compiled = True
    return model


def _inductor_options(mode: str | None, shape_padding: bool) -> dict:
    """Inductor's options of `mode`, with its padding of matrix products set.

    With padding on, Inductor times each product padded and unpadded while compiling and keeps
    the faster. In the 504x378 step it padded fc2's and the attention projection's inputs from
    978 to 984 rows in the aggregator's blocks (not in the ViT's, same shapes), each a copy of
    the input (3.7 and 2.3 µs on an H200). Off, the step measured 22.08 ms a frame against
    22.14 with it (frames interleaved, docs/BENCHMARKS.md, session 16): no slower, inside the
    noise. It stays off so that every block runs the same products whatever a timing made
    during compilation said."""
    options = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    options["shape_padding"] = shape_padding
    return options
