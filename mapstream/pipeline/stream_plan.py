"""How a run streams its input: through one cache (streaming) or in overlapping windows, each
on a clean cache (windowed), and which frames it stores.

`plan_stream` is pure: it reads the run's mode and stream settings, the input's length (None
for a live input, whose length nobody knows in advance) and how many frames one training clip
of the model's weights held, as their checkpoint records (`mapstream.checkpoint.
model_trained_views`; None for the official weights, which record nothing).

``mode="auto"`` streams through one cache unless the weights record their clips' length and
the input may run past it, with the keyframes left to the run: then it runs windows of that
many stored frames (on a live input, a frame two windows share is taken from the earlier one,
as soon as it is predicted). Weights trained by mapstream never saw a cache evict a frame
(every frame of a training clip stays in view), so a stream longer than their clips shows them
what they never learned from; windows of their clip length keep every frame within it
(docs/TRAINING.md, "Longer sequences than the clips"). The official weights keep the
reference's behaviour: one cache, every ceil(N / 320)-th frame stored for N frames known in
advance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import StreamConfig
from ..windowed.online import check_window_options

__all__ = ["MODES", "REFERENCE_TRAINED_VIEWS", "StreamPlan", "check_mode", "plan_stream"]

MODES = ("auto", "streaming", "windowed")

REFERENCE_TRAINED_VIEWS = 320
"""Views the official weights were trained on: the reference stores every ceil(N / 320)-th of
N frames known in advance, so that a long input's stored frames stay within them."""


@dataclass(frozen=True)
class StreamPlan:
    mode: str
    """"streaming" or "windowed"."""
    stream: StreamConfig
    """The settings the run's session takes: the keyframe interval decided, windows sized."""
    reason: str = ""
    """Why "auto" chose windows, for the log ("" otherwise)."""


def check_mode(mode: str, stream: StreamConfig) -> None:
    """A clear error for a mode `plan_stream` does not know, or for window settings no window
    runs with where the mode may run windows ("auto" does unless a keyframe interval is given)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "windowed" or mode == "auto" and stream.keyframe_interval is None:
        check_window_options(stream)


def plan_stream(mode: str, stream: StreamConfig, length: int | None, trained_views: int | None) -> StreamPlan:
    """The run's mode and stream settings. ``mode`` is "auto", "streaming" or "windowed";
    ``length`` the input's frames (None: unknown); ``trained_views`` the weights' recorded
    clip length (None: not recorded). The settings' provisional predictions are turned off: a
    run writes the final ones."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    stream = stream.with_settings(provisional=False)
    reason = ""
    if mode == "auto":
        mode = "windowed" if _windows_keep_within(stream, length, trained_views) else "streaming"
        if mode == "windowed":
            # A live input's frames are shown as they come: each from the first window that
            # predicts it, instead of waiting for the next window.
            shared_from = "earlier" if length is None else stream.shared_from
            stream = stream.with_settings(window_size=trained_views, shared_from=shared_from)
            reason = (
                f"the model's weights learned from clips of at most {trained_views} frames and the input "
                f"{'may run longer' if length is None else f'has {length}'}: windows of {trained_views} stored "
                f"frames, each on a clean cache, joined by Sim(3) on the {stream.overlap or 'scale'} frames they "
                "share (--mode streaming keeps one cache)"
            )
    if stream.keyframe_interval is None:
        stream = stream.with_settings(keyframe_interval=_keyframe_interval(mode, length, trained_views))
    return StreamPlan(mode, stream, reason)


def _windows_keep_within(stream: StreamConfig, length: int | None, trained_views: int | None) -> bool:
    """Whether "auto" runs windows: the weights record their clip length, the input may be
    longer, the keyframes are the run's to choose (windows are planned on a fixed interval), and
    a window of that length holds frames beyond the scale frames and the overlap."""
    if trained_views is None or stream.keyframe_interval is not None:
        return False
    if length is not None and length <= trained_views:
        return False
    return trained_views > max(stream.num_scale_frames, stream.overlap or 0)


def _keyframe_interval(mode: str, length: int | None, trained_views: int | None) -> int | str:
    """The frames stored when the settings leave it open: every frame of a window; on one
    cache, chosen by motion on a live input, else every ceil(N / views)-th of N frames."""
    if mode == "windowed":
        return 1
    if length is None:
        return "auto"
    return max(1, math.ceil(length / (trained_views or REFERENCE_TRAINED_VIEWS)))
