"""torch.compile of the per-frame parts whose shapes are static within a phase, chosen when
the network is built (`GCTNetwork(..., compile=CompileOptions())`, `load_model(...,
compile=True)`).

Each module names its compiled parts (`compile_parts`): the ViT's blocks as one function, the
aggregator's work between two cache attentions, the frame blocks, the halves around the cache
attention of the global blocks and of the camera head's trunk blocks, the camera head's steps
around its trunk, and the camera matrices of a prediction. The cache attentions themselves
(their key counts change every frame) stay eager, so compilation never sees a dynamic shape.
The DPT heads stay eager unless `heads=True`: their fp32 convolutions run slower compiled
than cuDNN's eager choice, more than the fused elementwise work saves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["CompileOptions", "compiler"]


@dataclass(frozen=True)
class CompileOptions:
    """How a network built to be compiled compiles its static parts."""

    backend: str = "inductor"
    """torch.compile's backend ("eager" traces only: a quick check of the wiring)."""
    mode: str | None = None
    """torch.compile's mode (None, "reduce-overhead", "max-autotune", ...)."""
    heads: bool = False
    """Compile the DPT heads too."""
    shape_padding: bool = False
    """Let Inductor pad the products' row counts to a multiple of 8, which costs a copy of the
    product's input in every block; off, every block runs the same products whatever a timing
    made while compiling said."""


def compiler(options: CompileOptions) -> Callable[[Callable], Callable]:
    """The function that compiles one part as `options` say (shapes static: dynamic=False)."""
    if options.backend != "inductor":
        return lambda fn: torch.compile(fn, backend=options.backend, mode=options.mode, dynamic=False)
    inductor = dict(torch._inductor.list_mode_options(options.mode)) if options.mode else {}
    inductor["shape_padding"] = options.shape_padding
    return lambda fn: torch.compile(fn, backend="inductor", options=inductor, dynamic=False)
