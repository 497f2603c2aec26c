"""Ground truth per clip in the frame and at the scale the network predicts in.

The network has no way to know a clip's world frame or its metric scale: it places the first
frame at the origin with the identity rotation and chooses a scale of its own. The ground
truth is therefore brought to one canonical form before any loss compares against it:

* every camera is expressed in the first camera's frame (``T_world_cam`` of frame 0 becomes
  the identity, every other pose becomes ``inverse(T_0) @ T_s``);
* translations and depth are divided by one factor per clip, the mean distance of the clip's
  valid 3D points from the first camera's origin, so that this mean distance is 1.

Both steps make the canonical clip independent of the world frame and of the unit the data
came in, which is what lets one network train on scenes of any size. The predictions are not
normalised: the network learns to output this canonical form itself.

Batch layout (see ``docs/TRAINING.md``): ``images`` ``[B, S, 3, H, W]``, ``depth``
``[B, S, H, W]`` (0 = no measurement), optional ``valid`` ``[B, S, H, W]`` bool,
``T_world_cam`` ``[B, S, 4, 4]`` (or ``[B, S, 3, 4]``) camera-to-world with OpenCV axes,
``K`` ``[B, S, 3, 3]`` in pixels.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mapstream.geometry import extri_intri_to_pose_encoding, invert_se3, to_homogeneous, unproject_depth

__all__ = ["gt_pose_encoding", "normalize_clip", "valid_mask", "world_points"]


def _working_dtype(x: Tensor) -> torch.dtype:
    """fp32 at least: ground truth in half precision would round the scale and the poses."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_batch(batch: Mapping[str, Any]) -> tuple[int, int, int, int]:
    for key in ("depth", "T_world_cam", "K"):
        if key not in batch:
            raise KeyError(f"the batch has no {key!r} (it holds {sorted(batch)})")
    depth, T, K = batch["depth"], batch["T_world_cam"], batch["K"]
    if depth.ndim != 4:
        raise ValueError(f"depth must have shape [B, S, H, W], got {list(depth.shape)}")
    B, S, H, W = depth.shape
    if T.shape not in ((B, S, 4, 4), (B, S, 3, 4)):
        raise ValueError(f"T_world_cam must have shape [{B}, {S}, 4, 4] (as depth's [B, S]), got {list(T.shape)}")
    if K.shape != (B, S, 3, 3):
        raise ValueError(f"K must have shape [{B}, {S}, 3, 3] (as depth's [B, S]), got {list(K.shape)}")
    valid = batch.get("valid")
    if valid is not None and valid.shape != depth.shape:
        raise ValueError(f"valid must have depth's shape {list(depth.shape)}, got {list(valid.shape)}")
    return B, S, H, W


def valid_mask(batch: Mapping[str, Any]) -> Tensor:
    """The pixels whose depth is a measurement: ``valid`` (all pixels when absent) and a
    finite, positive depth.

    A depth of 0 means "no measurement" in every data source, and a non-finite one cannot be
    supervised, so they are never valid even where a given ``valid`` says so.
    """
    depth = batch["depth"]
    mask = torch.isfinite(depth) & (depth > 0)
    given = batch.get("valid")
    return mask if given is None else mask & given.to(torch.bool)


def world_points(batch: Mapping[str, Any]) -> Tensor:
    """The 3D point of every pixel, ``[B, S, H, W, 3]``, in the batch's world frame.

    ``X = R (d K^-1 [u, v, 1]) + t`` with ``[R | t] = T_world_cam``; after
    :func:`normalize_clip` that frame is the first camera's, at the clip's unit scale.
    Pixels outside the valid mask get whatever their depth gives (the camera centre for a
    depth of 0); the losses never read them.
    """
    depth, K, T = batch["depth"], batch["K"], batch["T_world_cam"]
    dtype = _working_dtype(depth)
    return unproject_depth(depth.to(dtype), K.to(dtype), T.to(dtype))


def normalize_clip(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch with each clip in its first camera's frame and at unit mean point distance.

    Returns a new dict with every key of ``batch`` and these replaced or added:

    * ``T_world_cam`` ``[B, S, 4, 4]``: ``inverse(T_0) @ T_s`` with the translation divided
      by the clip's scale; frame 0 is exactly the identity;
    * ``depth`` ``[B, S, H, W]``: divided by the scale, and 0 wherever ``valid`` is False;
    * ``valid`` ``[B, S, H, W]`` bool: :func:`valid_mask` of the input;
    * ``scale`` ``[B]``: the factor used, the mean distance of the clip's valid points from
      the first camera's origin in the input's unit (1 for a clip with no valid pixel, whose
      poses are then only moved to the first camera's frame).

    Everything is computed in fp32 (fp64 for fp64 input); ``images``, ``K`` and any other key
    pass through unchanged. Normalising a normalised batch changes nothing but ``scale``
    (which becomes 1), and the result does not depend on the input's world frame or unit.
    The presence of ``scale`` is what marks a batch as normalised
    (:func:`mapstream.train.losses.total_loss` normalises any batch without it).
    """
    B, S, H, W = _check_batch(batch)
    dtype = _working_dtype(batch["depth"])
    valid = valid_mask(batch)
    depth = torch.where(valid, batch["depth"].to(dtype), torch.zeros((), dtype=dtype, device=valid.device))
    T = to_homogeneous(batch["T_world_cam"].to(dtype))
    K = batch["K"].to(dtype)

    # Poses relative to the first camera; its own pose is set to the identity rather than
    # computed, so that frame 0 is exact whatever the rounding of inverse(T_0) @ T_0.
    T_rel = invert_se3(T[:, :1]) @ T
    T_rel[:, 0] = torch.eye(4, dtype=dtype, device=T.device)

    points = unproject_depth(depth, K, T_rel)  # [B, S, H, W, 3] in the first camera's frame
    count = valid.flatten(1).sum(1)
    distance = torch.where(valid, points.norm(dim=-1), torch.zeros((), dtype=dtype, device=valid.device))
    mean = distance.flatten(1).sum(1) / count.clamp(min=1)
    scale = torch.where((count > 0) & (mean > 0), mean, torch.ones_like(mean))

    T_norm = T_rel.clone()
    T_norm[:, :, :3, 3] = T_rel[:, :, :3, 3] / scale[:, None, None]
    out = dict(batch)
    out.update(
        T_world_cam=T_norm,
        depth=depth / scale[:, None, None, None],
        valid=valid,
        scale=scale,
    )
    return out


def gt_pose_encoding(batch: Mapping[str, Any], image_hw: Sequence[int] | None = None) -> Tensor:
    """The batch's cameras in the network's 9-d pose encoding, ``[B, S, 9]``.

    The encoding holds the camera-to-world pose (the camera centre in the first camera's
    frame, the quaternion ``(x, y, z, w)`` of the rotation with ``w >= 0``) and the vertical
    and horizontal fields of view of ``K`` for an image of ``image_hw`` = ``(H, W)`` pixels
    (the images' size when not given). Pass a :func:`normalize_clip` batch: the encoding is
    taken as the batch stands.
    """
    if image_hw is None:
        if "images" not in batch:
            raise ValueError("give image_hw: the batch has no images to take the size from")
        image_hw = tuple(batch["images"].shape[-2:])
    T, K = batch["T_world_cam"], batch["K"]
    dtype = _working_dtype(T)
    return extri_intri_to_pose_encoding(T.to(dtype), K.to(dtype), image_hw)
