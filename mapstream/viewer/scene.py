"""What the viewer shows, computed without a browser or viser: point sets, cameras, framing.

:func:`build_point_pool` unprojects every valid depth pixel of a :class:`Reconstruction` once
(capped by a seeded uniform subsample; :mod:`mapstream.render.scene`, which the flythrough
renders from too), and :func:`select_points` / :func:`visible_frames` /
:func:`visible_cameras` answer "which points / frames / frustums are shown for these slider
values"; :func:`view_preset` gives the viewpoints of the "View" buttons. The viewer app
(:mod:`mapstream.viewer.app`) only forwards those answers to viser.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np

from mapstream.export import Reconstruction
from mapstream.render.scene import (
    DEFAULT_MAX_POINTS,
    PointPool,
    SceneFraming,
    build_point_pool,
    scene_framing,
    select_points,
)

__all__ = [
    "DEFAULT_MAX_POINTS",
    "glide",
    "FrameMode",
    "PRESET_DISTANCE",
    "VIEW_PRESETS",
    "PointPool",
    "SceneFraming",
    "build_point_pool",
    "downscale_image",
    "frame_indices",
    "frustum_params",
    "rotation_to_wxyz",
    "scene_axes",
    "scene_framing",
    "select_points",
    "trajectory_colors",
    "view_preset",
    "visible_cameras",
    "visible_frames",
]

FrameMode = Literal["up to t", "only t", "all"]
"""Which frames the scrubber shows: frames ``0..t``, frame ``t`` alone, or every frame."""

VIEW_PRESETS: tuple[str, ...] = (
    "overview", "front", "back", "left", "right", "top", "first camera", "current camera",
)
"""Names accepted by :func:`view_preset`."""

PRESET_DISTANCE = 1.0
"""Distance of the front / back / left / right / top viewpoints from the scene centre, in
multiples of :attr:`SceneFraming.extent`: far enough that the robust extent fits in a
typical browser field of view."""


def visible_frames(num_frames: int, t: int, mode: FrameMode) -> np.ndarray:
    """Bool ``[num_frames]``: the frames shown when the scrubber is at ``t`` in ``mode``.

    Raises:
        ValueError: unknown ``mode`` or ``t`` outside ``0..num_frames-1``.
    """
    if not 0 <= t < num_frames:
        raise ValueError(f"frame {t} is outside 0..{num_frames - 1}")
    index = np.arange(num_frames)
    if mode == "up to t":
        return index <= t
    if mode == "only t":
        return index == t
    if mode == "all":
        return np.ones(num_frames, bool)
    raise ValueError(f"unknown frame mode {mode!r}; expected 'up to t', 'only t' or 'all'")


def frame_indices(pool: PointPool, mask: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """Indices of the points selected by ``mask`` whose frame is shown in ``frames`` ([N] bool)."""
    return np.flatnonzero(mask & frames[pool.frame])


def visible_cameras(frames: np.ndarray, t: int, every: int) -> np.ndarray:
    """Bool ``[N]``: the frustums shown among the ``frames`` ([N] bool) the scrubber shows:
    frames ``i`` with ``i % every == 0``, and frame ``t`` whatever ``every`` is.

    Raises:
        ValueError: ``every`` < 1.
    """
    if every < 1:
        raise ValueError(f"camera subsampling must be >= 1, got {every}")
    index = np.arange(len(frames))
    return np.asarray(frames, bool) & ((index % every == 0) | (index == t))


def downscale_image(image: np.ndarray, max_side: int) -> np.ndarray:
    """``image`` ([H, W, ...]) sampled with the smallest integer stride that brings its longest
    side to at most ``max_side`` pixels (the image itself when it already fits).

    Raises:
        ValueError: ``max_side`` < 1.
    """
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    stride = -(-max(image.shape[:2]) // max_side)
    return image[::stride, ::stride] if stride > 1 else image


def trajectory_colors(num_frames: int) -> np.ndarray:
    """``[num_frames, 3]`` uint8 colours from dark blue (first frame) through teal to yellow (last)."""
    anchors = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64)
    s = np.linspace(0.0, 1.0, num_frames) if num_frames > 1 else np.zeros(1)
    x = s * (len(anchors) - 1)
    lo = np.minimum(np.floor(x).astype(int), len(anchors) - 2)
    frac = (x - lo)[:, None]
    return np.round(anchors[lo] * (1 - frac) + anchors[lo + 1] * frac).astype(np.uint8)


def rotation_to_wxyz(R: np.ndarray) -> np.ndarray:
    """Unit quaternion ``(w, x, y, z)`` of a 3x3 rotation matrix (w >= 0)."""
    R = np.asarray(R, np.float64)
    trace = np.trace(R)
    if trace > 0:
        s = 2.0 * math.sqrt(trace + 1.0)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(R)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + R[i, i] - R[j, j] - R[k, k], 1e-12))
        q = [0.0] * 4
        q[0] = (R[k, j] - R[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (R[j, i] + R[i, j]) / s
        q[1 + k] = (R[k, i] + R[i, k]) / s
    wxyz = np.asarray(q) / np.linalg.norm(q)
    return -wxyz if wxyz[0] < 0 else wxyz


def frustum_params(recon: Reconstruction, index: int) -> tuple[float, float, np.ndarray, np.ndarray]:
    """``(vertical fov in radians, aspect W/H, wxyz, position)`` of frame ``index``'s camera."""
    h, w = recon.image_hw
    fy = float(recon.K[index, 1, 1])
    fov = 2.0 * math.atan2(h / 2.0, fy)
    pose = recon.T_world_cam[index].astype(np.float64)
    return fov, w / h, rotation_to_wxyz(pose[:, :3]), pose[:, 3].copy()


def _unit(vector: np.ndarray) -> np.ndarray | None:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 1e-9 else None


def scene_axes(recon: Reconstruction, framing: SceneFraming) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, right, up)``: orthonormal world directions of the scene's own frame.

    ``up`` is :attr:`SceneFraming.up`; ``forward`` is the first camera's optical axis with its
    ``up`` component removed; ``right`` is perpendicular to both, on the side of the first
    camera's x axis (OpenCV: x right, y down, z forward).
    """
    up = np.asarray(framing.up, np.float64)
    first = recon.T_world_cam[0, :, :3].astype(np.float64)
    forward = None
    # A first camera looking straight along up has no horizontal optical axis; the top of its
    # image (minus y) is then the natural "forward".
    for axis in (first[:, 2], -first[:, 1], np.eye(3)[int(np.argmin(np.abs(up)))]):
        forward = _unit(axis - float(axis @ up) * up)
        if forward is not None:
            break
    assert forward is not None
    right = np.cross(forward, up)
    if float(right @ first[:, 0]) < 0:
        right = -right
    return forward, right, up


def _camera_view(
    recon: Reconstruction, framing: SceneFraming, index: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Viewpoint of camera ``index``: at its centre, along its optical axis, up = minus its y."""
    pose = recon.T_world_cam[index].astype(np.float64)
    position, axis = pose[:, 3], pose[:, 2] / np.linalg.norm(pose[:, 2])
    # Orbit about the point of the axis level with the scene centre, so dragging turns the
    # view around the scene rather than around the camera; never closer than a tenth of it.
    distance = max(float((framing.center - position) @ axis), 0.1 * framing.extent)
    return position, position + distance * axis, -pose[:, 1] / np.linalg.norm(pose[:, 1])


def view_preset(
    recon: Reconstruction, framing: SceneFraming, name: str, frame: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(position, look_at, up)`` float64 ``[3]`` of the viewpoint ``name`` (:data:`VIEW_PRESETS`).

    * "overview": the default viewpoint (:attr:`SceneFraming.camera_position`);
    * "front" / "back": :data:`PRESET_DISTANCE` extents behind / in front of the scene centre,
      looking along +forward / -forward (:func:`scene_axes`); "left" / "right": from that far
      on the left / right side, looking along +right / -right; all with ``framing.up`` up;
    * "top": from above, looking along -up, with forward at the top of the view;
    * "first camera" / "current camera": camera 0 / camera ``frame``, at its centre, looking
      along its optical axis, up = minus its y axis.

    Raises:
        ValueError: unknown ``name``, or ``frame`` outside ``0..N-1``.
    """
    if name not in VIEW_PRESETS:
        raise ValueError(f"unknown view {name!r}; expected one of {', '.join(VIEW_PRESETS)}")
    if not 0 <= frame < len(recon):
        raise ValueError(f"frame {frame} is outside 0..{len(recon) - 1}")
    if name == "overview":
        return (np.asarray(framing.camera_position, np.float64).copy(),
                np.asarray(framing.look_at, np.float64).copy(), np.asarray(framing.up, np.float64).copy())
    if name in ("first camera", "current camera"):
        return _camera_view(recon, framing, 0 if name == "first camera" else frame)
    forward, right, up = scene_axes(recon, framing)
    center = np.asarray(framing.center, np.float64)
    # Direction from the centre to the viewpoint, and the view's up.
    away, view_up = {
        "front": (-forward, up), "back": (forward, up), "left": (-right, up), "right": (right, up),
        "top": (up, forward),
    }[name]
    return center + PRESET_DISTANCE * framing.extent * away, center.copy(), view_up.copy()


def glide(
    start: tuple[np.ndarray, np.ndarray, np.ndarray], end: tuple[np.ndarray, np.ndarray, np.ndarray], steps: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The ``steps`` viewpoints ``(position, look_at, up)`` of a smooth move from ``start`` to
    ``end`` (the reference viewer moves in 15): position and look-at eased in and out
    (3u^2 - 2u^3 of the step's fraction u), up turned along with them; the last is ``end``.
    ``steps`` <= 1 is the jump alone."""
    end = tuple(np.asarray(v, np.float64) for v in end)
    if steps <= 1:
        return [end]
    start = tuple(np.asarray(v, np.float64) for v in start)
    path = []
    for k in range(1, steps):
        u = k / steps
        w = u * u * (3.0 - 2.0 * u)
        position, look_at, up = ((1.0 - w) * a + w * b for a, b in zip(start, end))
        norm = np.linalg.norm(up)
        path.append((position, look_at, up / norm if norm > 1e-9 else end[2]))  # opposite ups: the end's
    return [*path, end]
