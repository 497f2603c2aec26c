"""A server's GPU memory: its `max_sessions` sessions, each with its whole cache and graph.

Each session leases its whole cache when its first frame arrives and captures its one-frame
step's graph when its scale phase ends, so what a server holds at its busiest is the model
once, `max_sessions` caches and graphs, the graphs of `max_batch` sessions' frames stepped in
one forward, and a new session's scale phase (`mapstream.gpu_memory.estimate_memory`).
Frames are planned as the largest preprocessing gives: the model's width, as tall as wide.

`fit_sessions` (`mapstream serve --gpu-memory`) chooses the sessions' settings to fit a
budget, as `mapstream run --gpu-memory` does for one stream; `sessions_memory_warning` tells
an operator whose settings would not fit the GPU.
"""
from __future__ import annotations

import logging

import torch

from ..checkpoint import model_image_size, model_trained_views
from ..config import StreamConfig
from ..gpu_memory import MemoryPlan, device_budget, estimate_memory, format_bytes, plan_memory, streams_that_fit
from ..pipeline.model_source import prepare_for_inference
from .config import ServeConfig

__all__ = ["fit_sessions", "prepare_served_model", "sessions_memory_warning"]

log = logging.getLogger(__name__)


def _frame_hw(model) -> tuple[int, int]:
    width = model_image_size(model)
    return width, width


def fit_sessions(gpu_memory: str, model, stream: StreamConfig, config: ServeConfig, device: torch.device, *,
                 mode: str = "auto", low_precision_heads: bool = False, trunk_weights: str = "auto") -> MemoryPlan | None:
    """The settings every session of a server on `device` gets so that `config.max_sessions`
    of them fit `gpu_memory` (an amount such as "40GB"): `stream` as far as it fits, else its
    cache in FP8, a smaller sliding window (and windows no longer than the frames the cache
    then holds, where the server's `mode` may run windows), the dense heads a frame at a time
    in the scale phase and last the heads in the trunk's precision
    (`mapstream.gpu_memory.plan_memory`).
    `model` as loaded, before its cast (the plan says which cast). None off CUDA, where the
    budget is told to have no effect. Raises `MemoryBudgetError` when nothing fits, saying
    how many sessions would."""
    budget = device_budget(gpu_memory, device)
    if budget is None:
        return None
    windows = mode == "windowed" or (mode == "auto" and model_trained_views(model) is not None)
    plan = plan_memory(budget, model, _frame_hw(model), stream, precision=stream.precision,
                       low_precision_heads=low_precision_heads, windowed=windows, trunk_weights=trunk_weights,
                       streams=config.max_sessions, batch=config.max_batch)
    log.info("%s", plan.describe())
    return plan


def prepare_served_model(model, stream: StreamConfig, config: ServeConfig, device: torch.device, *,
                         gpu_memory: str | None, mode: str = "auto", low_precision_heads: bool = False,
                         trunk_weights: str = "auto") -> tuple[StreamConfig, MemoryPlan | None]:
    """`model` (as loaded) prepared to serve sessions of `stream` (its precision resolved):
    their settings fitted to `gpu_memory` where one is given (`fit_sessions`), the model cast
    and its trunk's weights stored as the plan and the flags say (`prepare_for_inference`).
    Returns the sessions' settings and the plan (None without a budget or off CUDA)."""
    plan = None if gpu_memory is None else fit_sessions(
        gpu_memory, model, stream, config, device, mode=mode, low_precision_heads=low_precision_heads,
        trunk_weights=trunk_weights)
    prepare_for_inference(model, stream.precision, low_precision_heads=low_precision_heads,
                          trunk_weights=trunk_weights, memory=plan)
    return (plan.stream if plan is not None else stream), plan


def sessions_memory_warning(model, stream: StreamConfig, config: ServeConfig, gpu_bytes: int) -> str | None:
    """What to tell an operator whose `config.max_sessions` sessions of `stream`'s settings would
    not fit in `gpu_bytes` (None when they fit): the sessions past the last that fits fail for
    memory when their first frame arrives."""
    height, width = _frame_hw(model)
    estimate = estimate_memory(model, (height, width), stream, precision=stream.precision,
                               low_precision_heads=model.head_dtype != torch.float32,
                               streams=config.max_sessions, batch=config.max_batch)
    fit = streams_that_fit(gpu_bytes, estimate)
    if fit >= config.max_sessions:
        return None
    return (f"{config.max_sessions} sessions of {width}x{width} frames would need about "
            f"{format_bytes(estimate.total)} (the model {format_bytes(estimate.weights)}, each session's caches and "
            f"graphs {format_bytes(estimate.per_stream)}); this GPU has {format_bytes(gpu_bytes)}, room for about "
            f"{fit}: sessions past that fail for memory. Serve with --max-sessions {max(fit, 1)}, --gpu-memory (which fits the "
            "sessions' settings), --kv-dtype fp8 or a smaller --sliding-window")
