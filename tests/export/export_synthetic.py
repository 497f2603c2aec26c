"""A small synthetic reconstruction with known geometry, computed independently of mapstream.

Four 28x42 frames look at the world plane ``z = PLANE_Z`` from known poses (camera-to-world,
OpenCV axes). Depth is the exact ray/plane intersection, so every valid pixel unprojects onto
the plane. Colours encode the pixel: ``(6 u, 9 v, 50 i + 5)``. Confidence cycles over
``1.1, 1.6, 2.1, 2.6, 3.1``. Invalid depth: frame 1 pixel (0, 0) is NaN, frame 2 row 0 is 0.
Frame 3 has a sky mask on its top 3 rows.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from mapstream.export import Reconstruction

N, H, W = 4, 28, 42
FX, FY = 30.0, 32.0
PLANE_Z = 5.0


def poses() -> np.ndarray:
    """``[N, 3, 4]`` float64 camera-to-world: identity first, then small rotations and moves."""
    T = np.zeros((N, 3, 4))
    for i in range(N):
        T[i, :, :3] = Rotation.from_euler("yx", [0.08 * i, -0.05 * i]).as_matrix()
        T[i, :, 3] = [0.3 * i, -0.1 * i, 0.2 * i]
    return T


def intrinsics() -> np.ndarray:
    K = np.array([[FX, 0, W / 2], [0, FY, H / 2], [0, 0, 1]])
    return np.repeat(K[None], N, axis=0)


def plane_depth(T: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Camera-space z of the plane ``z_world = PLANE_Z`` at every pixel (integer-centre pixels)."""
    v, u = np.mgrid[0:H, 0:W].astype(np.float64)
    rays = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], -1)  # z = 1
    dir_world_z = rays @ T[:, :3][2]
    return (PLANE_Z - T[2, 3]) / dir_world_z


def world_point(T: np.ndarray, K: np.ndarray, u: float, v: float, depth: float) -> np.ndarray:
    cam = np.array([(u - K[0, 2]) / K[0, 0] * depth, (v - K[1, 2]) / K[1, 1] * depth, depth])
    return T[:, :3] @ cam + T[:, 3]


def make_recon(*, sky: bool = True, fps: float | None = 10.0) -> Reconstruction:
    T, K = poses(), intrinsics()
    depth = np.stack([plane_depth(T[i], K[i]) for i in range(N)]).astype(np.float32)
    depth[1, 0, 0] = np.nan
    depth[2, 0, :] = 0.0
    v, u = np.mgrid[0:H, 0:W]
    images = np.stack(
        [np.stack([6 * u, 9 * v, np.full_like(u, 50 * i + 5)], -1) for i in range(N)]
    ).astype(np.uint8)
    conf = np.broadcast_to(1.1 + ((u + 2 * v) % 5) * 0.5, (N, H, W)).astype(np.float32)
    sky_mask = None
    if sky:
        sky_mask = np.zeros((N, H, W), bool)
        sky_mask[3, :3] = True
    return Reconstruction(
        images=images,
        depth=depth,
        depth_conf=conf,
        T_world_cam=T.astype(np.float32),
        K=K.astype(np.float32),
        pose_enc=np.arange(N * 9, dtype=np.float32).reshape(N, 9),
        names=[f"img_{i:03d}.jpg" for i in range(N)],
        keyframe=np.array([True, False, True, False]),
        sky_mask=sky_mask,
        fps=fps,
    )


def expected_mask(recon: Reconstruction, threshold: float = 1.5, use_sky: bool = True) -> np.ndarray:
    """Pixels that should become points, computed directly."""
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(recon.depth) & (recon.depth > 0) & (recon.depth_conf > threshold)
    if use_sky and recon.sky_mask is not None:
        valid &= ~recon.sky_mask
    return valid
