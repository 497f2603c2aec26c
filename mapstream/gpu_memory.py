"""The GPU memory a stream takes, and the settings that fit it in a budget
(`mapstream run --gpu-memory 8GB`).

A stream's memory has three parts:

    weights   the network's parameters in the dtypes they run in (exact);
    caches    what its caches lease when the first frame arrives: the anchor frames, the
              sliding window and the trajectory memory, whole (exact, `GCTNetwork.cache_bytes`);
    working   the largest step's passing tensors: the scale phase (its frames through the
              trunk together, the dense heads `dense_chunk_frames` frames at a time) or a
              streaming step (one frame; with an FP8 cache also one layer's visible keys and
              values read back into the trunk's precision). Estimated from sizes per token and
              per pixel that `benchmarks/memory_parts.py` measures on a GPU (`WORKING`).

`plan_memory` keeps the asked settings where they fit and otherwise gives up, in this
order, what costs least: the dense heads' frames at a time in the scale phase (a little
of the scale phase's speed), the cache's storage (FP8: 0.53 of the bytes, within the
accuracy bound, 17 % of the frame rate), the sliding window (less context for each frame),
and last the heads' precision (fp32 to the trunk's: faster, but its pose error is above
twice the bf16 trunk's, the bound the other settings keep). Nothing fits:
`MemoryBudgetError` says the least the stream needs.

Estimates count what PyTorch allocates for the stream (`torch.cuda.max_memory_allocated`); a
run holds PyTorch's allocator, its cached blocks included, to the budget while it streams
(`mapstream.pipeline.memory_budget`). The CUDA context (about 0.5 GiB) comes on top.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .config import StreamConfig
from .layers.quantized import eligible_linears, is_quantized, quantized_bytes, tensor_bytes
from .validation import compute_dtype

__all__ = [
    "MemoryBudgetError", "MemoryEstimate", "MemoryPlan", "WorkingMemory", "WORKING", "allocator_limit",
    "device_budget", "estimate_memory", "format_bytes", "parse_memory", "plan_memory", "streams_that_fit",
]

log = logging.getLogger(__name__)

GIB = 2**30

_UNITS = {"": GIB, "k": 2**10, "m": 2**20, "g": GIB, "t": 2**40}


class MemoryBudgetError(ValueError):
    """No setting of the stream fits the budget."""


def parse_memory(text: str | int | float) -> int:
    """Bytes from "8GB", "8 GiB", "7.5g", "6000MB" or a number of GiB. K, M, G and T count
    powers of 1024 with or without "i" and "B", as GPU makers' figures do (an "8 GB" card
    holds 8 GiB)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", str(text))
        if match is None:
            raise ValueError(f"GPU memory {text!r}: give an amount such as 8GB, 7.5GiB or 6000MB")
        value, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"GPU memory {text!r}: must be more than zero")
    return int(value * _UNITS[unit])


def device_budget(amount: str, device: torch.device) -> int | None:
    """The bytes `--gpu-memory AMOUNT` gives a run or server on `device`: None off CUDA (told:
    it has no effect there), at most what the GPU has (told where more was asked)."""
    budget = parse_memory(amount)
    if device.type != "cuda":
        log.warning("--gpu-memory %s has no effect on %s: it plans a CUDA GPU's memory", amount, device)
        return None
    card = torch.cuda.get_device_properties(device).total_memory
    if budget > card:
        log.warning("--gpu-memory %s is more than %s has (%s): planning for the GPU's own", amount,
                    torch.cuda.get_device_name(device), format_bytes(card))
    return min(budget, card)


def format_bytes(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class WorkingMemory:
    """Passing tensors of a step, in bytes per unit (measured: `benchmarks/memory_parts.py`)."""

    trunk_per_token: float
    """Per token of the step's frames, per embedding channel and byte of the trunk's dtype."""
    dense_per_pixel: float
    """Per pixel of each frame in a dense-head chunk, per DPT feature and byte of the heads' dtype."""
    heads_input_per_token: float
    """Per token of the step's frames, per channel of the heads' input (2 x embed) and byte
    of the heads' dtype: the selected layers handed to the heads in their dtype."""
    fp8_read_per_token: float
    """Per token visible in the cache, per embedding channel and byte of the trunk's dtype,
    with an FP8 cache: keys and values of one layer read back."""
    fixed: int
    """Per step whatever the sizes (workspaces, the camera head)."""
    pieces_per_token_layer: float
    """Per token of the step's frames, per layer, per embedding channel and byte of the
    trunk's dtype: what the graphs of a step in pieces (a batched step, `mapstream.fast`)
    keep between their pieces (each piece's outputs, the attention's static rows)."""


# Set above what an NVIDIA H100 80GB HBM3 measured for the official architecture at 518x378
# (triton, whole-step graphs, FP8 cache, window 64): the scale phase's passing tensors 2.36 GiB
# with fp32 heads and 1.43 GiB with bf16 heads eight frames at a time, 0.54 GiB a frame at a
# time; a steady step's 0.50 GiB (bf16 heads). These figures estimate 2.93, 1.75, 1.10 and 0.72 GiB.
# Eight streams of 518x518 on the same GPU (FP8 caches, window 64, fp32 heads): each stream's
# one-frame graph held 0.875 GiB (estimated 1.13) and the batched step's graphs of eight frames
# 8.75 GiB, 4.08 of them kept between steps (estimated 8.92 GiB, 4.53 kept between the pieces).
WORKING = WorkingMemory(trunk_per_token=24.0, dense_per_pixel=1.4, heads_input_per_token=4.5,
                        fp8_read_per_token=2.5, fixed=160 * 2**20, pieces_per_token_layer=9.0)


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of `streams` streams served by one model: its weights once, each stream's
    caches and graphs (`caches` and `graphs` are one stream's), and the passing tensors of
    the steps that may run at the peak (`working`)."""

    weights: int
    caches: int
    working: int
    streams: int = 1
    graphs: int = 0
    """One stream's captured step, held while the stream lives (counted apart from `working`
    where several streams each hold theirs)."""

    @property
    def total(self) -> int:
        return self.weights + self.streams * (self.caches + self.graphs) + self.working

    @property
    def per_stream(self) -> int:
        """What each further stream adds."""
        return self.caches + self.graphs

    def describe(self) -> str:
        if self.streams == 1:
            caches = format_bytes(self.caches)
        else:
            caches = (f"{self.streams} x {format_bytes(self.caches)}, their graphs {self.streams} x "
                      f"{format_bytes(self.graphs)}")
        return (f"{format_bytes(self.total)} (weights {format_bytes(self.weights)}, caches {caches}, "
                f"working {format_bytes(self.working)})")


@dataclass(frozen=True)
class MemoryPlan:
    """Settings that fit `budget`, and what changed from those asked for."""

    budget: int
    frame_hw: tuple[int, int]
    stream: StreamConfig
    """The stream's settings to run with (kv_dtype, sliding_window and window_size as planned)."""
    dense_chunk_frames: int
    low_precision_heads: bool
    estimate: MemoryEstimate
    changes: tuple[str, ...]

    def describe(self) -> str:
        changed = "; ".join(self.changes) if self.changes else "the settings as given"
        streams = f"{self.estimate.streams} streams of " if self.estimate.streams > 1 else ""
        return (f"GPU memory budget {format_bytes(self.budget)} for {streams}{self.frame_hw[1]}x{self.frame_hw[0]} "
                f"frames: {changed}; estimated peak {self.estimate.describe()}")


def _param_bytes(module: torch.nn.Module | None, dtype: torch.dtype | None, weights: str = "auto") -> int:
    """Bytes of `module`'s parameters in `dtype` (None: as they are), its large linear layers'
    weights quantized as `weights` says ("int8", "fp8"; `mapstream.layers.quantized`), and of
    its buffers as they are (`cast_for_inference` casts parameters; constants such as the
    input normalisation stay). Weights already quantized count what they hold."""
    if module is None:
        return 0
    size = torch.empty((), dtype=dtype).element_size() if dtype is not None else None
    quantized = {id(m.weight): quantized_bytes(m, weights) for m in eligible_linears(module)} if weights != "auto" else {}
    total = 0
    for p in module.parameters():
        if is_quantized(p):
            total += tensor_bytes(p)
        elif id(p) in quantized:
            total += quantized[id(p)]
        else:
            total += p.numel() * (size if size and p.is_floating_point() else p.element_size())
    return total + sum(b.numel() * b.element_size() for b in module.buffers())


def estimate_memory(
    network, frame_hw: tuple[int, int], stream: StreamConfig, *, precision: str,
    low_precision_heads: bool = False, dense_chunk_frames: int | None = None, trunk_weights: str | None = None,
    streams: int = 1, batch: int = 1,
) -> MemoryEstimate:
    """The stream's peak GPU memory (`network`: a `GCTNetwork`, in whatever dtype it is now)
    for frames of `frame_hw` (H, W) kept as `stream` says, the trunk in `precision` with its
    linear weights stored as `trunk_weights` says (default: the network's), the heads in
    `precision` too with `low_precision_heads` (else fp32), the dense heads
    `dense_chunk_frames` frames at a time (default: the network's). `streams` streams share the
    model, one scale phase at a time, their streaming steps up to `batch` frames in one forward
    (`mapstream.step_together`: each stream's cache attention still reads its own cache).

    One stream's peak is its larger step: the scale phase's passing tensors are freed before
    its streaming step's graph is captured. Several streams (a server's sessions) start at
    any time: each holds the graph of its own one-frame step (a captured graph keeps its
    step's passing tensors in its pool), the batched step's graph of `batch` frames is held
    beside them, and a stream's scale phase may run while all of these are held."""
    if streams < 1 or batch < 1:
        raise ValueError(f"streams and batch must be at least 1, got {streams} and {batch}")
    trunk = compute_dtype(precision)
    heads = trunk if low_precision_heads else torch.float32
    tb, hb = torch.empty((), dtype=trunk).element_size(), torch.empty((), dtype=heads).element_size()
    weights = _param_bytes(network.aggregator, trunk, trunk_weights or network.trunk_weights) + sum(
        _param_bytes(h, heads) for h in (network.camera_head, network.depth_head, network.point_head))
    caches = network.cache_bytes(frame_hw, stream, dtype=trunk, head_dtype=heads)

    c = network.config
    height, width = frame_hw
    tokens = c.num_special_tokens + (height // c.patch_size) * (width // c.patch_size)
    dense_heads = sum(h is not None for h in (network.depth_head, network.point_head))
    chunk = dense_chunk_frames or network.dense_chunk_frames
    scale = stream.num_scale_frames
    w = WORKING

    def step(frames: int, dense_frames: int, visible_tokens: int) -> float:
        return (w.trunk_per_token * frames * tokens * c.embed_dim * tb
                + w.heads_input_per_token * frames * tokens * 2 * c.embed_dim * hb
                + w.dense_per_pixel * dense_heads * dense_frames * height * width * c.dpt_features * hb
                + (w.fp8_read_per_token * visible_tokens * c.embed_dim * tb if stream.kv_dtype == "fp8" else 0)
                + w.fixed)

    spec = stream.cache_spec()
    visible = (spec.ring_slots - 1) * tokens + (spec.trajectory_capacity or 0) * c.num_special_tokens
    together = min(batch, streams)  # frames of different streams in one streaming step
    scale_phase, one_frame = step(scale, min(chunk, scale), scale * tokens), step(1, 1, visible)
    if streams == 1:
        return MemoryEstimate(weights, caches, int(max(scale_phase, one_frame)))
    pieces = w.pieces_per_token_layer * together * tokens * c.depth * c.embed_dim * tb
    batched = step(together, together, visible) + pieces if together > 1 else 0
    return MemoryEstimate(weights, caches, int(scale_phase + batched), streams, graphs=int(one_frame))


def _windows(asked: int) -> list[int]:
    """The sliding windows tried, largest first: the one asked for, then smaller steps."""
    return [asked] + [w for w in (48, 32, 24, 16, 8) if w < asked]


def plan_memory(
    budget: int, network, frame_hw: tuple[int, int], stream: StreamConfig, *, precision: str,
    low_precision_heads: bool = False, windowed: bool = False, trunk_weights: str | None = None,
    streams: int = 1, batch: int = 1,
) -> MemoryPlan:
    """The settings nearest to those asked (`stream`, `low_precision_heads`, the network's dense
    chunk) whose estimated peak fits `budget` bytes (see the module docstring for the order in
    which settings are given up); `windowed`: a windowed run, whose windows then shrink with
    the sliding window; `trunk_weights`: how the trunk's linear weights will be stored (default:
    as the network holds them now); `streams` streams of these settings on one model, stepped up
    to `batch` at a time (a server's sessions). Raises `MemoryBudgetError` when none fits."""
    asked_chunk = network.dense_chunk_frames
    chunks = sorted({min(asked_chunk, stream.num_scale_frames), 1}, reverse=True)
    kv_dtypes = [stream.kv_dtype] + (["fp8"] if stream.kv_dtype != "fp8" else [])
    heads_options = [low_precision_heads] + ([True] if not low_precision_heads else [])
    # Tried in order of cost; every axis only lowers the estimate, so the last tried is the smallest.
    for low_heads, window, kv, chunk in itertools.product(heads_options, _windows(stream.sliding_window), kv_dtypes,
                                                          chunks):
        planned = stream.with_settings(kv_dtype=kv, sliding_window=window)
        if windowed:
            planned = planned.with_settings(window_size=min(stream.window_size, stream.anchor_frames + window))
        estimate = estimate_memory(network, frame_hw, planned, precision=precision, low_precision_heads=low_heads,
                                   dense_chunk_frames=chunk, trunk_weights=trunk_weights, streams=streams, batch=batch)
        if estimate.total <= budget:
            changes = _changes(stream, planned, asked_chunk, chunk, low_precision_heads, low_heads, precision)
            return MemoryPlan(budget, tuple(frame_hw), planned, chunk, low_heads, estimate, changes)
    smallest = estimate
    what = f"{streams} streams of " if streams > 1 else ""
    fewer = f", fewer streams (about {streams_that_fit(budget, smallest)} fit)" if streams > 1 else ""
    raise MemoryBudgetError(
        f"a GPU memory budget of {format_bytes(budget)} is too small for {what}{frame_hw[1]}x{frame_hw[0]} frames: the "
        f"smallest setting (FP8 cache, a window of {_windows(stream.sliding_window)[-1]} frames, heads in {precision}, "
        f"dense heads a frame at a time) needs about {smallest.describe()}; give more memory{fewer}, a smaller "
        "--image-size or a smaller --trajectory-capacity"
    )


def _changes(asked: StreamConfig, planned: StreamConfig, asked_chunk: int, chunk: int, asked_heads: bool,
             low_heads: bool, precision: str) -> tuple[str, ...]:
    changes = []
    if chunk != asked_chunk:
        changes.append(f"dense heads {chunk} frame{'s' if chunk > 1 else ''} at a time in the scale phase")
    if planned.kv_dtype != asked.kv_dtype:
        changes.append("the cache stored in FP8")
    if planned.sliding_window != asked.sliding_window:
        changes.append(f"a sliding window of {planned.sliding_window} frames (asked: {asked.sliding_window})")
    if planned.window_size != asked.window_size:
        changes.append(f"windows of {planned.window_size} frames (asked: {asked.window_size})")
    if low_heads != asked_heads:
        changes.append(f"the heads in {precision} (their pose error is above the fp32 heads' bound)")
    return tuple(changes)


def streams_that_fit(budget: int, estimate: MemoryEstimate) -> int:
    """How many streams of `estimate`'s settings one model serves within `budget` bytes: the
    weights once, each stream's caches and graph, and the estimate's working memory."""
    room = budget - estimate.weights - estimate.working
    return max(room // estimate.per_stream, 0) if estimate.per_stream > 0 else 0


@contextlib.contextmanager
def allocator_limit(budget: int, device: torch.device) -> Iterator[None]:
    """While inside, PyTorch's allocator on CUDA `device` holds at most `budget` bytes, its
    cached blocks included (an allocation past it raises `torch.OutOfMemoryError`); the limit
    before is restored on leaving. A limit already lower stays."""
    before = torch.cuda.get_per_process_memory_fraction(device)
    card = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(before, budget / card), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(before, device)
