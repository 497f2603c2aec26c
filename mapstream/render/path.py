"""Where the flythrough's virtual camera is at each frame: pure functions of the trajectory.

follow   behind and above the reconstruction's camera, looking a little ahead of it;
birdeye  high above the camera, looking down at it;
static   the viewer's default viewpoint (behind and above the first camera) throughout;
pivot    the default viewpoint orbiting the scene centre about the scene's up, at the same
         distance and height, always looking at the centre.

Positions and viewing directions are smoothed over neighbouring frames (a Gaussian in frame
index; the whole trajectory is known, so the filter is centred), so that the shake of a
hand-held camera does not shake the flythrough.

A path can also be made of segments (:class:`SegmentedPath`, read from a file by
:mod:`mapstream.render.path_file`), each frame range with its own mode, one segment blending
into the next over a few frames.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch

from mapstream.geometry import look_at

__all__ = [
    "PATH_MODES", "PathMode", "PathSegment", "PathStyle", "SegmentedPath", "camera_path", "segmented_camera_path",
    "pivot_eyes", "smooth", "transition_weights",
]

PathMode = Literal["follow", "birdeye", "static", "pivot"]
PATH_MODES: tuple[str, ...] = ("follow", "birdeye", "static", "pivot")


@dataclass(frozen=True)
class PathStyle:
    """Offsets in multiples of the scene's extent, smoothing in frames."""

    mode: PathMode = "follow"
    back: float = 0.25
    """follow: distance behind the camera."""
    height: float = 0.12
    """follow: distance above the camera (birdeye: 0.8 of the extent above it)."""
    ahead: float = 0.25
    """follow: the point looked at, this far ahead of the camera."""
    smooth_frames: float = 3.0
    """Standard deviation of the Gaussian smoothing of the path, in frames (0: none)."""
    turns: float = 1.0
    """pivot: turns about the scene centre from the first frame of the path to its last
    (counter-clockwise seen from above; negative: clockwise)."""

    def __post_init__(self) -> None:
        if self.mode not in PATH_MODES:
            raise ValueError(f"mode must be one of {PATH_MODES}, got {self.mode!r}")
        if self.smooth_frames < 0:
            raise ValueError(f"smooth_frames must be >= 0, got {self.smooth_frames}")
        for name in ("back", "height", "ahead", "turns"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.mode == "follow" and self.height == 0 and self.back + self.ahead == 0:
            # The eye would sit on the point it looks at: no view direction.
            raise ValueError(
                f"follow: back {self.back} and ahead {self.ahead} with height 0 put the eye on the point it "
                "looks at; give a height or a back + ahead other than 0"
            )


@dataclass(frozen=True)
class PathSegment:
    """Frames ``start..end`` (both included, numbered from 0) seen in the way of ``style``
    (whose ``smooth_frames`` is not used: :func:`segmented_camera_path`'s applies to all)."""

    style: PathStyle
    start: int
    end: int


@dataclass(frozen=True)
class SegmentedPath:
    """A camera path made of consecutive segments.

    The segments cover frames 0, 1, ... without a gap or an overlap. Segment k (k >= 1)
    takes over from the path before it over its first ``transition`` frames: eye and target
    move from the earlier path's to segment k's with smoothstep weights, so the video has no
    jump (0: a cut). Past the last segment's end, the last segment goes on (a pivot keeps
    turning at its rate), so one file serves runs of any length; segments that start after
    the run's last frame are not used.
    """

    segments: tuple[PathSegment, ...]
    transition: int = 10

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a segmented path needs at least one segment")
        if isinstance(self.transition, bool) or not isinstance(self.transition, int) or self.transition < 0:
            raise ValueError(f"transition must be a whole number of frames >= 0, got {self.transition!r}")
        for index, segment in enumerate(self.segments):
            if not 0 <= segment.start <= segment.end:
                raise ValueError(
                    f"segment {index}: frames must be [start, end] with 0 <= start <= end, "
                    f"got [{segment.start}, {segment.end}]"
                )
        if self.segments[0].start != 0:
            raise ValueError(
                f"segment 0: frames must start at frame 0 (frames 0-{self.segments[0].start - 1} are in no "
                f"segment), got [{self.segments[0].start}, {self.segments[0].end}]"
            )
        for index, (before, after) in enumerate(zip(self.segments, self.segments[1:]), start=1):
            if after.start <= before.end:
                raise ValueError(
                    f"segment {index}: frames [{after.start}, {after.end}] overlap or come before segment "
                    f"{index - 1}'s [{before.start}, {before.end}]; list the segments in frame order, "
                    f"segment {index} starting at frame {before.end + 1}"
                )
            if after.start > before.end + 1:
                raise ValueError(
                    f"segment {index}: frames {before.end + 1}-{after.start - 1} are in no segment (segment "
                    f"{index - 1} ends at frame {before.end}, segment {index} starts at frame {after.start}); "
                    f"start segment {index} at frame {before.end + 1} or end segment {index - 1} at frame "
                    f"{after.start - 1}"
                )


def smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """``values`` [N, ...] averaged over frames with Gaussian weights of std ``sigma`` frames,
    renormalised at the ends (a constant stays constant, a straight line stays straight
    away from the ends)."""
    values = np.asarray(values, dtype=np.float64)
    if sigma <= 0 or len(values) < 2:
        return values.copy()
    half = int(np.ceil(4 * sigma))  # the kernel's tails beyond 4 sigma weigh < 1e-4
    offsets = np.arange(-half, half + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    flat = values.reshape(len(values), -1)
    centred = slice(half, half + len(values))  # "full" convolution, cut back to the frames
    total = np.stack([np.convolve(column, kernel)[centred] for column in flat.T], axis=1)
    weight = np.convolve(np.ones(len(values)), kernel)[centred]  # what reaches each frame
    return (total / weight[:, None]).reshape(values.shape)


def camera_path(
    T_world_cam: np.ndarray, *, extent: float, up: np.ndarray, style: PathStyle = PathStyle(),
    overview: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Camera-to-world ``[N, 3, 4]`` of the virtual camera for each of the N frames.

    Args:
        T_world_cam: ``[N, 3, 4]`` the reconstruction's cameras.
        extent: the scene's size (world units), which the offsets of ``style`` multiply.
        up: unit world up (the image's up in every view).
        overview: ``(eye, target)`` of the static view, whose target is the centre a pivot
            turns about (required for modes "static" and "pivot").
    """
    poses = np.asarray(T_world_cam, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    eyes, targets = _eyes_and_targets(poses, extent, up, style, overview, (0, len(poses) - 1))
    return _views(eyes, targets, up, poses)


def segmented_camera_path(
    T_world_cam: np.ndarray, path: SegmentedPath, *, extent: float, up: np.ndarray,
    overview: tuple[np.ndarray, np.ndarray] | None = None, smooth_frames: float = 3.0,
) -> np.ndarray:
    """Camera-to-world ``[N, 3, 4]`` of the virtual camera along ``path``'s segments.

    Each segment is seen as :func:`camera_path` sees the whole run in its style (with
    ``smooth_frames`` for all), a pivot turning over the segment's own frames. Before a
    segment's transition the views are exactly the path so far; after it, exactly the
    segment's. Arguments as :func:`camera_path`'s.
    """
    poses = np.asarray(T_world_cam, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)

    def segment_eyes_and_targets(segment: PathSegment) -> tuple[np.ndarray, np.ndarray]:
        style = replace(segment.style, smooth_frames=smooth_frames)
        return _eyes_and_targets(poses, extent, up, style, overview, (segment.start, segment.end))

    eyes, targets = segment_eyes_and_targets(path.segments[0])
    for segment in path.segments[1:]:
        seg_eyes, seg_targets = segment_eyes_and_targets(segment)
        # (1 - w) a + w b is exactly a at w = 0 and exactly b at w = 1 (a + w (b - a) is not).
        w = transition_weights(len(poses), segment.start, path.transition)[:, None]
        eyes = (1 - w) * eyes + w * seg_eyes
        targets = (1 - w) * targets + w * seg_targets
    return _views(eyes, targets, up, poses)


def transition_weights(num_frames: int, start: int, transition: int) -> np.ndarray:
    """``[num_frames]`` weight of a segment starting at frame ``start`` against the path
    before it: 0 before ``start``, a smoothstep strictly between 0 and 1 over frames
    ``start .. start + transition - 1``, 1 from ``start + transition`` on."""
    frames = np.arange(num_frames, dtype=np.float64)
    x = np.clip((frames - start + 1) / (transition + 1), 0.0, 1.0)
    return x * x * (3 - 2 * x)


def pivot_eyes(
    overview: tuple[np.ndarray, np.ndarray], up: np.ndarray, frames: np.ndarray, span: tuple[int, int], turns: float,
) -> np.ndarray:
    """``[len(frames), 3]`` eyes of a pivot: the overview's eye turned about the axis along
    ``up`` through the overview's target, by ``turns`` full turns from frame ``span[0]`` to
    frame ``span[1]`` (at that rate before and after), counter-clockwise seen from above."""
    eye, centre = (np.asarray(v, dtype=np.float64) for v in overview)
    axis = np.asarray(up, dtype=np.float64) / np.linalg.norm(up)
    start, end = span
    angles = 2 * np.pi * turns * (np.asarray(frames, dtype=np.float64) - start) / max(end - start, 1)
    offset = eye - centre
    along = axis * (axis @ offset)  # the height above the centre: kept
    across, side = offset - along, np.cross(axis, offset)
    # Rodrigues' rotation about the unit axis: a right-handed turn, counter-clockwise seen from above.
    return centre + along + np.cos(angles)[:, None] * across + np.sin(angles)[:, None] * side


def _eyes_and_targets(
    poses: np.ndarray, extent: float, up: np.ndarray, style: PathStyle,
    overview: tuple[np.ndarray, np.ndarray] | None, span: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """``([N, 3], [N, 3])``: where the virtual camera is and what it looks at in ``style``,
    for every frame (a pivot turning over the frames of ``span``)."""
    n = len(poses)
    if style.mode in ("static", "pivot"):
        if overview is None:
            raise ValueError(f"the {style.mode} path needs the overview viewpoint (eye, target)")
        target = np.repeat(np.asarray(overview[1], dtype=np.float64)[None], n, axis=0)
        if style.mode == "static":
            return np.repeat(np.asarray(overview[0], dtype=np.float64)[None], n, axis=0), target
        return pivot_eyes(overview, up, np.arange(n), span, style.turns), target
    centres = smooth(poses[:, :, 3], style.smooth_frames)
    forwards = smooth(poses[:, :, 2], style.smooth_frames)
    forwards /= np.maximum(np.linalg.norm(forwards, axis=1, keepdims=True), 1e-12)
    if style.mode == "follow":
        eyes = centres - forwards * style.back * extent + up * style.height * extent
        return eyes, centres + forwards * style.ahead * extent
    # birdeye: high above, a little behind, so the camera's heading reads as "up"
    return centres + up * 0.8 * extent - forwards * 0.2 * extent, centres


def _views(eyes: np.ndarray, targets: np.ndarray, up: np.ndarray, poses: np.ndarray) -> np.ndarray:
    if not len(poses):
        return np.zeros((0, 3, 4))
    views = [_view(eye, target, up, fallback_down=pose[:, 1]) for eye, target, pose in zip(eyes, targets, poses)]
    return np.stack(views)


def _view(eye: np.ndarray, target: np.ndarray, up: np.ndarray, *, fallback_down: np.ndarray) -> np.ndarray:
    """look_at with the scene's up, or the camera's own up (minus its y axis) where the view
    looks straight along the scene's up."""
    try:
        return look_at(eye, target, up).numpy()
    except ValueError:
        return look_at(eye, target, -torch.as_tensor(fallback_down, dtype=torch.float64)).numpy()
