"""Camera trajectory in the TUM RGB-D format (read by evo, the TUM tools, most SLAM benchmarks).

One line per frame, ``timestamp tx ty tz qx qy qz qw``: the camera-to-world pose
``T_world_cam`` (camera centre ``t`` in world coordinates, rotation as a unit quaternion,
scalar last, ``qw >= 0``), timestamps in seconds. A ``#`` header line names the columns.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_open
from mapstream.geometry import mat_to_quat

logger = logging.getLogger(__name__)

__all__ = ["tum_rows", "write_tum"]


def tum_rows(recon: Reconstruction, *, keyframes_only: bool = False) -> np.ndarray:
    """``[N, 8]`` float64 rows ``timestamp tx ty tz qx qy qz qw`` (camera-to-world)."""
    T = torch.from_numpy(recon.T_world_cam.astype(np.float64))
    quat = mat_to_quat(T[:, :3, :3])
    quat = quat / quat.norm(dim=-1, keepdim=True)
    rows = np.concatenate([recon.timestamps[:, None], T[:, :3, 3].numpy(), quat.numpy()], axis=1)
    return rows[recon.keyframe] if keyframes_only else rows


def write_tum(
    recon: Reconstruction, path: str | os.PathLike[str], *, keyframes_only: bool = False
) -> Path:
    """Write the trajectory (all frames, or only keyframes) in TUM format, atomically."""
    rows = tum_rows(recon, keyframes_only=keyframes_only)
    with atomic_open(path, "w") as handle:
        handle.write("# timestamp tx ty tz qx qy qz qw (camera-to-world, OpenCV camera axes)\n")
        for row in rows:
            handle.write(f"{row[0]:.6f} " + " ".join(f"{v:.9g}" for v in row[1:]) + "\n")
    logger.info("wrote %s (%d poses)", path, len(rows))
    return Path(path)
