"""Least-squares alignment of point sets and trajectories (Umeyama 1991), SE(3) or Sim(3).

``umeyama(src, dst)`` finds the similarity ``x -> s R x + t`` that minimises
``sum_i w_i |dst_i - (s R src_i + t)|^2`` in closed form (Umeyama, "Least-squares estimation
of transformation parameters between two point patterns", PAMI 1991; the same estimator as
evo's ``umeyama_alignment``). ``align_trajectories`` applies it to camera centres, as
``evo_ape --align [--correct_scale]`` does. ``align_poses`` uses the cameras' orientations as
well: the centres of a short or straight path leave the rotation about the path poorly fixed
(undetermined when they are collinear), while every orientation fixes it.

Conventions: poses are ``T_world_cam`` (camera-to-world, OpenCV axes), ``[*, 3, 4]`` or
``[*, 4, 4]``. A :class:`Sim3` named ``S_ref_est`` maps points of the estimate's world frame
into the reference world frame; applied to a pose it gives
``T_ref_cam = [R R_est | s R t_est + t]`` (the rotation part of a pose is unaffected by the
scale). Inputs may be numpy arrays or torch tensors; all computation is float64 numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

__all__ = ["Sim3", "AlignMode", "ALIGN_MODES", "umeyama", "align_trajectories", "align_poses", "as_pose4",
           "as_float64"]

AlignMode = Literal["none", "se3", "sim3"]
ALIGN_MODES: tuple[str, ...] = ("none", "se3", "sim3")

ArrayLike = np.ndarray | torch.Tensor


def as_float64(x: ArrayLike | float, name: str) -> np.ndarray:
    """Any array-like as a float64 numpy array (torch tensors are detached and moved to CPU)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}") from err


def as_pose4(T: ArrayLike, name: str = "T") -> np.ndarray:
    """Poses ``[*, 3, 4]`` or ``[*, 4, 4]`` as float64 ``[*, 4, 4]`` (``[0, 0, 0, 1]`` last row)."""
    T = as_float64(T, name)
    if T.ndim < 2 or T.shape[-1] != 4 or T.shape[-2] not in (3, 4):
        raise ValueError(f"{name} must have shape [*, 3, 4] or [*, 4, 4], got {list(T.shape)}")
    out = np.zeros(T.shape[:-2] + (4, 4))
    out[..., :3, :] = T[..., :3, :]
    out[..., 3, 3] = 1.0
    return out


@dataclass(frozen=True)
class Sim3:
    """A similarity transform ``x -> s R x + t``.

    Attributes:
        R: rotation, ``[3, 3]`` float64 (proper: ``det R = +1``).
        t: translation, ``[3]`` float64, in the target frame's units.
        s: scale (``1.0`` for a rigid SE(3) transform).
    """

    R: np.ndarray
    t: np.ndarray
    s: float = 1.0

    @staticmethod
    def identity() -> "Sim3":
        return Sim3(np.eye(3), np.zeros(3), 1.0)

    @staticmethod
    def from_matrix(M: ArrayLike) -> "Sim3":
        """From a ``[4, 4]`` (or ``[3, 4]``) matrix ``[[s R, t], [0, 1]]``."""
        M = as_pose4(M, "M")
        if M.shape != (4, 4):
            raise ValueError(f"M must be a single [4, 4] matrix, got {list(M.shape)}")
        sR = M[:3, :3]
        s = float(np.cbrt(np.linalg.det(sR)))
        if not s > 0:
            raise ValueError("M's 3x3 block must have a positive determinant")
        return Sim3(sR / s, M[:3, 3].copy(), s)

    def matrix(self) -> np.ndarray:
        """``[4, 4]`` float64 matrix ``[[s R, t], [0, 0, 0, 1]]``."""
        M = np.eye(4)
        M[:3, :3] = self.s * self.R
        M[:3, 3] = self.t
        return M

    def inverse(self) -> "Sim3":
        """``x -> (1/s) R^T (x - t)``."""
        Rt = self.R.T
        return Sim3(Rt, -(Rt @ self.t) / self.s, 1.0 / self.s)

    def compose(self, other: "Sim3") -> "Sim3":
        """``self ∘ other`` (apply ``other`` first)."""
        return Sim3(self.R @ other.R, self.s * (self.R @ other.t) + self.t, self.s * other.s)

    def apply_points(self, points: ArrayLike) -> np.ndarray:
        """Transform points ``[*, 3]`` -> float64 ``[*, 3]``."""
        p = as_float64(points, "points")
        if p.shape[-1:] != (3,):
            raise ValueError(f"points must have shape [*, 3], got {list(p.shape)}")
        return self.s * (p @ self.R.T) + self.t

    def apply_poses(self, T_world_cam: ArrayLike) -> np.ndarray:
        """Move camera poses into the target frame: ``[R R_i | s R t_i + t]``.

        Args:
            T_world_cam: camera-to-world poses of the source frame, ``[*, 3, 4]`` or ``[*, 4, 4]``.

        Returns:
            Camera-to-world poses in the target frame, float64 ``[*, 4, 4]`` (rigid: the scale
            acts on the camera centres only).
        """
        T = as_pose4(T_world_cam, "T_world_cam")
        out = T.copy()
        out[..., :3, :3] = self.R @ T[..., :3, :3]
        out[..., :3, 3] = self.s * (T[..., :3, 3] @ self.R.T) + self.t
        return out

    def to_dict(self) -> dict:
        """JSON-ready ``{"scale", "rotation" (3x3 rows), "translation"}``."""
        return {"scale": float(self.s), "rotation": self.R.tolist(), "translation": self.t.tolist()}


def umeyama(
    src: ArrayLike,
    dst: ArrayLike,
    *,
    with_scale: bool = True,
    weights: ArrayLike | None = None,
) -> Sim3:
    """Closed-form least-squares similarity (or rigid) transform mapping ``src`` onto ``dst``.

    Minimises ``sum_i w_i |dst_i - (s R src_i + t)|^2`` (``s = 1`` when ``with_scale`` is
    False), Umeyama 1991 eqs. 34-43 with weighted means and covariances. Unweighted, the
    result equals evo's ``umeyama_alignment`` (``x = src.T``, ``y = dst.T``).

    Args:
        src: source points, ``[N, 3]``.
        dst: corresponding target points, ``[N, 3]``.
        with_scale: estimate a scale (Sim(3)) or not (SE(3)).
        weights: optional non-negative per-point weights ``[N]`` (e.g. confidences).

    Returns:
        ``S_dst_src`` as a :class:`Sim3`.

    Raises:
        ValueError: on mismatched shapes, fewer than 3 points, non-finite values, all source
            (or target) points equal, or collinear points (the rotation about the line is
            undetermined).
    """
    x = as_float64(src, "src")
    y = as_float64(dst, "dst")
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"src must have shape [N, 3], got {list(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"src and dst must have the same shape, got {list(x.shape)} and {list(y.shape)}")
    n = x.shape[0]
    if n < 3:
        raise ValueError(f"alignment needs at least 3 corresponding points, got {n}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("alignment inputs contain NaN or infinite values")
    if weights is None:
        w = np.full(n, 1.0 / n)
    else:
        w = as_float64(weights, "weights")
        if w.shape != (n,) or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError(f"weights must be [N={n}] finite, non-negative, with a positive sum")
        w = w / w.sum()

    mean_x = w @ x
    mean_y = w @ y
    xc, yc = x - mean_x, y - mean_y
    var_x = float(w @ (xc * xc).sum(1))
    var_y = float(w @ (yc * yc).sum(1))
    extent = max(np.abs(x).max(), np.abs(y).max(), 1.0)
    tiny = (1e-12 * extent) ** 2
    if var_x <= tiny:
        raise ValueError("degenerate alignment: all source points (camera centres) are equal")
    if var_y <= tiny:
        raise ValueError("degenerate alignment: all target points (camera centres) are equal")

    cov = (yc * w[:, None]).T @ xc  # [3, 3] = sum_i w_i (y_i - mu_y)(x_i - mu_x)^T
    U, d, Vt = np.linalg.svd(cov)
    if d[1] <= 1e-9 * d[0]:
        raise ValueError(
            "degenerate alignment: the points are collinear (covariance rank < 2), "
            "the rotation is undetermined"
        )
    S = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        S[2, 2] = -1.0  # reflection -> proper rotation
    R = U @ S @ Vt
    s = float((d * np.diag(S)).sum() / var_x) if with_scale else 1.0
    t = mean_y - s * (R @ mean_x)
    return Sim3(R, t, s)


def align_trajectories(
    T_world_cam_est: ArrayLike,
    T_world_cam_ref: ArrayLike,
    mode: str = "sim3",
    *,
    weights: ArrayLike | None = None,
) -> Sim3:
    """Alignment of an estimated trajectory onto a reference one from camera centres.

    Same as evo's ``PosePath3D.align(ref, correct_scale=(mode == "sim3"))``.

    Args:
        T_world_cam_est: estimated camera-to-world poses ``[N, 3|4, 4]``.
        T_world_cam_ref: reference camera-to-world poses ``[N, 3|4, 4]`` (same frames, same order).
        mode: ``"none"`` (identity), ``"se3"`` (rigid) or ``"sim3"`` (rigid + scale).
        weights: optional per-frame weights ``[N]``.

    Returns:
        ``S_ref_est``: apply with :meth:`Sim3.apply_poses` to the estimate.

    Raises:
        ValueError: unknown mode, mismatched lengths, or a degenerate trajectory (see
            :func:`umeyama`; checked for ``"none"`` too, except the point-count rules).
    """
    est, ref = _paired_poses(T_world_cam_est, T_world_cam_ref, mode)
    if mode == "none":
        return Sim3.identity()
    return umeyama(est[:, :3, 3], ref[:, :3, 3], with_scale=(mode == "sim3"), weights=weights)


def _paired_poses(T_world_cam_est: ArrayLike, T_world_cam_ref: ArrayLike, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The two trajectories as float64 ``[N, 4, 4]`` of one length, `mode` checked."""
    if mode not in ALIGN_MODES:
        raise ValueError(f"align must be one of {ALIGN_MODES}, got {mode!r}")
    est = as_pose4(T_world_cam_est, "T_world_cam_est")
    ref = as_pose4(T_world_cam_ref, "T_world_cam_ref")
    if est.ndim != 3 or ref.ndim != 3:
        raise ValueError("trajectories must have shape [N, 3|4, 4]")
    if len(est) != len(ref):
        raise ValueError(f"trajectories have different lengths: {len(est)} estimated vs {len(ref)} reference")
    return est, ref


def align_poses(
    T_world_cam_est: ArrayLike,
    T_world_cam_ref: ArrayLike,
    mode: str = "sim3",
) -> Sim3:
    """Alignment of estimated camera poses onto reference ones from orientations and centres.

    The rotation is the least-squares one over the orientations, ``argmin_R sum_i
    |R R_est_i - R_ref_i|_F^2`` (the rotation nearest to ``sum_i R_ref_i R_est_i^T``); with
    it fixed, the scale and translation are the least-squares fit of the centres,
    ``argmin_{s,t} sum_i |c_ref_i - (s R c_est_i + t)|^2``. Where the centres spread in every
    direction and the orientations agree with them, this is close to :func:`align_trajectories`;
    on a short arc or a straight path it still fixes the rotation.

    Args:
        T_world_cam_est: estimated camera-to-world poses ``[N, 3|4, 4]``.
        T_world_cam_ref: reference camera-to-world poses ``[N, 3|4, 4]`` (same frames, same order).
        mode: ``"none"`` (identity), ``"se3"`` (rigid) or ``"sim3"`` (rigid + scale).

    Returns:
        ``S_ref_est``: apply with :meth:`Sim3.apply_poses` to the estimate.

    Raises:
        ValueError: unknown mode, mismatched lengths, no poses, non-finite poses, or for ``"sim3"`` fewer
            than two distinct estimated centres or a scale that is not positive (the estimate
            moves against the reference).
    """
    est, ref = _paired_poses(T_world_cam_est, T_world_cam_ref, mode)
    if not len(est):
        raise ValueError("alignment needs at least one pose, got none")
    if not (np.isfinite(est).all() and np.isfinite(ref).all()):
        raise ValueError("alignment inputs contain NaN or infinite values")
    if mode == "none":
        return Sim3.identity()
    U, _, Vt = np.linalg.svd(np.einsum("nij,nkj->ik", ref[:, :3, :3], est[:, :3, :3]))
    R = U @ np.diag([1.0, 1.0, np.linalg.det(U @ Vt)]) @ Vt
    x, y = est[:, :3, 3], ref[:, :3, 3]
    xr = (x - x.mean(0)) @ R.T
    s = 1.0
    if mode == "sim3":
        spread = float((xr * xr).sum())
        if spread <= (1e-12 * max(np.abs(x).max(), 1.0)) ** 2:
            raise ValueError("degenerate alignment: the estimated camera centres are all equal, "
                             "the scale is undetermined")
        s = float(((y - y.mean(0)) * xr).sum() / spread)
        if not s > 0:
            raise ValueError(f"degenerate alignment: the best scale is {s:.3g}, the estimated path runs against the "
                             "reference")
    return Sim3(R, y.mean(0) - s * (R @ x.mean(0)), s)
