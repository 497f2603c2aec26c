"""Pure, batched geometry functions (torch).

Conventions used throughout (MODEL.md section 12):

* quaternions are ``(x, y, z, w)``, scalar last;
* OpenCV camera axes: x right, y down, z forward;
* transforms are named by frames: ``T_world_cam`` maps camera coordinates to world
  coordinates (camera-to-world, the pose encoding's ``[R | t]``), ``T_cam_world`` is its
  inverse (world-to-camera);
* pixel ``(u, v)`` is the integer (column, row) index; the model's principal point is
  ``(W/2, H/2)``.
"""
from mapstream.geometry.camera import (
    cam_points_from_depth,
    fov_from_intrinsics,
    intrinsics_from_fov,
    invert_se3,
    look_at,
    pixel_grid,
    project_points,
    to_homogeneous,
    transform_points,
    unproject_depth,
)
from mapstream.geometry.pose_encoding import (
    POSE_ENCODING_DIM,
    camera_matrices,
    extri_intri_to_pose_encoding,
    pose_encoding_to_extri_intri,
    unit_quaternion_encoding,
)
from mapstream.geometry.rotation import mat_to_quat, quat_to_mat

__all__ = [
    "POSE_ENCODING_DIM",
    "cam_points_from_depth",
    "camera_matrices",
    "extri_intri_to_pose_encoding",
    "fov_from_intrinsics",
    "intrinsics_from_fov",
    "invert_se3",
    "look_at",
    "mat_to_quat",
    "pixel_grid",
    "pose_encoding_to_extri_intri",
    "project_points",
    "quat_to_mat",
    "to_homogeneous",
    "transform_points",
    "unit_quaternion_encoding",
    "unproject_depth",
]
