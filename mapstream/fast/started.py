"""The second half of a started graphed step (`StartedStep`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..validation import ValueCheck

if TYPE_CHECKING:
    from .graphs import GraphedStep

__all__ = ["StartedStep"]


class StartedStep:
    """The second half of a `GraphedStep.start`ed step: call it once, with the frame and
    state the step was started with, to run the rest (the cache attentions, the heads)."""

    def __init__(self, graphed: "GraphedStep", frame: torch.Tensor, first: tuple | None, values: ValueCheck | None) -> None:
        self._graphed, self._shape, self._first = graphed, frame.shape, first
        # The frame's value check started beside the first graph (`GraphedStep.start`; None
        # when the caller checked the values itself): wait for it before calling.
        self.values = values
        self._done = False

    def __call__(self, frame: torch.Tensor, state, *, store: bool, backend) -> dict[str, torch.Tensor]:
        if frame.shape != self._shape:
            raise ValueError(f"a started step finishes with its own frame {list(self._shape)}, got {list(frame.shape)}")
        if self._done:
            raise RuntimeError("this step has already run; start a new one for the next frame")
        self._done = True
        g = self._graphed
        with g._on_device():
            out = g.finish(self._first, state, store, backend)
            # Queued behind this step's work, off the next step's start (graph 0 of this
            # step has read `_time` already: same stream).
            g._set_time([state.aggregator.frames_stored])
        return out
