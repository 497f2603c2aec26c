"""`mapstream run --gpu-memory`: the run's stream fitted to a GPU memory budget.

The plan (`mapstream.gpu_memory.plan_memory`) is made for the frames the input gives: their
height is read from the files' headers or the video's container before any frame is decoded;
a live input, whose frames nobody has seen yet, is planned for the tallest frame preprocessing
can give (as tall as wide). The budget counts the stream's tensors from the moment the model
is loaded and holds PyTorch's allocator to it while the run streams (cuDNN's search for its
fastest convolutions then tries only what fits); run.json records the plan and the peak the
run reached.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace

import torch

from ..gpu_memory import MemoryBudgetError, MemoryPlan, allocator_limit, device_budget, format_bytes, plan_memory
from .options import RunOptions
from .run_input import DEMO_HW, open_input
from .stream_plan import StreamPlan

__all__ = ["fit_to_budget", "held_to_budget", "memory_record", "run_frame_shape"]

log = logging.getLogger(__name__)


def run_frame_shape(opts: RunOptions, width: int) -> tuple[int, int]:
    """(H, W) of the run's frames at `width`: known from the input where it can be, else as
    tall as wide."""
    if opts.demo:
        return DEMO_HW
    height = open_input(replace(opts, image_size=width)).frame_height
    return (height if height is not None else width), width


def fit_to_budget(opts: RunOptions, model, plan: StreamPlan, precision: str, device: torch.device,
                  width: int) -> MemoryPlan | None:
    """The memory plan for the run's `--gpu-memory` (None without one, or off CUDA, where it
    is told and ignored). Raises `MemoryBudgetError` when nothing fits."""
    budget = None if opts.gpu_memory is None else device_budget(opts.gpu_memory, device)
    if budget is None:
        return None
    memory = plan_memory(budget, model, run_frame_shape(opts, width), plan.stream, precision=precision,
                         low_precision_heads=opts.low_precision_heads, windowed=plan.mode == "windowed",
                         trunk_weights=opts.trunk_weights)
    log.info("%s", memory.describe())
    return memory


def memory_record(memory: MemoryPlan, device: torch.device) -> dict:
    """run.json's "gpu_memory": the budget, what it changed, the estimate and the peak the run
    reached since its model was loaded (told in a warning where it passed the budget)."""
    peak = torch.cuda.max_memory_allocated(device)
    if peak > memory.budget:
        log.warning("the run's GPU memory peaked at %s, above its budget of %s (the estimate was %s)",
                    format_bytes(peak), format_bytes(memory.budget), format_bytes(memory.estimate.total))
    e = memory.estimate
    return {
        "budget_bytes": memory.budget, "frame_hw": list(memory.frame_hw), "changes": list(memory.changes),
        "kv_dtype": memory.stream.kv_dtype, "sliding_window": memory.stream.sliding_window,
        "dense_chunk_frames": memory.dense_chunk_frames, "low_precision_heads": memory.low_precision_heads,
        "estimate_bytes": {"weights": e.weights, "caches": e.caches, "working": e.working, "total": e.total},
        "peak_bytes": peak,
    }


@contextlib.contextmanager
def held_to_budget(memory: MemoryPlan | None, device: torch.device) -> Iterator[None]:
    """While inside, PyTorch's allocator on `device` holds at most `memory.budget` (nothing
    without a plan); a step that needs more raises `MemoryBudgetError`, which says what to do."""
    if memory is None:
        yield
        return
    try:
        with allocator_limit(memory.budget, device):
            yield
    except torch.OutOfMemoryError as err:
        raise MemoryBudgetError(
            f"the run needed more GPU memory than its budget of {format_bytes(memory.budget)} (estimated "
            f"{memory.estimate.describe()}); the frames it finished are kept: run again with a larger --gpu-memory "
            "or a smaller --sliding-window"
        ) from err
