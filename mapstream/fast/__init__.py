"""Fast paths for CUDA streaming: single-frame steps replayed from CUDA graphs, each form
checked against the plain path; and a batch of streams, one frame each, in the pieces
form."""
from __future__ import annotations

from .batched import BatchedPiecewiseGraphs
from .graphs import GraphedStep, StartedStep
from .piece import outside_captures
from .pieces import PiecewiseGraphs
from .streams import shared_stream
from .whole import WholeStepGraphs

__all__ = ["BatchedPiecewiseGraphs", "GraphedStep", "PiecewiseGraphs", "StartedStep", "WholeStepGraphs", "graphed_step",
           "outside_captures", "shared_stream"]


def graphed_step(model, image_hw: tuple[int, int], *, whole: bool, capture: bool = True,
                 conv_search: bool = True) -> GraphedStep:
    """The graphed step of one stream at frame size `image_hw`: the whole step after its
    first graph as one graph (`whole`), or in pieces between eager cache attentions."""
    form = WholeStepGraphs if whole else PiecewiseGraphs
    return form(model, image_hw, capture=capture, conv_search=conv_search)
