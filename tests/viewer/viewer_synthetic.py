"""A small synthetic reconstruction for the viewer tests: cameras looking at a textured plane.

N frames of H x W pixels; camera i sits at x = 0.1 i looking down +z at the plane z = PLANE_Z.
The plane is a checkerboard of RED and GREEN tiles of TILE pixels; the top SKY_ROWS rows are
marked sky; confidence is ``1 + (row + column) / (H + W) * 4`` (so in [1, CONF_MAX)); frame 1
has its last row invalid (depth NaN) and one pixel at depth 0.
"""
from __future__ import annotations

import numpy as np

from mapstream.export import Reconstruction

N, H, W = 3, 28, 42
PLANE_Z = 2.0
FX = FY = 40.0
TILE = 7
SKY_ROWS = 4
RED = (230, 30, 30)
GREEN = (30, 200, 60)
CONF_MAX = 5.0
"""Upper bound of the confidence (never reached)."""
INVALID_PIXELS = W + 1
"""Pixels of frame 1 with a NaN depth (last row) or depth 0 (one pixel)."""


def make_recon(*, sky: bool = True, n: int = N) -> Reconstruction:
    """The synthetic reconstruction (with a sky mask unless ``sky`` is False)."""
    rows, cols = np.mgrid[0:H, 0:W]
    red = ((rows // TILE + cols // TILE) % 2 == 0)[..., None]
    image = np.where(red, np.array(RED, np.uint8), np.array(GREEN, np.uint8)).astype(np.uint8)
    depth = np.full((n, H, W), PLANE_Z, np.float32)
    if n > 1:
        depth[1, -1] = np.nan
        depth[1, 0, 0] = 0.0
    conf = np.broadcast_to(1.0 + (rows + cols) / (H + W) * (CONF_MAX - 1.0), (n, H, W)).astype(np.float32)
    pose = np.zeros((n, 3, 4), np.float32)
    pose[:, :, :3] = np.eye(3)
    pose[:, 0, 3] = 0.1 * np.arange(n)
    K = np.array([[FX, 0, W / 2], [0, FY, H / 2], [0, 0, 1]], np.float32)
    sky_mask = np.broadcast_to(rows < SKY_ROWS, (n, H, W)).copy() if sky else None
    return Reconstruction(
        images=np.broadcast_to(image, (n, H, W, 3)).copy(),
        depth=depth,
        depth_conf=conf,
        T_world_cam=pose,
        K=np.broadcast_to(K, (n, 3, 3)).copy(),
        pose_enc=np.zeros((n, 9), np.float32),
        names=[f"frame_{i:03d}.png" for i in range(n)],
        sky_mask=sky_mask,
    )
