"""What a rendering of a run shows: its points and its framing, computed without a window.

:func:`build_point_pool` unprojects every valid depth pixel of a :class:`Reconstruction` once
(capped by a seeded uniform subsample), :func:`select_points` picks the ones shown for a
confidence threshold, and :func:`scene_framing` gives the scene's centre, size, up direction
and default viewpoint. The flythrough (:mod:`mapstream.render.flythrough`) and the viewer
(:mod:`mapstream.viewer.scene`) both draw from them.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from mapstream.export import Reconstruction
from mapstream.export.points import measured_pixels
from mapstream.geometry import unproject_depth

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_POINTS", "PointPool", "SceneFraming", "build_point_pool", "scene_framing", "select_points"]

DEFAULT_MAX_POINTS = 2_000_000
"""Default cap on the number of points the viewer ever holds (and so ever shows)."""


@dataclass(frozen=True)
class PointPool:
    """Every point the viewer may show, ordered by frame (P points).

    Attributes:
        xyz: world positions ``[P, 3]`` float32.
        rgb: colours ``[P, 3]`` uint8, from the frame image.
        conf: depth confidence ``[P]`` float32.
        sky: ``[P]`` bool, True where the run's sky mask marks sky (all False without one).
        frame: source frame index ``[P]`` int64, non-decreasing.
        rank: a seeded random permutation of ``0..P-1``; ``rank % k == 0`` keeps about
            1/k of the points, and the set for ``k`` contains the set for every multiple of ``k``.
        num_frames: N, the number of frames of the reconstruction.
        has_sky_mask: whether the reconstruction has a sky mask.
        num_valid: valid depth pixels before the cap (``P <= num_valid``).
    """

    xyz: np.ndarray
    rgb: np.ndarray
    conf: np.ndarray
    sky: np.ndarray
    frame: np.ndarray
    rank: np.ndarray
    num_frames: int
    has_sky_mask: bool
    num_valid: int

    def __len__(self) -> int:
        return int(self.xyz.shape[0])

    def frame_slice(self, index: int) -> slice:
        """The contiguous range of the points of frame ``index``."""
        start, stop = np.searchsorted(self.frame, [index, index + 1])
        return slice(int(start), int(stop))


def build_point_pool(recon: Reconstruction, max_points: int = DEFAULT_MAX_POINTS, seed: int = 0) -> PointPool:
    """Unproject the valid pixels of ``recon`` to world points, keeping at most ``max_points``.

    A pixel is valid when its depth is finite and > 0 and its confidence is finite. When more
    than ``max_points`` are valid, a uniform subsample drawn with ``numpy.random.default_rng(seed)``
    is kept, so the same inputs always give the same points.

    Raises:
        ValueError: ``max_points`` < 1.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    n, h, w = recon.depth.shape
    valid = measured_pixels(recon.depth, recon.depth_conf)
    flat = np.flatnonzero(valid)
    num_valid = int(flat.size)
    rng = np.random.default_rng(seed)
    if num_valid > max_points:
        flat = np.sort(rng.choice(flat, size=max_points, replace=False))
        logger.info("viewer: %d valid points, showing a seeded sample of %d", num_valid, max_points)
    frame = flat // (h * w)
    pixel = flat % (h * w)

    xyz = np.empty((flat.size, 3), np.float32)
    bounds = np.searchsorted(frame, np.arange(n + 1))
    for i in range(n):
        lo, hi = bounds[i], bounds[i + 1]
        if lo == hi:
            continue
        world = unproject_depth(
            torch.from_numpy(recon.depth[i]), torch.from_numpy(recon.K[i]), torch.from_numpy(recon.T_world_cam[i])
        )
        xyz[lo:hi] = world.reshape(-1, 3).numpy()[pixel[lo:hi]]

    sky = recon.sky_mask.reshape(-1)[flat] if recon.sky_mask is not None else np.zeros(flat.size, bool)
    return PointPool(
        xyz=xyz,
        rgb=recon.images.reshape(-1, 3)[flat],
        conf=recon.depth_conf.reshape(-1)[flat],
        sky=sky,
        frame=frame.astype(np.int64),
        rank=rng.permutation(flat.size),
        num_frames=n,
        has_sky_mask=recon.sky_mask is not None,
        num_valid=num_valid,
    )


def select_points(
    pool: PointPool, conf_threshold: float, *, hide_sky: bool = False, downsample: int = 1
) -> np.ndarray:
    """Mask ``[P]`` of the points shown: confidence strictly above ``conf_threshold``, not sky
    when ``hide_sky``, and one point in ``downsample`` (by :attr:`PointPool.rank`).

    Raises:
        ValueError: ``downsample`` < 1.
    """
    if downsample < 1:
        raise ValueError(f"downsample must be >= 1, got {downsample}")
    mask = pool.conf > conf_threshold
    if hide_sky:
        mask &= ~pool.sky
    if downsample > 1:
        mask &= pool.rank % downsample == 0
    return mask


@dataclass(frozen=True)
class SceneFraming:
    """Scene-dependent sizes and the default viewpoint.

    Attributes:
        center: robust centre of the points (median), world units.
        extent: robust size of the scene (2nd-98th percentile box diagonal), > 0.
        up: unit world "up": minus the mean camera y axis (OpenCV y points down).
        camera_position: default viewpoint, behind and above the first camera.
        look_at: the point the default viewpoint looks at.
        point_size: a point size (world units) that about closes the gaps between points: the
            median footprint of a pixel at its depth (``depth / fy``), grown by the square root
            of the subsample ratio when the pool was capped.
    """

    center: np.ndarray
    extent: float
    up: np.ndarray
    camera_position: np.ndarray
    look_at: np.ndarray
    point_size: float


def scene_framing(recon: Reconstruction, pool: PointPool) -> SceneFraming:
    """Centre, size, up direction and default viewpoint of the scene."""
    positions = recon.T_world_cam[:, :, 3].astype(np.float64)
    points = pool.xyz.astype(np.float64) if len(pool) else positions
    center = np.median(points, axis=0)
    lo, hi = np.percentile(points, [2, 98], axis=0) if len(points) > 1 else (points[0] - 1, points[0] + 1)
    extent = float(np.linalg.norm(hi - lo))
    if not math.isfinite(extent) or extent <= 1e-9:
        extent = 1.0
    up = -recon.T_world_cam[:, :, 1].astype(np.float64).mean(axis=0)
    norm = np.linalg.norm(up)
    up = up / norm if norm > 1e-9 else np.array([0.0, -1.0, 0.0])
    forward = recon.T_world_cam[0, :, 2].astype(np.float64)
    camera_position = positions[0] - forward * 0.3 * extent + up * 0.15 * extent

    depth = recon.depth[:, ::4, ::4]
    footprint = depth / recon.K[:, 1, 1, None, None]
    footprint = footprint[np.isfinite(footprint) & (depth > 0)]
    point_size = float(np.median(footprint)) * math.sqrt(pool.num_valid / max(len(pool), 1)) if footprint.size else 0.0
    if not math.isfinite(point_size) or point_size <= 0:
        point_size = 0.002 * extent
    return SceneFraming(
        center=center, extent=extent, up=up, camera_position=camera_position, look_at=center, point_size=point_size
    )
