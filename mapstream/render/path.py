"""Where the flythrough's virtual camera is at each frame: pure functions of the trajectory.

follow   behind and above the reconstruction's camera, looking a little ahead of it;
birdeye  high above the camera, looking down at it;
static   the viewer's default viewpoint (behind and above the first camera) throughout.

Positions and viewing directions are smoothed over neighbouring frames (a Gaussian in frame
index; the whole trajectory is known, so the filter is centred), so that the shake of a
hand-held camera does not shake the flythrough.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from mapstream.geometry import look_at

__all__ = ["PATH_MODES", "PathMode", "PathStyle", "camera_path", "smooth"]

PathMode = Literal["follow", "birdeye", "static"]
PATH_MODES: tuple[str, ...] = ("follow", "birdeye", "static")


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

    def __post_init__(self) -> None:
        if self.mode not in PATH_MODES:
            raise ValueError(f"mode must be one of {PATH_MODES}, got {self.mode!r}")
        if self.smooth_frames < 0:
            raise ValueError(f"smooth_frames must be >= 0, got {self.smooth_frames}")


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
        overview: ``(eye, target)`` of the static view (required for mode "static").
    """
    poses = np.asarray(T_world_cam, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    if style.mode == "static":
        if overview is None:
            raise ValueError("the static path needs the overview viewpoint (eye, target)")
        view = _view(overview[0], overview[1], up, fallback_down=poses[0, :, 1])
        return np.repeat(view[None], len(poses), axis=0)
    centres = smooth(poses[:, :, 3], style.smooth_frames)
    forwards = smooth(poses[:, :, 2], style.smooth_frames)
    forwards /= np.maximum(np.linalg.norm(forwards, axis=1, keepdims=True), 1e-12)
    views = []
    for centre, forward, pose in zip(centres, forwards, poses):
        if style.mode == "follow":
            eye = centre - forward * style.back * extent + up * style.height * extent
            target = centre + forward * style.ahead * extent
        else:  # birdeye: high above, a little behind, so the camera's heading reads as "up"
            eye = centre + up * 0.8 * extent - forward * 0.2 * extent
            target = centre
        views.append(_view(eye, target, up, fallback_down=pose[:, 1]))
    return np.stack(views)


def _view(eye: np.ndarray, target: np.ndarray, up: np.ndarray, *, fallback_down: np.ndarray) -> np.ndarray:
    """look_at with the scene's up, or the camera's own up (minus its y axis) where the view
    looks straight along the scene's up."""
    try:
        return look_at(eye, target, up).numpy()
    except ValueError:
        return look_at(eye, target, -torch.as_tensor(fallback_down, dtype=torch.float64)).numpy()
