"""World point clouds from depth maps, and the coloured PLY writer.

Pipeline (:func:`build_point_cloud`): per frame, keep the pixels that pass
:func:`valid_pixel_mask` (finite depth > 0, confidence filter, not sky), unproject them with
:func:`mapstream.geometry.unproject_depth` into world coordinates (the reconstruction's world
frame, unchanged), colour them from the frame, then optionally average them on a voxel grid
(:func:`voxel_downsample`) and cap the count by a seeded uniform random subsample.
Everything is done one frame at a time, so memory stays bounded by the output.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mapstream.export._optional import import_optional
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_open
from mapstream.geometry import unproject_depth

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONF_THRESHOLD",
    "CloudOptions",
    "measured_pixels",
    "PointSet",
    "build_point_cloud",
    "confidence_threshold",
    "subsample",
    "valid_pixel_mask",
    "voxel_downsample",
    "write_ply",
]

DEFAULT_CONF_THRESHOLD = 1.5
"""The confidence a pixel must exceed to enter a point cloud, and to be shown by the viewers,
the renderer and the service, unless told otherwise (model confidences are > 1; the
reference viewer's default)."""


@dataclass(frozen=True)
class CloudOptions:
    """How depth maps become a point cloud.

    Attributes:
        conf_threshold: keep pixels with confidence STRICTLY above this absolute value
            (default `DEFAULT_CONF_THRESHOLD`). None: no cut.
        conf_percentile: additionally keep only pixels with confidence >= this percentile
            (0-100) of the valid pixels' confidences over the whole sequence. None: no cut.
        mask_sky: drop sky pixels when the reconstruction has a sky mask.
        voxel_size: edge of the averaging voxel grid in world units; None: no downsampling.
        max_points: cap on the output count (seeded uniform subsample); None: no cap.
        seed: random seed of the subsampling.
        drop_black: drop pixels whose colour is near black (R + G + B < 16): a dark backdrop
            or the padding of a frame (the reference GLB writer's black-background filter).
        drop_white: drop pixels whose channels are all > 240: a white backdrop or the white
            padding of ``pad`` preprocessing (its white-background filter).
    """

    conf_threshold: float | None = DEFAULT_CONF_THRESHOLD
    conf_percentile: float | None = None
    mask_sky: bool = True
    voxel_size: float | None = None
    max_points: int | None = 2_000_000
    seed: int = 0
    drop_black: bool = False
    drop_white: bool = False

    def __post_init__(self) -> None:
        # The one check of these settings: `mapstream run` and `mapstream export` build a
        # CloudOptions before any frame is read to have them checked.
        if self.conf_threshold is not None and math.isnan(self.conf_threshold):
            raise ValueError(f"conf_threshold is NaN; give a number ({DEFAULT_CONF_THRESHOLD} by default)")
        if self.conf_percentile is not None and not 0 <= self.conf_percentile <= 100:
            raise ValueError(f"conf_percentile must be in [0, 100] (or unset), got {self.conf_percentile}")
        if self.voxel_size is not None and not 0 < self.voxel_size < math.inf:
            raise ValueError(f"voxel_size must be > 0 and finite (or unset for no voxel grid), got {self.voxel_size}")
        if self.max_points is not None and self.max_points < 0:
            raise ValueError(f"max_points must be >= 0, got {self.max_points}")


@dataclass(frozen=True)
class PointSet:
    """A coloured point cloud in world coordinates.

    Attributes:
        xyz: ``[P, 3]`` float32 world points.
        rgb: ``[P, 3]`` uint8 colours.
        conf: ``[P]`` float32 confidence (voxel mean after downsampling).
        frame: ``[P]`` int64 source frame index, or None after voxel averaging.
        uv: ``[P, 2]`` int64 source pixel (column, row), or None after voxel averaging.
    """

    xyz: np.ndarray
    rgb: np.ndarray
    conf: np.ndarray
    frame: np.ndarray | None = None
    uv: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.xyz.shape[0])

    def take(self, index: np.ndarray) -> PointSet:
        """The points at ``index`` (indices or boolean mask)."""
        return PointSet(
            self.xyz[index], self.rgb[index], self.conf[index],
            None if self.frame is None else self.frame[index],
            None if self.uv is None else self.uv[index],
        )


def confidence_threshold(recon: Reconstruction, percentile: float, *, mask_sky: bool = True) -> float:
    """The ``percentile`` (0-100) of the confidences of valid pixels (finite depth > 0, not sky).

    Estimated on a strided sample of at most ~10M pixels for long sequences.
    """
    valid = _base_mask(recon, mask_sky)
    stride = max(1, int(np.ceil(valid.size / 10_000_000)))
    sample = recon.depth_conf.reshape(-1)[::stride][valid.reshape(-1)[::stride]]
    return float(np.percentile(sample, percentile)) if sample.size else float("inf")


def measured_pixels(depth: np.ndarray, depth_conf: np.ndarray) -> np.ndarray:
    """Pixels with a measurement (finite depth > 0 and a finite confidence), the one rule
    every point cloud (files, viewers, the live view) starts from; any shape, as bool."""
    return np.isfinite(depth) & (depth > 0) & np.isfinite(depth_conf)


def _base_mask(recon: Reconstruction, mask_sky: bool) -> np.ndarray:
    valid = measured_pixels(recon.depth, recon.depth_conf)
    if mask_sky and recon.sky_mask is not None:
        valid &= ~recon.sky_mask
    return valid


def valid_pixel_mask(recon: Reconstruction, options: CloudOptions = CloudOptions()) -> np.ndarray:
    """``[N, H, W]`` bool: pixels that become points (finite depth > 0, confidence, not sky)."""
    valid = _base_mask(recon, options.mask_sky)
    if options.conf_threshold is not None:
        valid &= recon.depth_conf > options.conf_threshold
    if options.conf_percentile is not None:
        valid &= recon.depth_conf >= confidence_threshold(recon, options.conf_percentile, mask_sky=options.mask_sky)
    if options.drop_black or options.drop_white:
        for start in range(0, len(recon), _COLOUR_CHUNK):  # chunks: the images may be memory-mapped
            valid[start : start + _COLOUR_CHUNK] &= ~background_pixels(
                recon.images[start : start + _COLOUR_CHUNK], black=options.drop_black, white=options.drop_white
            )
    return valid


_COLOUR_CHUNK = 64


def background_pixels(images: np.ndarray, *, black: bool, white: bool) -> np.ndarray:
    """``[..., H, W]`` bool of ``images`` ``[..., H, W, 3]`` uint8: near black (R + G + B < 16)
    when ``black``, near white (every channel > 240) when ``white``."""
    images = np.asarray(images)
    out = np.zeros(images.shape[:-1], dtype=bool)
    if black:
        out |= images.astype(np.int32).sum(-1) < 16
    if white:
        out |= (images > 240).all(-1)
    return out


def _frame_points(recon: Reconstruction, i: int, mask: np.ndarray) -> PointSet:
    """Points of frame ``i`` at the pixels where ``mask [H, W]`` is True."""
    rows, cols = np.nonzero(mask)
    world = unproject_depth(
        torch.from_numpy(recon.depth[i]), torch.from_numpy(recon.K[i]), torch.from_numpy(recon.T_world_cam[i])
    ).numpy()
    return PointSet(
        xyz=world[rows, cols].astype(np.float32),
        rgb=recon.images[i, rows, cols],
        conf=recon.depth_conf[i, rows, cols],
        frame=np.full(rows.shape, i, dtype=np.int64),
        uv=np.stack((cols, rows), axis=-1).astype(np.int64),
    )


def _concat(parts: list[PointSet]) -> PointSet:
    if not parts:
        return PointSet(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8), np.zeros(0, np.float32),
                        np.zeros(0, np.int64), np.zeros((0, 2), np.int64))
    with_source = all(p.frame is not None for p in parts)
    return PointSet(
        np.concatenate([p.xyz for p in parts]),
        np.concatenate([p.rgb for p in parts]),
        np.concatenate([p.conf for p in parts]),
        np.concatenate([p.frame for p in parts]) if with_source else None,
        np.concatenate([p.uv for p in parts]) if with_source else None,
    )


class _VoxelAccumulator:
    """Running per-voxel sums (xyz, rgb, conf) and counts; merged as frames arrive."""

    def __init__(self, voxel_size: float) -> None:
        self.voxel_size = voxel_size
        self.keys = np.zeros((0, 3), np.int64)
        self.sums = np.zeros((0, 7), np.float64)
        self.counts = np.zeros(0, np.int64)
        self._pending = 0

    def add(self, points: PointSet) -> None:
        keys = np.floor(points.xyz.astype(np.float64) / self.voxel_size).astype(np.int64)
        sums = np.concatenate([points.xyz, points.rgb, points.conf[:, None]], axis=1).astype(np.float64)
        self.keys = np.concatenate([self.keys, keys])
        self.sums = np.concatenate([self.sums, sums])
        self.counts = np.concatenate([self.counts, np.ones(len(keys), np.int64)])
        self._pending += len(keys)
        if self._pending > max(1_000_000, len(self.keys) // 2):
            self._reduce()

    def _reduce(self) -> None:
        if len(self.keys) == 0:
            return
        self.keys, inverse = np.unique(self.keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        n = len(self.keys)
        self.sums = np.stack([np.bincount(inverse, self.sums[:, c], minlength=n) for c in range(7)], axis=1)
        self.counts = np.bincount(inverse, self.counts, minlength=n).astype(np.int64)
        self._pending = 0

    def result(self) -> PointSet:
        self._reduce()
        mean = self.sums / np.maximum(self.counts, 1)[:, None]
        return PointSet(
            xyz=mean[:, :3].astype(np.float32),
            rgb=np.clip(np.rint(mean[:, 3:6]), 0, 255).astype(np.uint8),
            conf=mean[:, 6].astype(np.float32),
        )


def voxel_downsample(points: PointSet, voxel_size: float) -> PointSet:
    """Average the points (position, colour, confidence) falling in each voxel of edge ``voxel_size``.

    Voxel ``k = floor(xyz / voxel_size)``; output order follows the sorted voxel keys;
    ``frame`` / ``uv`` are dropped.
    """
    if not voxel_size > 0:
        raise ValueError(f"voxel_size must be > 0, got {voxel_size}")
    accumulator = _VoxelAccumulator(voxel_size)
    accumulator.add(points)
    return accumulator.result()


def subsample(points: PointSet, max_points: int | None, *, seed: int | np.random.Generator = 0) -> PointSet:
    """At most ``max_points`` points, drawn uniformly without replacement, order kept (None: all)."""
    if max_points is None or len(points) <= max_points:
        return points
    rng = np.random.default_rng(seed)
    return points.take(np.sort(rng.choice(len(points), size=max_points, replace=False)))


def build_point_cloud(recon: Reconstruction, options: CloudOptions = CloudOptions()) -> PointSet:
    """The coloured world point cloud of ``recon`` (see the module docstring).

    Without voxel downsampling the points keep their source ``frame`` and pixel ``uv`` and are
    ordered by frame, then raster order.
    """
    mask = valid_pixel_mask(recon, options)
    total = int(mask.sum())
    rng = np.random.default_rng(options.seed)
    # Thin each frame early (Bernoulli, 2x margin) when a cap is far below the candidate count.
    keep_prob = 1.0
    if options.voxel_size is None and options.max_points is not None and total > 2 * options.max_points:
        keep_prob = 2.0 * options.max_points / total
    accumulator = _VoxelAccumulator(options.voxel_size) if options.voxel_size is not None else None
    parts: list[PointSet] = []
    for i in range(len(recon)):
        frame_mask = mask[i]
        if keep_prob < 1.0:
            frame_mask = frame_mask & (rng.random(frame_mask.shape) < keep_prob)
        if not frame_mask.any():
            continue
        points = _frame_points(recon, i, frame_mask)
        if accumulator is not None:
            accumulator.add(points)
        else:
            parts.append(points)
    cloud = accumulator.result() if accumulator is not None else _concat(parts)
    cloud = subsample(cloud, options.max_points, seed=rng)
    logger.info("point cloud: %d of %d candidate pixels -> %d points", total, mask.size, len(cloud))
    _tell_few_kept(recon, options, total)
    return cloud


FEW_KEPT_FRACTION = 0.05
"""A point cloud that keeps less than this fraction of the measured pixels is told in a warning."""


def _tell_few_kept(recon: Reconstruction, options: CloudOptions, kept: int) -> None:
    """Warn when the filters keep less than `FEW_KEPT_FRACTION` of the measured pixels, naming
    the setting that leaves out the most of them."""
    measured = _base_mask(recon, options.mask_sky)
    count = int(measured.sum())
    if count == 0 or kept >= FEW_KEPT_FRACTION * count:
        return
    cuts: list[tuple[int, str]] = []
    if options.conf_threshold is not None:
        cuts.append((int((measured & ~(recon.depth_conf > options.conf_threshold)).sum()),
                     f"the confidence threshold {options.conf_threshold:g} (--conf-threshold, CloudOptions.conf_threshold)"))
    if options.conf_percentile is not None:
        cut = confidence_threshold(recon, options.conf_percentile, mask_sky=options.mask_sky)
        cuts.append((int((measured & ~(recon.depth_conf >= cut)).sum()),
                     f"the confidence percentile {options.conf_percentile:g} (--conf-percentile, CloudOptions.conf_percentile)"))
    if options.drop_black or options.drop_white:
        cuts.append((count - kept, "the background filter (--drop-black-background / --drop-white-background, "
                                   "CloudOptions.drop_black / drop_white)"))
    dropped, setting = max(cuts, default=(count - kept, "the filters"))
    median = float(np.median(recon.depth_conf[measured]))
    logger.warning(
        "the point cloud keeps %.1f %% of the %d measured pixels: %s leaves out %.1f %% of them (the run's median "
        "confidence is %.3g); lower that setting for a fuller cloud",
        100.0 * kept / count, count, setting, 100.0 * dropped / count, median,
    )


def write_ply(
    recon: Reconstruction,
    path: str | os.PathLike[str],
    options: CloudOptions = CloudOptions(),
    *,
    points: PointSet | None = None,
) -> Path:
    """Write the coloured point cloud as a binary little-endian PLY, atomically.

    Vertex properties: ``x, y, z`` (float32, world frame of the reconstruction, OpenCV-style
    world as predicted) and ``red, green, blue`` (uint8). ``points`` (e.g. shared with the GLB
    writer) overrides building the cloud from ``recon`` with ``options``.
    """
    plyfile = import_optional("plyfile", "writing PLY point clouds")
    cloud = build_point_cloud(recon, options) if points is None else points
    if len(cloud) == 0:
        logger.warning("no point passed the filters; writing an empty point cloud to %s", path)
    vertex = np.empty(
        len(cloud),
        dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")],
    )
    for c, axis in enumerate("xyz"):
        vertex[axis] = cloud.xyz[:, c]
    for c, channel in enumerate(("red", "green", "blue")):
        vertex[channel] = cloud.rgb[:, c]
    ply = plyfile.PlyData([plyfile.PlyElement.describe(vertex, "vertex")], text=False, byte_order="<")
    ply.comments.append("mapstream point cloud (world frame of the reconstruction)")
    with atomic_open(path, "wb") as handle:
        ply.write(handle)
    logger.info("wrote %s (%d points)", path, len(cloud))
    return Path(path)
