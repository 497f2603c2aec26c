"""How a long sequence is cut into overlapping windows (the reference's rules).

`window_size` counts cache slots (scale frames + keyframes), not frames: with keyframe
interval k a window spans `scale + (window_size - scale) * k` frames. Consecutive windows
start `step = span - overlap` frames apart, so the last `overlap` frames of a window are
the first frames (the scale frames) of the next.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ..validation import check_count, check_scale_frames

__all__ = [
    "WindowPlan", "check_keyframe_interval", "check_window_size", "effective_overlap", "plan_windows",
    "warn_if_windows_evict",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowPlan:
    windows: tuple[tuple[int, int], ...]
    """(start, end) frame ranges, end exclusive."""
    scale_frames: int
    """Scale frames per window (fewer if a window is shorter)."""
    overlap: int
    """Frames shared by consecutive windows."""
    span: int
    """Frames per (full) window."""


def effective_overlap(
    num_frames: int,
    *,
    scale_frames: int,
    overlap_size: int | None,
    overlap_keyframes: int | None,
    keyframe_interval: int,
) -> int:
    """Overlap in frames: keyframes x interval (at least the scale frames), else
    `overlap_size`, else the scale frames; never more than num_frames - 1."""
    if overlap_keyframes is not None:
        overlap = max(scale_frames, overlap_keyframes * max(keyframe_interval, 1))
    elif overlap_size is not None:
        overlap = overlap_size
    else:
        overlap = scale_frames
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    return min(overlap, num_frames - 1) if num_frames > 1 else 0


def check_window_size(window_size: int) -> None:
    """ValueError for a window of no cache slot (offline plans and online sessions alike)."""
    check_count("window_size", window_size)


def check_keyframe_interval(keyframe_interval) -> None:
    """ValueError unless the interval is fixed: windows are planned from it before any frame
    is seen, which motion-based keyframes ("auto", decided per frame) cannot serve."""
    if isinstance(keyframe_interval, bool) or not isinstance(keyframe_interval, int) or keyframe_interval < 0:
        raise ValueError(
            f"windowed inference needs a fixed keyframe interval (an int >= 0), got {keyframe_interval!r}; "
            "motion-based keyframes ('auto') are for streaming mode"
        )


def warn_if_windows_evict(stored_frames: int, spec) -> None:
    """Log a warning when a window stores more frames (`stored_frames`: scale frames and
    keyframes) than the cache keeps (the anchors and sliding window of its `CacheSpec`): the
    oldest keyframes of each window then leave it before the window ends. The reference does
    so silently (its LIMITS 13); the outputs are its."""
    kept = spec.anchor_frames + spec.window_frames
    if stored_frames > kept:
        log.warning(
            "windows of %d stored frames exceed the %d the cache keeps (scale frames + sliding window): "
            "each window evicts its oldest keyframes, as the reference does; raise the sliding window "
            "(--sliding-window, kv_cache_sliding_window) by %d to keep whole windows",
            stored_frames, kept, stored_frames - kept,
        )


def warn_overlap_cut(overlap: int, span: int) -> None:
    """Tell that an overlap of `overlap` frames was cut to fit windows of `span` frames."""
    log.warning(
        "an overlap of %d frames does not fit windows of %d frames; using %d (consecutive windows one frame apart)",
        overlap, span, span - 1,
    )


def plan_windows(
    num_frames: int,
    *,
    window_size: int,
    scale_frames: int,
    overlap_size: int | None = None,
    overlap_keyframes: int | None = None,
    keyframe_interval: int = 1,
) -> WindowPlan:
    if num_frames < 1:
        raise ValueError("no frames to plan windows for")
    check_window_size(window_size)
    check_keyframe_interval(keyframe_interval)
    check_scale_frames(scale_frames)
    for name, value in (("overlap_size", overlap_size), ("overlap_keyframes", overlap_keyframes)):
        if value is not None:
            check_count(name, value, least=0)
    scale = min(scale_frames, num_frames)
    overlap = effective_overlap(
        num_frames,
        scale_frames=scale,
        overlap_size=overlap_size,
        overlap_keyframes=overlap_keyframes,
        keyframe_interval=keyframe_interval,
    )
    interval = max(keyframe_interval, 1)
    span = min(scale + max(window_size - scale, 0) * interval, num_frames)
    if span >= num_frames:
        return WindowPlan(((0, num_frames),), scale, overlap, span)
    if overlap >= span:
        # The reference keeps only windows at least `overlap` long, so every window but the
        # last was dropped with its frames, and its forced one-frame step paired the wrong
        # frames (LIMITS 22). The most windows can share is all their frames but one.
        if span < 2:
            raise ValueError(
                f"windows of {span} frame leave no room for the overlap they are aligned on; "
                "raise window_size above the scale frames"
            )
        warn_overlap_cut(overlap, span)
        overlap = span - 1
    step = max(span - overlap, 1)
    windows = []
    start = 0
    while True:
        end = min(start + span, num_frames)
        if end - start >= overlap or end == num_frames:
            windows.append((start, end))
        if end == num_frames:
            break
        start += step
    return WindowPlan(tuple(windows), scale, overlap, span)
