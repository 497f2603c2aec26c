"""The model's 9-d camera encoding "absT_quaR_FoV" and its conversion to matrices.

Layout of ``pose_enc[..., :]`` (MODEL.md section 12)::

    [0:3] t           camera centre in world coordinates
    [3:7] q (x,y,z,w) scalar-last quaternion of R, not necessarily unit length
    [7]   fov_h       vertical field of view, radians
    [8]   fov_w       horizontal field of view, radians

``[R | t]`` is CAMERA-TO-WORLD (``T_world_cam``, OpenCV camera axes x right, y down,
z forward): ``X_world = R X_cam + t``. (The reference helper's docstring calls it
"camera-from-world", but the whole reference pipeline uses it as camera-to-world; the
demo's ``extrinsic`` output is its inverse, ``T_cam_world``.)
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from mapstream.geometry.camera import (
    check_transform,
    check_image_hw,
    fov_from_intrinsics,
    intrinsics_from_fov,
    invert_se3,
)
from mapstream.geometry.rotation import check_trailing_shape, mat_to_quat, quat_to_mat

__all__ = [
    "POSE_ENCODING_DIM", "pose_encoding_to_extri_intri", "extri_intri_to_pose_encoding", "camera_matrices",
    "unit_quaternion_encoding",
]

POSE_ENCODING_DIM = 9


def pose_encoding_to_extri_intri(pose_enc: Tensor, image_hw: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Decode ``pose_enc`` into a camera-to-world transform and pinhole intrinsics.

    Args:
        pose_enc: shape ``[*, 9]`` (layout in the module docstring).
        image_hw: image size ``(H, W)`` in pixels.

    Returns:
        ``(T_world_cam, K)``:

        * ``T_world_cam``: ``[R | t]``, shape ``[*, 3, 4]``, ``R = quat_to_mat(q)`` (the
          rotation of ``q / |q|``);
        * ``K``: shape ``[*, 3, 3]``, ``fy = (H/2)/tan(fov_h/2)``,
          ``fx = (W/2)/tan(fov_w/2)``, principal point ``(W/2, H/2)``.
    """
    check_trailing_shape(pose_enc, (POSE_ENCODING_DIM,), "pose_enc")
    hw = check_image_hw(image_hw)
    R = quat_to_mat(pose_enc[..., 3:7])
    T_world_cam = torch.cat((R, pose_enc[..., 0:3].unsqueeze(-1)), dim=-1)
    K = intrinsics_from_fov(pose_enc[..., 7], pose_enc[..., 8], hw)
    return T_world_cam, K


def camera_matrices(pose_enc: Tensor, image_hw: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``(T_world_cam, T_cam_world, K)`` of ``pose_enc`` ``[*, 9]``: what a prediction carries.

    :func:`pose_encoding_to_extri_intri` and the inverse transform, as one function so that
    a compiled network's copy of it (``GCTNetwork(compile=...)``) runs as a few fused
    kernels instead of ~55 tiny ones after every streaming step.
    """
    T_world_cam, K = pose_encoding_to_extri_intri(pose_enc, image_hw)
    return T_world_cam, invert_se3(T_world_cam), K


def extri_intri_to_pose_encoding(T_world_cam: Tensor, K: Tensor, image_hw: Sequence[int]) -> Tensor:
    """Encode a camera-to-world transform and intrinsics as ``pose_enc``.

    Inverse of :func:`pose_encoding_to_extri_intri` up to the quaternion's scale: the
    quaternion comes from :func:`mat_to_quat` (unit length for an orthonormal ``R``, with
    ``w >= 0``); ``fov_h = 2 atan((H/2)/fy)``, ``fov_w = 2 atan((W/2)/fx)``. The principal
    point of ``K`` is not encoded.

    Args:
        T_world_cam: camera-to-world ``[R | t]``, shape ``[*, 3, 4]`` or ``[*, 4, 4]``.
        K: intrinsics, shape ``[*, 3, 3]``.
        image_hw: image size ``(H, W)`` in pixels.

    Returns:
        ``pose_enc``, shape ``[*, 9]``.
    """
    check_transform(T_world_cam, "T_world_cam")
    check_trailing_shape(K, (3, 3), "K")
    fov_h, fov_w = fov_from_intrinsics(K, check_image_hw(image_hw))
    t = T_world_cam[..., :3, 3]
    q = mat_to_quat(T_world_cam[..., :3, :3])
    batch = torch.broadcast_shapes(t.shape[:-1], fov_h.shape)
    parts = (
        t.expand(*batch, 3),
        q.expand(*batch, 4),
        fov_h.expand(batch).unsqueeze(-1),
        fov_w.expand(batch).unsqueeze(-1),
    )
    return torch.cat(parts, dim=-1)


def unit_quaternion_encoding(pose_enc: Tensor) -> Tensor:
    """``pose_enc`` ``[*, 9]`` with its quaternion made unit length and ``w >= 0``: the same
    camera (:func:`pose_encoding_to_extri_intri` normalises it too), written one way whether
    it came from the network (any length, either sign) or from re-encoding a pose
    (:func:`extri_intri_to_pose_encoding`, a Sim(3) alignment)."""
    check_trailing_shape(pose_enc, (POSE_ENCODING_DIM,), "pose_enc")
    q = pose_enc[..., 3:7]
    q = q / q.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
    q = torch.where(q[..., 3:4] < 0, -q, q)
    return torch.cat((pose_enc[..., :3], q, pose_enc[..., 7:]), dim=-1)
