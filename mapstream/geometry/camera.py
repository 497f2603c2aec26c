"""Pinhole cameras: intrinsics from field of view, SE(3) helpers, (un)projection.

Conventions (MODEL.md section 12):

* OpenCV camera axes: x right, y down, z forward (depth = camera-space z).
* ``T_world_cam`` is camera-to-world ``[R | t]``: ``X_world = R @ X_cam + t``; ``t`` is the
  camera centre in world coordinates and the columns of ``R`` are the camera axes in the
  world. This is what the pose encoding's ``[R | t]`` means. ``T_cam_world`` is its
  inverse (world-to-camera, the demo's "extrinsic").
* ``K = [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``; pixel ``(u, v)`` is the integer
  column / row index (no half-pixel offset), and the model's principal point is exactly
  ``(W / 2, H / 2)``. Only fx, fy, cx, cy are read from ``K`` (zero skew assumed).

All functions are batched over leading dimensions ``*``, keep device and dtype (mixed
dtypes follow torch type promotion) and never modify their inputs.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mapstream.geometry.rotation import check_trailing_shape

__all__ = [
    "intrinsics_from_fov",
    "fov_from_intrinsics",
    "to_homogeneous",
    "invert_se3",
    "transform_points",
    "pixel_grid",
    "cam_points_from_depth",
    "unproject_depth",
    "project_points",
    "look_at",
]


def check_image_hw(image_hw: Sequence[int]) -> tuple[int, int]:
    """Validate an image size ``(H, W)`` and return it as a tuple of two ints."""
    if len(image_hw) != 2 or any(int(s) != s or s <= 0 for s in image_hw):
        raise ValueError(f"image_hw must be (H, W) with positive integers, got {tuple(image_hw)}")
    return int(image_hw[0]), int(image_hw[1])


def check_transform(T: Tensor, name: str) -> None:
    """Raise ``ValueError`` unless ``T`` has shape ``[*, 3, 4]`` or ``[*, 4, 4]``."""
    if T.ndim < 2 or T.shape[-1] != 4 or T.shape[-2] not in (3, 4):
        raise ValueError(f"{name} must have shape [*, 3, 4] or [*, 4, 4], got {list(T.shape)}")


def intrinsics_from_fov(fov_h: Tensor, fov_w: Tensor, image_hw: Sequence[int]) -> Tensor:
    """Pinhole intrinsics from vertical / horizontal field of view.

    ``fy = (H/2) / tan(fov_h/2)``, ``fx = (W/2) / tan(fov_w/2)``, ``(cx, cy) = (W/2, H/2)``.

    Args:
        fov_h: vertical field of view in radians, shape ``[*]``.
        fov_w: horizontal field of view in radians, shape ``[*]`` (broadcastable).
        image_hw: image size ``(H, W)`` in pixels.

    Returns:
        ``K``, shape ``[*, 3, 3]``.
    """
    H, W = check_image_hw(image_hw)
    fov_h, fov_w = torch.broadcast_tensors(fov_h, fov_w)
    fy = (H / 2) / torch.tan(fov_h / 2)
    fx = (W / 2) / torch.tan(fov_w / 2)
    zero = torch.zeros_like(fx)
    one = torch.ones_like(fx)
    entries = (fx, zero, zero + W / 2, zero, fy, zero + H / 2, zero, zero, one)
    return torch.stack(entries, dim=-1).reshape(*fx.shape, 3, 3)


def fov_from_intrinsics(K: Tensor, image_hw: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`intrinsics_from_fov` (only ``fx = K[0,0]``, ``fy = K[1,1]`` are read).

    Args:
        K: intrinsics, shape ``[*, 3, 3]``.
        image_hw: image size ``(H, W)`` in pixels.

    Returns:
        ``(fov_h, fov_w)`` in radians, each of shape ``[*]``:
        ``fov_h = 2 atan((H/2) / fy)``, ``fov_w = 2 atan((W/2) / fx)``.
    """
    check_trailing_shape(K, (3, 3), "K")
    H, W = check_image_hw(image_hw)
    fov_h = 2 * torch.atan((H / 2) / K[..., 1, 1])
    fov_w = 2 * torch.atan((W / 2) / K[..., 0, 0])
    return fov_h, fov_w


def to_homogeneous(T: Tensor) -> Tensor:
    """Append the row ``[0, 0, 0, 1]`` to a ``[*, 3, 4]`` transform.

    Args:
        T: rigid transform, shape ``[*, 3, 4]`` (a ``[*, 4, 4]`` input is returned as is).

    Returns:
        Shape ``[*, 4, 4]``.
    """
    check_transform(T, "T")
    if T.shape[-2] == 4:
        return T
    bottom = torch.zeros_like(T[..., :1, :])
    bottom[..., 0, 3] = 1
    return torch.cat((T, bottom), dim=-2)


def invert_se3(T: Tensor) -> Tensor:
    """Closed-form inverse of a rigid transform: ``[R | t] -> [R^T | -R^T t]``.

    ``R`` is assumed orthonormal (it is not checked). E.g. ``invert_se3(T_world_cam)``
    is ``T_cam_world``.

    Args:
        T: shape ``[*, 3, 4]`` or ``[*, 4, 4]``.

    Returns:
        The inverse, with the same shape as ``T`` (``[0, 0, 0, 1]`` last row for 4x4).
    """
    check_transform(T, "T")
    Rt = T[..., :3, :3].transpose(-1, -2)
    t_inv = -(Rt @ T[..., :3, 3:])
    out = torch.cat((Rt, t_inv), dim=-1)
    return to_homogeneous(out) if T.shape[-2] == 4 else out


def transform_points(T: Tensor, points: Tensor) -> Tensor:
    """Apply a rigid transform to points: ``R @ p + t``.

    Args:
        T: shape ``[*, 3, 4]`` or ``[*, 4, 4]``.
        points: shape ``[*, N, 3]`` (leading dims broadcast against ``T``'s).

    Returns:
        Transformed points, shape ``[*, N, 3]``.
    """
    check_transform(T, "T")
    check_trailing_shape(points, (3,), "points")
    if points.ndim < 2:
        raise ValueError(f"points must have shape [*, N, 3], got {list(points.shape)}")
    R, t = T[..., :3, :3], T[..., :3, 3]
    return torch.einsum("...ij,...nj->...ni", R, points) + t.unsqueeze(-2)


def pixel_grid(
    height: int, width: int, *, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> Tensor:
    """Pixel coordinates ``(u, v)`` = (column, row) index of every pixel.

    Returns:
        Shape ``[H, W, 2]`` with ``grid[v, u] = (u, v)``.
    """
    v, u = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype),
        torch.arange(width, device=device, dtype=dtype),
        indexing="ij",
    )
    return torch.stack((u, v), dim=-1)


def _depth_map(depth: Tensor, batch_ndim: int) -> Tensor:
    """Return ``depth`` as ``[*, H, W]`` given the number of leading (batch) dims."""
    if depth.ndim == batch_ndim + 3 and depth.shape[-1] == 1:
        return depth.squeeze(-1)
    if depth.ndim == batch_ndim + 2:
        return depth
    raise ValueError(
        f"depth must have shape [*, H, W] or [*, H, W, 1] with {batch_ndim} leading dims "
        f"(as many as K has before [3, 3]), got {list(depth.shape)}"
    )


def cam_points_from_depth(depth: Tensor, K: Tensor) -> Tensor:
    """Camera-space points of a depth map: ``X_cam = d * K^-1 [u, v, 1]^T``.

    I.e. ``((u - cx) d / fx, (v - cy) d / fy, d)`` with ``(u, v)`` the pixel column / row.

    Args:
        depth: camera-space z, shape ``[*, H, W]`` or ``[*, H, W, 1]``; ``*`` has as many
            dims as ``K``'s leading dims (sizes broadcast, e.g. 1).
        K: intrinsics, shape ``[*, 3, 3]``.

    Returns:
        Points in the OpenCV camera frame, shape ``[*, H, W, 3]``.
    """
    check_trailing_shape(K, (3, 3), "K")
    d = _depth_map(depth, K.ndim - 2)
    H, W = d.shape[-2:]
    uv = pixel_grid(H, W, device=d.device, dtype=d.dtype)
    fx, fy = K[..., 0, 0, None, None], K[..., 1, 1, None, None]
    cx, cy = K[..., 0, 2, None, None], K[..., 1, 2, None, None]
    x = (uv[..., 0] - cx) * d / fx
    y = (uv[..., 1] - cy) * d / fy
    x, y, d = torch.broadcast_tensors(x, y, d)
    return torch.stack((x, y, d), dim=-1)


def unproject_depth(depth: Tensor, K: Tensor, T_world_cam: Tensor) -> Tensor:
    """World-space points of a depth map: ``X_world = R X_cam + t``.

    Args:
        depth: camera-space z, shape ``[*, H, W]`` or ``[*, H, W, 1]``.
        K: intrinsics, shape ``[*, 3, 3]``.
        T_world_cam: camera-to-world ``[R | t]``, shape ``[*, 3, 4]`` or ``[*, 4, 4]``
            (e.g. the first output of ``pose_encoding_to_extri_intri``).

    Returns:
        World points, shape ``[*, H, W, 3]``.
    """
    check_transform(T_world_cam, "T_world_cam")
    if T_world_cam.ndim != K.ndim:
        raise ValueError(
            f"T_world_cam {list(T_world_cam.shape)} and K {list(K.shape)} must have the "
            "same number of leading dims"
        )
    X_cam = cam_points_from_depth(depth, K)
    R, t = T_world_cam[..., :3, :3], T_world_cam[..., :3, 3]
    return torch.einsum("...ij,...hwj->...hwi", R, X_cam) + t[..., None, None, :]


def project_points(points_world: Tensor, K: Tensor, T_world_cam: Tensor) -> tuple[Tensor, Tensor]:
    """Project world points into a camera (inverse of :func:`unproject_depth`).

    ``X_cam = R^T (X_world - t)``, ``u = fx x / z + cx``, ``v = fy y / z + cy``. No
    visibility test: points at ``z = 0`` give non-finite pixels, points behind the camera
    (``z < 0``) give mirrored pixels; use the returned depth to mask them.

    Args:
        points_world: shape ``[*, N, 3]``.
        K: intrinsics, shape ``[*, 3, 3]``.
        T_world_cam: camera-to-world ``[R | t]``, shape ``[*, 3, 4]`` or ``[*, 4, 4]``.

    Returns:
        ``(uv, depth)``: pixel coordinates ``[*, N, 2]`` (column, row) and camera-space
        z ``[*, N]``.
    """
    check_trailing_shape(K, (3, 3), "K")
    X_cam = transform_points(invert_se3(T_world_cam), points_world)
    x, y, z = X_cam.unbind(-1)
    fx, fy = K[..., 0, 0, None], K[..., 1, 1, None]
    cx, cy = K[..., 0, 2, None], K[..., 1, 2, None]
    uv = torch.stack((fx * x / z + cx, fy * y / z + cy), dim=-1)
    return uv, z


def look_at(eye, target, up) -> Tensor:
    """Camera-to-world ``[3, 4]`` (OpenCV axes: x right, y down, z forward) of a camera at
    ``eye`` looking at ``target``, with world direction ``up`` pointing up in the image.

    Raises:
        ValueError: ``eye`` equals ``target``, or ``up`` is parallel to the viewing direction.
    """
    eye, target, up = (torch.as_tensor(v, dtype=torch.float64) for v in (eye, target, up))
    forward = target - eye
    if forward.norm() < 1e-12:
        raise ValueError("look_at: the eye and the target coincide")
    z = forward / forward.norm()
    x = torch.linalg.cross(z, up)  # right: with y down, z x up points to the image's right
    if x.norm() < 1e-9 * max(up.norm().item(), 1e-300):
        raise ValueError("look_at: the up direction is parallel to the viewing direction")
    x = x / x.norm()
    y = torch.linalg.cross(z, x)  # down
    return torch.cat((torch.stack((x, y, z), dim=1), eye[:, None]), dim=1)
