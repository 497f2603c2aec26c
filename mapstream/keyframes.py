"""Keyframe policies: which frames of a stream are stored in the cache.

A policy decides either before the frame is processed (`FixedInterval`, the reference's
rule) or after seeing its prediction (`FlowKeyframes`): then the frame is processed
unstored and, if chosen, stored afterwards (`StreamCacheManager.store_last`), exactly as a
keyframe that attended with the reference's deferred eviction. Neither needs the length of
the stream.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .config import DEFAULT_IMAGE_SIZE
from .geometry import pixel_grid, project_points, unproject_depth

__all__ = ["KeyframePolicy", "FixedInterval", "FlowKeyframes", "mean_flow", "make_policy"]

AUTO_THRESHOLD = 20.0
"""`keyframe_interval="auto"` stores a frame once its predicted image motion against the last
keyframe exceeds this many pixels of a frame `AUTO_WIDTH` wide."""
AUTO_WIDTH = DEFAULT_IMAGE_SIZE
"""The official model's frame width; frames run at another width have their motion rescaled."""


class KeyframePolicy(ABC):
    needs_prediction: bool = False

    def reset(self) -> None:
        """A new sequence starts (its first frame after the scale phase has index `scale`)."""

    @abstractmethod
    def decide(self, index: int, scale: int, prediction=None) -> bool:
        """Store frame `index` of the sequence (index >= scale)? `prediction` (a
        FramePrediction) is given only to policies with `needs_prediction`."""

    def stored(self, index: int, prediction) -> None:
        """Frame `index` was stored (scale frames included)."""


class FixedInterval(KeyframePolicy):
    """Every k-th frame after the scale phase, starting with the first (k <= 1: all)."""

    def __init__(self, interval: int) -> None:
        if interval < 0:
            raise ValueError(f"keyframe_interval must be >= 0, got {interval}")
        self.interval = interval

    def decide(self, index: int, scale: int, prediction=None) -> bool:
        return self.interval <= 1 or (index - scale) % self.interval == 0

    def __repr__(self) -> str:
        return f"FixedInterval({self.interval})"


def mean_flow(depth: torch.Tensor, K: torch.Tensor, T_world_cam: torch.Tensor, K_ref: torch.Tensor,
              T_world_ref: torch.Tensor, stride: int = 8) -> float:
    """Mean image motion (pixels) of the current frame's surface seen from a reference camera.

    Pixels on a `stride` grid are unprojected with the current depth/pose, projected into
    the reference camera, and compared with their own position; points with depth <= 1e-6
    in either camera are ignored. Returns 0.0 when nothing is valid.
    """
    d = depth[::stride, ::stride].double()
    # Pixel (j, i) of the subsampled grid is pixel (stride j, stride i): same rays with K / stride.
    K_grid = K.double().clone()
    K_grid[:2] /= stride
    world = unproject_depth(d, K_grid, T_world_cam.double()).reshape(-1, 3)
    uv, z = project_points(world, K_ref.double(), T_world_ref.double())
    valid = (d.reshape(-1) > 1e-6) & (z > 1e-6)
    if not valid.any():
        return 0.0
    grid = pixel_grid(*d.shape, device=d.device, dtype=d.dtype).reshape(-1, 2) * stride
    return float((uv - grid)[valid].norm(dim=-1).mean())


class FlowKeyframes(KeyframePolicy):
    """Store a frame when its predicted image motion against the last keyframe exceeds
    `threshold` pixels, or when `max_gap` frames passed since the last keyframe; the first
    frame after the scale phase is always stored. Needs no frame count.

    `width`: the frame width `threshold` is given at. The motion measured on a frame W pixels
    wide is compared as `motion * width / W`, so that the same camera motion stores the same
    frames whatever width the frames run at (a model trained at 294 pixels sees its frames
    move 294/518 as many pixels as the official model does). None compares the frame's own
    pixels, as the reference's `flow_threshold` does.
    """

    needs_prediction = True

    def __init__(self, threshold: float = 20.0, max_gap: int = 30, stride: int = 8, width: int | None = None) -> None:
        if threshold <= 0 or max_gap < 1:
            raise ValueError("threshold must be > 0 and max_gap >= 1")
        if width is not None and (isinstance(width, bool) or not isinstance(width, int) or width < 1):
            raise ValueError(f"width must be a positive number of pixels or None, got {width!r}")
        self.threshold, self.max_gap, self.stride, self.width = threshold, max_gap, stride, width
        self.reset()

    def reset(self) -> None:
        self._last = None
        self._last_index = None
        self.last_flow: float | None = None

    def decide(self, index: int, scale: int, prediction=None) -> bool:
        if index == scale or self._last is None:
            return True
        if index - self._last_index >= self.max_gap:
            return True
        ref = self._last
        self.last_flow = mean_flow(
            prediction.depth, prediction.K, prediction.T_world_cam, ref.K, ref.T_world_cam, self.stride
        )
        if self.width is not None:
            self.last_flow *= self.width / prediction.depth.shape[-1]
        return self.last_flow > self.threshold

    def stored(self, index: int, prediction) -> None:
        self._last, self._last_index = prediction, index

    def __repr__(self) -> str:
        at = "" if self.width is None else f", width={self.width}"
        return f"FlowKeyframes(threshold={self.threshold}, max_gap={self.max_gap}{at})"


def make_policy(keyframe_interval: int | str | KeyframePolicy) -> KeyframePolicy:
    """An int -> FixedInterval; "auto" -> `AUTO_THRESHOLD` pixels of motion at
    `AUTO_WIDTH` (FlowKeyframes); a policy is returned as is."""
    if isinstance(keyframe_interval, KeyframePolicy):
        return keyframe_interval
    if keyframe_interval == "auto":
        return FlowKeyframes(AUTO_THRESHOLD, width=AUTO_WIDTH)
    if isinstance(keyframe_interval, int):
        return FixedInterval(keyframe_interval)
    raise ValueError(f"keyframe_interval must be an int, 'auto' or a KeyframePolicy, got {keyframe_interval!r}")
