"""`render_flythrough`: a video of the reconstruction growing, seen from a virtual camera.

Frame t of the video shows the points of frames 0..t (the run's confidence threshold and
sky mask applied), the trajectory so far, the current camera's frustum, and the input frame
t as an inset, optionally shaded by eye-dome lighting (`mapstream.render.edl`), and a caption
band across the top when one is given (a video of untrained weights says so on every frame,
since a clip is watched without its run's log). The virtual
camera follows one mode throughout or a file's segments (`mapstream.render.path_file`).
Drawn by `mapstream.render.raster.splat` on the CPU or a CUDA GPU; encoded
with PyAV (H.264 where the build has it, else MPEG-4 Part 2); written atomically, so an
interrupted render leaves no partial file.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from mapstream.device import resolve_device
from mapstream.export import Reconstruction
from mapstream.export.captions import draw_caption
from mapstream.export.glb import FRUSTUM_EDGES, frustum_corners
from mapstream.export.points import DEFAULT_CONF_THRESHOLD
from mapstream.progress import progress_bar
from mapstream.render.edl import eye_dome_lighting
from mapstream.render.path import PathMode, PathStyle, SegmentedPath, camera_path, segmented_camera_path
from mapstream.render.raster import pinhole, sample_segments, splat
from mapstream.render.video import VideoWriter, check_video_path, even_size
from mapstream.render.scene import DEFAULT_MAX_POINTS, SceneFraming, build_point_pool, scene_framing, select_points

logger = logging.getLogger(__name__)

__all__ = ["RenderOptions", "frames_drawn", "render_flythrough"]

_TRAIL = (255, 140, 0)
_FRUSTUM = (220, 20, 60)
_BACKGROUNDS = {"black": (0, 0, 0), "white": (255, 255, 255)}


@dataclass(frozen=True)
class RenderOptions:
    """How the flythrough looks."""

    mode: PathMode = "follow"
    """Virtual camera: follow (behind the camera), birdeye (above it), static (overview) or
    pivot (the overview turning about the scene centre over the run)."""
    turns: float = 1.0
    """pivot: turns about the scene centre over the run (counter-clockwise seen from above;
    negative: clockwise)."""
    height: int = 720
    """Video height in pixels; the width keeps the input frames' aspect (both made even)."""
    fps: float = 10.0
    """Video frames per second (one video frame per reconstruction frame)."""
    fov: float = 60.0
    """Vertical field of view of the virtual camera, degrees."""
    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Points with confidence strictly above this are drawn (confidence is > 1)."""
    hide_sky: bool = True
    """Leave out sky points when the run has a sky mask."""
    max_points: int = DEFAULT_MAX_POINTS
    """Most points drawn (seeded uniform subsample beyond)."""
    radius: int = 1
    """Each point covers (2 radius + 1)² pixels."""
    background: str = "black"
    """black or white."""
    inset: bool = True
    """Show the input frame in the bottom-left corner."""
    smooth_frames: float = 3.0
    """Smoothing of the virtual camera's path, in frames (0: none)."""
    every: int = 1
    """Draw every k-th frame (0, k, 2k, ... and the last), each with every point so far: a
    shorter video of a long run, and k times less drawing."""
    edl_strength: float = 0.0
    """Eye-dome lighting: how strongly pixels behind depth edges are darkened (0: off; try
    1 to 10). See :mod:`mapstream.render.edl`."""
    edl_radius: int = 2
    """Eye-dome lighting: distance in pixels of the neighbours each pixel is compared with."""
    camera_segments: SegmentedPath | None = None
    """A camera path made of segments (e.g. read by :func:`mapstream.render.path_file.load_path_file`);
    when given, ``mode`` is not used."""
    caption: str | None = None
    """Text on a red band across the top of every frame (e.g.
    :data:`mapstream.export.summary.UNTRAINED_CAPTION`); None: no band."""

    def __post_init__(self) -> None:
        if self.height < 16:
            raise ValueError(f"height must be >= 16 pixels, got {self.height}")
        if not 0 < self.fps <= 240:
            raise ValueError(f"fps must be in (0, 240], got {self.fps}")
        if not 1 <= self.fov < 180:
            raise ValueError(f"fov must be in [1, 180) degrees, got {self.fov}")
        if self.background not in _BACKGROUNDS:
            raise ValueError(f"background must be one of {sorted(_BACKGROUNDS)}, got {self.background!r}")
        if self.every < 1:
            raise ValueError(f"every must be >= 1 (1: every frame), got {self.every}")
        if self.radius < 0 or self.max_points < 1:
            raise ValueError(f"radius must be >= 0 and max_points >= 1, got {self.radius}, {self.max_points}")
        if not (math.isfinite(self.edl_strength) and self.edl_strength >= 0):
            raise ValueError(f"edl_strength must be a finite number >= 0 (0: off), got {self.edl_strength}")
        if self.edl_radius < 1:
            raise ValueError(f"edl_radius must be >= 1 pixel, got {self.edl_radius}")
        self.path_style()  # its own checks

    def path_style(self) -> PathStyle:
        """The virtual camera's path settings of ``mode`` (unused with ``camera_segments``)."""
        return PathStyle(mode=self.mode, smooth_frames=self.smooth_frames, turns=self.turns)


def render_flythrough(
    recon: Reconstruction, path: str | os.PathLike[str], options: RenderOptions = RenderOptions(), *,
    device: str | torch.device | None = None, progress: bool | None = None,
) -> Path:
    """Render ``recon`` to the video ``path`` (``.mp4``); returns the path.

    device: where the points are drawn (default: CUDA when available, else the CPU).
    progress: a bar over the frames (None: when stderr is a terminal).
    """
    path = check_video_path(path)
    device = resolve_device("auto") if device is None else torch.device(device)
    height, width = even_size(recon.image_hw, options.height)
    n = len(recon)
    pool = build_point_pool(recon, options.max_points)
    framing = scene_framing(recon, pool)
    shown = select_points(pool, options.conf_threshold, hide_sky=options.hide_sky and pool.has_sky_mask)
    # The pool is ordered by frame, so frame t's points so far are a prefix of the shown ones.
    upto = np.searchsorted(pool.frame[shown], np.arange(n), side="right")
    xyz = torch.from_numpy(pool.xyz[shown]).to(device)
    rgb = torch.from_numpy(pool.rgb[shown]).to(device)
    views = torch.from_numpy(_virtual_camera(recon, framing, options))
    K = pinhole(height, width, options.fov)
    trail, frusta, per_segment = _overlays(recon, framing.extent, device)
    background = _BACKGROUNDS[options.background]
    drawn = frames_drawn(n, options.every)
    logger.info("rendering %d of %d frames at %dx%d (%d points, %s view) to %s", len(drawn), n, width, height,
                len(xyz), "segmented" if options.camera_segments else options.mode, path)

    with VideoWriter(path, height=height, width=width, fps=options.fps) as video:
        with progress_bar(len(drawn), desc="render", progress=progress) as bar:
            for t in drawn:
                # Frame t's trajectory: the samples of segments 0..t-1, a prefix of the trail.
                points = torch.cat((xyz[: upto[t]], trail[0][: t * per_segment], frusta[t][0]))
                colors = torch.cat((rgb[: upto[t]], trail[1][: t * per_segment], frusta[t][1]))
                image = _draw(points, colors, K, views[t], (height, width), options, background)
                video.write(_annotate(image.cpu().numpy(), recon, t, options.inset, options.caption))
                bar.update(1)
    return path


def _virtual_camera(recon: Reconstruction, framing: SceneFraming, options: RenderOptions) -> np.ndarray:
    """``[N, 3, 4]`` camera-to-world of the virtual camera at each frame."""
    overview = (framing.camera_position, framing.look_at)
    if options.camera_segments is not None:
        return segmented_camera_path(recon.T_world_cam, options.camera_segments, extent=framing.extent,
                                     up=framing.up, overview=overview, smooth_frames=options.smooth_frames)
    return camera_path(recon.T_world_cam, extent=framing.extent, up=framing.up,
                       style=options.path_style(), overview=overview)


def _draw(
    points: torch.Tensor, colors: torch.Tensor, K: torch.Tensor, view: torch.Tensor, hw: tuple[int, int],
    options: RenderOptions, background: tuple[int, int, int],
) -> torch.Tensor:
    """One frame's splat, shaded by eye-dome lighting when it is on (when it is off, the
    depth buffer is not even asked for: the frame is exactly what it was without EDL)."""
    if options.edl_strength == 0:
        return splat(points, colors, K, view, hw, radius=options.radius, background=background)
    image, depth = splat(points, colors, K, view, hw, radius=options.radius, background=background, return_depth=True)
    return eye_dome_lighting(image, depth, strength=options.edl_strength, radius=options.edl_radius)


def frames_drawn(num_frames: int, every: int) -> list[int]:
    """The frames a flythrough draws: 0, every, 2 every, ... and the last, which shows the
    whole run."""
    return sorted(set(range(0, num_frames, every)) | ({num_frames - 1} if num_frames else set()))


_TRAIL_SAMPLES = 96  # points drawn along each segment of the trajectory


def _overlays(recon: Reconstruction, extent: float, device) -> tuple[tuple, list, int]:
    """The whole trajectory as (points, colours) sampled along its segments, segment after
    segment (frame t draws the first t segments: a prefix, so memory stays linear in the
    frames), the per-frame frustums likewise, and the samples per segment."""
    centres = torch.from_numpy(recon.T_world_cam[:, :, 3].astype(np.float64))
    corners = torch.from_numpy(frustum_corners(recon, 0.04 * extent))
    trail = sample_segments(centres[:-1], centres[1:], _TRAIL_SAMPLES) if len(recon) > 1 else torch.zeros(0, 3)
    edges = torch.from_numpy(FRUSTUM_EDGES)
    frusta = [
        _coloured(sample_segments(frame[edges[:, 0]], frame[edges[:, 1]], 48), _FRUSTUM, device) for frame in corners
    ]
    return _coloured(trail, _TRAIL, device), frusta, _TRAIL_SAMPLES


def _coloured(points: torch.Tensor, color: tuple[int, int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
    colors = torch.tensor(color, dtype=torch.uint8, device=device).expand(len(points), 3)  # a view: no copy
    return points.float().to(device), colors


def _annotate(image: np.ndarray, recon: Reconstruction, t: int, inset: bool, caption: str | None = None) -> np.ndarray:
    """The frame counter, the input frame t as an inset (a quarter of the height), and the
    caption band."""
    canvas = Image.fromarray(image)
    if inset:
        h = max(canvas.height // 4, 8)
        w = max(int(round(h * recon.image_hw[1] / recon.image_hw[0])), 8)
        thumb = Image.fromarray(np.asarray(recon.images[t])).resize((w, h), Image.BILINEAR)
        canvas.paste(thumb, (8, canvas.height - h - 8))
    top = draw_caption(canvas, caption) if caption else 0
    draw = ImageDraw.Draw(canvas)
    draw.text((8, top + 8), f"frame {t + 1}/{len(recon)}  {recon.names[t]}", fill=(255, 255, 255), stroke_width=2,
              stroke_fill=(0, 0, 0))
    return np.asarray(canvas)
