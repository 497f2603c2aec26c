"""Aligning and stitching windows: pure functions on prediction dicts.

Every window is mapped into window 0's frame by a similarity (s, R, t) estimated against
the previous, already aligned window on their shared frames. Poses are camera-to-world:
pose_enc[:3] is the camera centre, pose_enc[3:7] the rotation (xyzw quaternion).

The default estimator is the reference's: rotation and centre from the last overlap frame
that both windows stored (a keyframe), scale as the lower median of depth ratios over the
shared stored frames. Degenerate overlaps (no valid depth, non-finite poses) fall back to a
defined result with a warning instead of producing NaN.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

from ..geometry import mat_to_quat, quat_to_mat

__all__ = ["Sim3", "pairwise_alignment", "warp_predictions", "stitch_windows", "FRAME_KEYS", "AlignmentWarning"]

log = logging.getLogger(__name__)

FRAME_KEYS = ("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf", "frame_type", "is_keyframe")
_EPS = torch.finfo(torch.float32).eps
_SCALE_RANGE = (1e-3, 1e3)


class AlignmentWarning(UserWarning):
    """A window pair could not be aligned as asked; a fallback was used."""


@dataclass(frozen=True)
class Sim3:
    """x -> s R x + t. scale [B], rotation [B, 3, 3], translation [B, 3]."""

    scale: torch.Tensor
    rotation: torch.Tensor
    translation: torch.Tensor

    @staticmethod
    def identity(batch: int, device, dtype=torch.float32) -> "Sim3":
        return Sim3(
            torch.ones(batch, device=device, dtype=dtype),
            torch.eye(3, device=device, dtype=dtype).expand(batch, 3, 3).clone(),
            torch.zeros(batch, 3, device=device, dtype=dtype),
        )

    def matrix(self) -> torch.Tensor:
        """[B, 4, 4] rigid part [[R, t], [0, 0, 0, 1]] (scale not included, as the reference)."""
        batch = self.rotation.shape[0]
        out = torch.eye(4, dtype=self.rotation.dtype, device=self.rotation.device).repeat(batch, 1, 1)
        out[:, :3, :3] = self.rotation
        out[:, :3, 3] = self.translation
        return out


def _lower_median(x: torch.Tensor) -> torch.Tensor:
    return torch.median(x)  # torch.median returns the lower of the two middle values


def pairwise_alignment(prev: dict, curr: dict, overlap: int) -> Sim3:
    """Similarity mapping window `curr` (raw) onto `prev` (already in the global frame)."""
    pose_prev, pose_curr = prev["pose_enc"].float(), curr["pose_enc"].float()
    batch, total_prev = pose_prev.shape[:2]
    total_curr = pose_curr.shape[1]
    start = max(total_prev - overlap, 0)
    length = min(overlap, total_prev - start, total_curr)
    if length <= 0:
        warnings.warn("windows share no frame; using the identity transform", AlignmentWarning, stacklevel=3)
        return Sim3.identity(batch, pose_prev.device)
    kf_prev = prev["is_keyframe"][0, start : start + length].bool()
    kf_curr = curr["is_keyframe"][0, :length].bool()
    paired = torch.nonzero(kf_prev.cpu() & kf_curr.cpu()).flatten().tolist()
    anchor = paired[-1] if paired else 0
    depth_offsets = paired if paired else [0]

    rot_a = quat_to_mat(pose_prev[:, start + anchor, 3:7])
    rot_b = quat_to_mat(pose_curr[:, anchor, 3:7])
    rotation = rot_a @ rot_b.transpose(-1, -2)
    centre_a, centre_b = pose_prev[:, start + anchor, :3], pose_curr[:, anchor, :3]

    scale = torch.ones(batch, device=pose_prev.device)
    if "depth" in prev and "depth" in curr:
        a = prev["depth"][:, [start + o for o in depth_offsets]].float().reshape(batch, -1)
        b = curr["depth"][:, depth_offsets].float().reshape(batch, -1)
        for i in range(batch):
            valid = torch.isfinite(a[i]) & torch.isfinite(b[i]) & (b[i].abs() > _EPS)
            if valid.any():
                scale[i] = _lower_median(a[i][valid] / b[i][valid])
            else:
                warnings.warn("no valid depth in the window overlap; scale 1 is used", AlignmentWarning, stacklevel=3)
    scale = scale.clamp(*_SCALE_RANGE)
    translation = centre_a - scale[:, None] * (rotation @ centre_b[..., None])[..., 0]

    bad = ~(torch.isfinite(rotation).flatten(1).all(1) & torch.isfinite(translation).all(1))
    if bad.any():
        warnings.warn(
            "non-finite pose in the window overlap; the window keeps the previous window's frame",
            AlignmentWarning,
            stacklevel=3,
        )
        ident = Sim3.identity(batch, pose_prev.device)
        rotation = torch.where(bad[:, None, None], ident.rotation, rotation)
        translation = torch.where(bad[:, None], ident.translation, translation)
        scale = torch.where(bad, ident.scale, scale)
    return Sim3(scale, rotation, translation)


def warp_predictions(pred: dict, sim: Sim3) -> dict:
    """Apply x -> s R x + t to a window's predictions (a new dict; inputs untouched).

    Poses are re-encoded with unit quaternions (w >= 0); depth scales by s; world points
    map as points; every other entry is passed through.
    """
    out = dict(pred)
    s, rot, t = sim.scale, sim.rotation, sim.translation
    if "pose_enc" in pred:
        pose = pred["pose_enc"].float()
        r_new = rot[:, None] @ quat_to_mat(pose[..., 3:7])
        t_new = s[:, None, None] * (rot[:, None] @ pose[..., :3, None])[..., 0] + t[:, None]
        out["pose_enc"] = torch.cat((t_new, mat_to_quat(r_new), pose[..., 7:]), dim=-1)
    if "depth" in pred:
        out["depth"] = pred["depth"] * s.view(-1, *([1] * (pred["depth"].dim() - 1)))
    if "world_points" in pred:
        p = pred["world_points"]
        shape = p.shape
        flat = p.reshape(shape[0], -1, 3)
        flat = s[:, None, None] * (flat @ rot.transpose(-1, -2)) + t[:, None]
        out["world_points"] = flat.reshape(shape)
    return out


def stitch_windows(windows: list[dict], overlap: int) -> dict:
    """Concatenate aligned windows; each overlap region is taken from the LATER window."""
    out: dict = {}
    last = len(windows) - 1
    for key in FRAME_KEYS:
        parts = []
        for i, window in enumerate(windows):
            if key not in window:
                continue
            value = window[key]
            keep = value.shape[1] if i == last else max(value.shape[1] - overlap, 0)
            if keep > 0:
                parts.append(value[:, :keep])
        if parts:
            out[key] = torch.cat(parts, dim=1)
    for window in windows:
        for key, value in window.items():
            if key not in FRAME_KEYS and value is not None:
                out[key] = value
    return out
