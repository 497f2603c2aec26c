"""nerfstudio dataset: ``transforms.json`` + ``images/<stem>.png`` (+ ``masks/`` with a sky mask).

Conventions (nerfstudio's "nerfstudio-data" format):

* ``transform_matrix`` is the camera-to-world 4x4 in the OpenGL/Blender camera convention
  (x right, y up, z back): ``T_world_cam @ diag(1, -1, -1, 1)``. The world frame is the
  reconstruction's, unchanged (nerfstudio re-orients and recentres it itself).
* Intrinsics are per frame (``fl_x, fl_y, cx, cy, w, h``), ``camera_model`` is ``OPENCV``
  with zero distortion. nerfstudio, like COLMAP, puts pixel centres at ``+0.5`` (the
  top-left pixel's centre is (0.5, 0.5)) whereas mapstream's pixel (u, v) is the integer
  index, so ``cx = K[0, 2] + 0.5`` and ``cy = K[1, 2] + 0.5``.
* With a sky mask, ``mask_path`` points at an 8-bit PNG, 0 = sky (ignored in training).
* ``ply_file_path`` (optional) names a point cloud in the same world frame, e.g. the PLY from
  :func:`mapstream.export.points.write_ply`, used by splatfacto for initialisation.
* ``depth_file_path`` (optional, per frame) points at the 16-bit millimetre depth PNGs of
  :func:`mapstream.export.depth.write_depth_maps` (nerfstudio's default depth unit scale 1e-3
  matches; 0 = no depth), for depth-supervised models.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from mapstream.export.frames import frame_file_names, write_frame_images, write_sky_masks
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_write_text, prepare_dir

logger = logging.getLogger(__name__)

__all__ = ["OPENCV_TO_OPENGL_CAMERA", "nerfstudio_transforms", "write_nerfstudio"]

OPENCV_TO_OPENGL_CAMERA = np.diag([1.0, -1.0, -1.0, 1.0])
"""Right-multiplied onto a camera-to-world matrix: OpenCV camera axes -> OpenGL camera axes."""


def nerfstudio_transforms(
    recon: Reconstruction,
    *,
    image_dir: str = "images",
    mask_dir: str | None = "masks",
    depth_dir: str | None = None,
    ply_file_path: str | None = None,
) -> dict[str, Any]:
    """The ``transforms.json`` content (paths relative to the dataset folder, POSIX style)."""
    names = frame_file_names(recon)
    H, W = recon.image_hw
    frames = []
    for i, name in enumerate(names):
        T = np.eye(4)
        T[:3] = recon.T_world_cam[i].astype(np.float64)
        K = recon.K[i].astype(np.float64)
        frame: dict[str, Any] = {
            "file_path": f"{image_dir}/{name}",
            "transform_matrix": (T @ OPENCV_TO_OPENGL_CAMERA).tolist(),
            "fl_x": float(K[0, 0]),
            "fl_y": float(K[1, 1]),
            "cx": float(K[0, 2]) + 0.5,
            "cy": float(K[1, 2]) + 0.5,
            "w": W,
            "h": H,
        }
        if recon.sky_mask is not None and mask_dir is not None:
            frame["mask_path"] = f"{mask_dir}/{name}"
        if depth_dir is not None:
            frame["depth_file_path"] = f"{depth_dir}/{name}"
        frames.append(frame)
    transforms: dict[str, Any] = {"camera_model": "OPENCV", "frames": frames}
    if ply_file_path is not None:
        transforms["ply_file_path"] = ply_file_path
    return transforms


def write_nerfstudio(
    recon: Reconstruction,
    folder: str | os.PathLike[str],
    *,
    write_images: bool = True,
    ply_file_path: str | None = None,
    depth_dir: str | None = None,
) -> Path:
    """Write a self-contained nerfstudio dataset into ``folder``; returns the transforms.json path.

    Writes ``images/<stem>.png`` (unless ``write_images`` is False, e.g. already written),
    ``masks/<stem>.png`` when there is a sky mask, then ``transforms.json`` last, so a present
    transforms.json means the images are complete. ``ply_file_path`` and ``depth_dir`` (e.g.
    ``"depth"``) are stored as given, relative to ``folder``; those files are not written here.
    """
    folder = prepare_dir(folder)
    if write_images:
        write_frame_images(recon, folder / "images")
    has_masks = bool(write_sky_masks(recon, folder / "masks"))
    transforms = nerfstudio_transforms(
        recon, mask_dir="masks" if has_masks else None, depth_dir=depth_dir, ply_file_path=ply_file_path
    )
    path = atomic_write_text(folder / "transforms.json", json.dumps(transforms, indent=2) + "\n")
    logger.info("wrote %s (%d frames)", path, len(recon))
    return path
