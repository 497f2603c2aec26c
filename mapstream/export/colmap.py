"""COLMAP text model: ``cameras.txt``, ``images.txt``, ``points3D.txt``.

Follows COLMAP's documented text format (https://colmap.github.io/format.html):

* ``cameras.txt``: ``CAMERA_ID PINHOLE WIDTH HEIGHT fx fy cx cy``; one camera shared by all
  frames when their intrinsics are identical, else one per frame (id = image id).
  COLMAP puts the centre of the top-left pixel at (0.5, 0.5) whereas mapstream's pixel (u, v)
  is the integer index, so ``cx = K[0, 2] + 0.5``, ``cy = K[1, 2] + 0.5``.
* ``images.txt``: two lines per image, ``IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME`` with the
  WORLD-TO-CAMERA pose ``T_cam_world`` (scalar-first quaternion, ``qw >= 0``), then the 2D
  points ``X Y POINT3D_ID`` (COLMAP pixel coordinates) that observe the 3D points below.
  Image ids are 1..N in frame order; names are ``<stem>.png`` as written by
  :func:`mapstream.export.frames.write_frame_images`.
* ``points3D.txt``: ``POINT3D_ID X Y Z R G B ERROR TRACK[]`` for a random subsample of the
  confident depth pixels (not voxel averaged), each with a one-observation track
  ``IMAGE_ID POINT2D_IDX`` (its source pixel) and ``ERROR = 0`` (it reprojects exactly). A
  ``points`` argument without source pixels (e.g. voxel averaged) gives empty tracks.

Lay it out as ``<dataset>/sparse/0/*.txt`` next to ``<dataset>/images/`` (what Gaussian
splatting trainers and COLMAP's GUI import expect); :func:`mapstream.export.export_all` does.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from mapstream.export.frames import frame_file_names
from mapstream.export.points import CloudOptions, PointSet, build_point_cloud
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_open, prepare_dir
from mapstream.geometry import mat_to_quat

logger = logging.getLogger(__name__)

__all__ = ["COLMAP_CLOUD_OPTIONS", "colmap_camera_params", "write_colmap"]

COLMAP_CLOUD_OPTIONS = CloudOptions(max_points=100_000)
"""Default subsample of ``points3D.txt``: confidence above the point cloud's threshold, not
sky, at most 100k points."""


def colmap_camera_params(recon: Reconstruction) -> np.ndarray:
    """``[N, 4]`` float64 PINHOLE parameters ``fx fy cx cy`` in COLMAP's pixel convention."""
    K = recon.K.astype(np.float64)
    return np.stack([K[:, 0, 0], K[:, 1, 1], K[:, 0, 2] + 0.5, K[:, 1, 2] + 0.5], axis=1)


def write_colmap(
    recon: Reconstruction,
    folder: str | os.PathLike[str],
    options: CloudOptions = COLMAP_CLOUD_OPTIONS,
    *,
    points: PointSet | None = None,
    shared_camera: bool | None = None,
) -> dict[str, Path]:
    """Write the three text files into ``folder`` (conventions in the module docstring).

    Args:
        recon: the reconstruction.
        folder: model folder, e.g. ``out/sparse/0``.
        options: how the 3D points are chosen (ignored when ``points`` is given).
        points: a precomputed cloud; with ``frame`` / ``uv`` it gets one-observation tracks.
        shared_camera: True: one camera (the first frame's intrinsics) for all images; False:
            one per image; None: shared exactly when all intrinsics are identical.

    Returns:
        ``{"cameras": path, "images": path, "points3D": path}``.
    """
    folder = prepare_dir(folder)
    params = colmap_camera_params(recon)
    if shared_camera is None:
        shared_camera = bool(np.all(params == params[:1]))
    camera_ids = np.ones(len(recon), np.int64) if shared_camera else np.arange(1, len(recon) + 1)
    cloud = build_point_cloud(recon, options) if points is None else points
    with_tracks = cloud.frame is not None and cloud.uv is not None
    H, W = recon.image_hw

    paths = {"cameras": folder / "cameras.txt", "images": folder / "images.txt", "points3D": folder / "points3D.txt"}
    n_cameras = 1 if shared_camera else len(recon)
    with atomic_open(paths["cameras"], "w") as f:
        f.write("# Camera list with one line of data per camera:\n")
        f.write("#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n")
        f.write(f"# Number of cameras: {n_cameras}\n")
        for camera_id in range(1, n_cameras + 1):
            fx, fy, cx, cy = params[camera_id - 1]
            f.write(f"{camera_id} PINHOLE {W} {H} {fx:.17g} {fy:.17g} {cx:.17g} {cy:.17g}\n")

    # Point ids are 1..P in cloud order. Each image lists its observations in point order;
    # POINT2D_IDX is the position in that list.
    point2d_idx = np.zeros(len(cloud), np.int64)
    per_image: list[np.ndarray] = [np.zeros(0, np.int64)] * len(recon)
    if with_tracks:
        order = np.argsort(cloud.frame, kind="stable")
        bounds = np.searchsorted(cloud.frame[order], np.arange(len(recon) + 1))
        for i in range(len(recon)):
            members = order[bounds[i]:bounds[i + 1]]
            per_image[i] = members
            point2d_idx[members] = np.arange(len(members))

    T_cam_world = torch.from_numpy(recon.T_cam_world.astype(np.float64))
    quat_xyzw = mat_to_quat(T_cam_world[:, :, :3]).numpy()
    quat_xyzw /= np.linalg.norm(quat_xyzw, axis=1, keepdims=True)
    translation = T_cam_world[:, :, 3].numpy()
    names = frame_file_names(recon)
    mean_obs = len(cloud) / len(recon) if with_tracks else 0.0
    with atomic_open(paths["images"], "w") as f:
        f.write("# Image list with two lines of data per image:\n")
        f.write("#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n")
        f.write("#   POINTS2D[] as (X, Y, POINT3D_ID)\n")
        f.write(f"# Number of images: {len(recon)}, mean observations per image: {mean_obs:g}\n")
        for i in range(len(recon)):
            qx, qy, qz, qw = quat_xyzw[i]
            tx, ty, tz = translation[i]
            f.write(
                f"{i + 1} {qw:.17g} {qx:.17g} {qy:.17g} {qz:.17g} {tx:.17g} {ty:.17g} {tz:.17g} "
                f"{camera_ids[i]} {names[i]}\n"
            )
            members = per_image[i]
            xy = (cloud.uv[members] + 0.5).tolist() if len(members) else []
            f.write(" ".join(f"{x:g} {y:g} {pid}" for (x, y), pid in zip(xy, (members + 1).tolist())) + "\n")

    with atomic_open(paths["points3D"], "w") as f:
        f.write("# 3D point list with one line of data per point:\n")
        f.write("#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n")
        track_length = 1.0 if with_tracks and len(cloud) else 0.0
        f.write(f"# Number of points: {len(cloud)}, mean track length: {track_length:g}\n")
        if with_tracks:
            tracks = [f" {i} {k}" for i, k in zip((cloud.frame + 1).tolist(), point2d_idx.tolist())]
        else:
            tracks = [""] * len(cloud)
        for p, ((x, y, z), (r, g, b), track) in enumerate(zip(cloud.xyz.tolist(), cloud.rgb.tolist(), tracks)):
            f.write(f"{p + 1} {x:.9g} {y:.9g} {z:.9g} {r} {g} {b} 0{track}\n")
    logger.info(
        "wrote COLMAP model to %s (%d images, %d cameras, %d points)", folder, len(recon), n_cameras, len(cloud)
    )
    return paths
