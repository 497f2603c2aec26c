"""Aligning and stitching windows: pure functions on prediction dicts.

Every window is mapped into window 0's frame by a similarity (s, R, t) estimated against
the previous, already aligned window on their shared frames. Poses are camera-to-world:
pose_enc[:3] is the camera centre, pose_enc[3:7] the rotation (xyzw quaternion).

Two joins (`WINDOW_JOINS`), both over the shared frames that both windows stored (keyframes)
and both taking the scale as the lower median of the depth ratios over them:

* "shared" (mapstream's default): the rotation is the mean of the shared frames' relative
  rotations (projected back onto SO(3)) and the translation maps the centroid of their
  centres. Every shared frame's pose counts, so one frame's pose error does not tilt the
  whole next window.
* "anchor" (the reference's): rotation and centre from the last shared stored frame alone.

With one shared stored frame they are the same. Degenerate overlaps (no valid depth,
non-finite poses) fall back to a defined result with a warning instead of producing NaN.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

from ..config import WINDOW_JOINS
from ..geometry import mat_to_quat, quat_to_mat

__all__ = [
    "Sim3", "WINDOW_JOINS", "pairwise_alignment", "warp_predictions", "stitch_windows", "FRAME_KEYS", "AlignmentWarning",
]

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


def _mean_rotation(rotations: torch.Tensor) -> torch.Tensor:
    """[B, N, 3, 3] -> [B, 3, 3]: the rotation nearest (Frobenius) to their arithmetic mean.
    One rotation is returned as it is (no SVD round-off: the reference's single-frame join)."""
    if rotations.shape[1] == 1:
        return rotations[:, 0]
    mean = rotations.mean(1)
    # A non-finite pose stays non-finite (the caller's fallback sees it); the SVD gets the identity.
    finite = torch.isfinite(mean).flatten(1).all(1)[:, None, None]
    u, _, vh = torch.linalg.svd(torch.where(finite, mean, torch.eye(3, dtype=mean.dtype, device=mean.device)))
    flip = torch.ones(rotations.shape[0], 3, dtype=rotations.dtype, device=rotations.device)
    flip[:, 2] = torch.sign(torch.det(u @ vh))
    return torch.where(finite, u @ torch.diag_embed(flip) @ vh, mean)


def pairwise_alignment(prev: dict, curr: dict, overlap: int, join: str = "shared") -> Sim3:
    """Similarity mapping window `curr` (raw) onto `prev` (already in the global frame), from
    their `overlap` shared frames; `join` is one of `WINDOW_JOINS` (module docstring)."""
    if join not in WINDOW_JOINS:
        raise ValueError(f"join must be one of {', '.join(WINDOW_JOINS)}, got {join!r}")
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
    depth_offsets = paired if paired else [0]
    posed = depth_offsets if join == "shared" else depth_offsets[-1:]

    posed_a, posed_b = pose_prev[:, [start + o for o in posed]], pose_curr[:, posed]
    rotation = _mean_rotation(quat_to_mat(posed_a[..., 3:7]) @ quat_to_mat(posed_b[..., 3:7]).transpose(-1, -2))
    centre_a, centre_b = posed_a[..., :3].mean(1), posed_b[..., :3].mean(1)

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
