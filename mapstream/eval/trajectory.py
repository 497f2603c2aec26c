"""Trajectory metrics: ATE, RPE (as evo computes them) and pairwise pose AUC.

All functions take camera-to-world poses ``T_world_cam`` ``[N, 3|4, 4]`` (numpy or torch; OpenCV
axes) of the SAME frames in the same order, the estimate first and the reference (ground
truth) second, and compute in float64.

* ATE: RMSE over frames of ``|t_ref_i - t_aligned_i|`` (camera centres) after aligning the
  estimate with ``S_ref_est`` (none / SE(3) / Sim(3) Umeyama on camera centres). Equals
  ``evo.core.metrics.APE(PoseRelation.translation_part)`` after
  ``traj_est.align(traj_ref, correct_scale=...)``. Units: the reference's (metres).
* RPE: for pairs ``(i, j = i + delta)``, the error pose
  ``E = (T_ref_i^-1 T_ref_j)^-1 (T_est_i^-1 T_est_j)`` on the aligned estimate; translation
  error ``|t(E)|`` (reference units) and rotation error ``angle(R(E))`` (degrees). Pairs are
  consecutive ``(0, d), (d, 2d), ...`` or, with ``all_pairs``, every ``(i, i + d)``: evo's RPE
  with ``delta_unit=frames``.
* Pose AUC: over all pairs ``i < j``, the relative pose ``T_ci_cj = T_world_ci^-1 T_world_cj``;
  rotation error = angle between the estimated and reference relative rotations, translation
  error = angle between the relative translation directions (by default folded to
  ``min(a, 180 - a)``, as the authors' benchmark); pair error = max of the two (degrees). AUC@T
  is the area under the accuracy-vs-threshold curve on ``[0, T]``, sampled at 1-degree steps
  (the authors' definition): ``mean_{k=1..T} fraction(err < k)``. Invariant to any Sim(3) of
  either trajectory, so no alignment is applied. Reported as fractions in ``[0, 1]``
  (published tables show percent).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from mapstream.geometry.align import ArrayLike, Sim3, align_trajectories, as_pose4

__all__ = [
    "ErrorStats",
    "ATEResult",
    "RPEResult",
    "PoseAUCResult",
    "AUC_THRESHOLDS",
    "ate",
    "rpe",
    "pose_auc",
    "aggregate_auc",
    "rotation_angle_deg",
]

AUC_THRESHOLDS: tuple[int, ...] = (3, 5, 15, 30)
_PAIR_CHUNK = 200_000


@dataclass(frozen=True)
class ErrorStats:
    """Summary statistics of a 1-D error array (evo's statistics, ``std`` with ``ddof=0``)."""

    rmse: float
    mean: float
    median: float
    std: float
    min: float
    max: float
    count: int

    @staticmethod
    def of(errors: np.ndarray) -> "ErrorStats":
        e = np.asarray(errors, dtype=np.float64)
        if e.size == 0:
            raise ValueError("no errors to summarise (empty input)")
        return ErrorStats(
            rmse=float(np.sqrt(np.mean(e * e))),
            mean=float(np.mean(e)),
            median=float(np.median(e)),
            std=float(np.std(e)),
            min=float(np.min(e)),
            max=float(np.max(e)),
            count=int(e.size),
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ATEResult:
    """Absolute trajectory error.

    Attributes:
        align: ``"none"``, ``"se3"`` or ``"sim3"``.
        alignment: ``S_ref_est`` applied to the estimate before measuring.
        stats: statistics of ``errors``; ``stats.rmse`` is the ATE.
        errors: per-frame camera-centre distance ``[N]`` (reference units).
    """

    align: str
    alignment: Sim3
    stats: ErrorStats
    errors: np.ndarray = field(repr=False)

    @property
    def rmse(self) -> float:
        return self.stats.rmse


@dataclass(frozen=True)
class RPEResult:
    """Relative pose error over pairs ``(i, i + delta)``.

    Attributes:
        align: alignment applied to the estimate first (only its scale matters here).
        alignment: ``S_ref_est``.
        delta: frame offset of the pairs.
        all_pairs: every ``(i, i + delta)`` (True) or consecutive, non-overlapping pairs.
        pairs: ``[M, 2]`` frame indices.
        trans: statistics of ``trans_errors`` (reference units).
        rot_deg: statistics of ``rot_errors_deg`` (degrees).
    """

    align: str
    alignment: Sim3
    delta: int
    all_pairs: bool
    pairs: np.ndarray = field(repr=False)
    trans: ErrorStats
    rot_deg: ErrorStats
    trans_errors: np.ndarray = field(repr=False)
    rot_errors_deg: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class PoseAUCResult:
    """Pairwise relative-pose accuracy.

    Attributes:
        auc: ``{T: AUC@T}`` fractions in ``[0, 1]``.
        rot_acc, trans_acc: ``{T: fraction of pairs whose rotation / translation-direction
            error is < T degrees}``.
        rot_errors_deg, trans_errors_deg: per-pair errors ``[M]`` (kept for micro aggregation).
        num_pairs: ``M = N (N - 1) / 2``.
    """

    auc: dict[int, float]
    rot_acc: dict[int, float]
    trans_acc: dict[int, float]
    rot_errors_deg: np.ndarray = field(repr=False)
    trans_errors_deg: np.ndarray = field(repr=False)
    num_pairs: int = 0


def rotation_angle_deg(R: np.ndarray) -> np.ndarray:
    """Angle in degrees of rotation matrices ``[*, 3, 3]`` (scipy, as evo's ``so3_log_angle``)."""
    R = np.asarray(R, dtype=np.float64)
    flat = R.reshape(-1, 3, 3)
    return np.degrees(Rotation.from_matrix(flat).magnitude()).reshape(R.shape[:-2])


def _check_pair(est: ArrayLike, ref: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    P = as_pose4(est, "T_world_cam_est")
    Q = as_pose4(ref, "T_world_cam_ref")
    if P.ndim != 3 or Q.ndim != 3:
        raise ValueError(f"trajectories must have shape [N, 3|4, 4], got {list(P.shape)} and {list(Q.shape)}")
    if len(P) != len(Q):
        raise ValueError(f"trajectories have different lengths: {len(P)} estimated vs {len(Q)} reference")
    if len(P) == 0:
        raise ValueError("empty trajectory")
    if not (np.isfinite(P).all() and np.isfinite(Q).all()):
        raise ValueError("trajectories contain NaN or infinite values")
    return P, Q


def _inv_mul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A^-1 B`` for rigid ``[M, 4, 4]`` transforms (closed-form inverse)."""
    RaT = np.swapaxes(A[:, :3, :3], -1, -2)
    out = np.zeros(A.shape)
    out[:, :3, :3] = RaT @ B[:, :3, :3]
    out[:, :3, 3] = np.einsum("mab,mb->ma", RaT, B[:, :3, 3] - A[:, :3, 3])
    out[:, 3, 3] = 1.0
    return out


def _relative(T: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``T_i^-1 T_j`` (e.g. ``T_ci_cj`` from ``T_world_cam``), batched over index arrays ``[M]``."""
    return _inv_mul(T[i], T[j])


def ate(T_world_cam_est: ArrayLike, T_world_cam_ref: ArrayLike, *, align: str = "sim3") -> ATEResult:
    """Absolute trajectory error (RMSE of camera-centre distances after alignment).

    Args:
        T_world_cam_est: estimated poses ``[N, 3|4, 4]``.
        T_world_cam_ref: reference poses ``[N, 3|4, 4]`` of the same frames.
        align: ``"none"``, ``"se3"`` or ``"sim3"`` (Umeyama on camera centres).

    Raises:
        ValueError: mismatched lengths, non-finite poses, unknown ``align``, or a degenerate
            trajectory for se3 / sim3 (fewer than 3 poses, all centres equal, collinear).
    """
    P, Q = _check_pair(T_world_cam_est, T_world_cam_ref)
    S = align_trajectories(P, Q, align)
    aligned = S.apply_poses(P)
    errors = np.linalg.norm(aligned[:, :3, 3] - Q[:, :3, 3], axis=1)
    return ATEResult(align=align, alignment=S, stats=ErrorStats.of(errors), errors=errors)


def rpe(
    T_world_cam_est: ArrayLike,
    T_world_cam_ref: ArrayLike,
    *,
    delta: int = 1,
    align: str = "sim3",
    all_pairs: bool = False,
) -> RPEResult:
    """Relative pose error, translation and rotation (see the module docstring).

    Args:
        T_world_cam_est: estimated poses ``[N, 3|4, 4]``.
        T_world_cam_ref: reference poses ``[N, 3|4, 4]`` of the same frames.
        delta: frame offset (``1`` = frame-to-frame).
        align: alignment applied to the estimate first (``"sim3"`` corrects its scale, which
            the translation error depends on; rigid parts cancel).
        all_pairs: use every ``(i, i + delta)`` instead of consecutive pairs.

    Raises:
        ValueError: as :func:`ate`, or ``delta < 1`` / no pair at that delta.
    """
    P, Q = _check_pair(T_world_cam_est, T_world_cam_ref)
    if int(delta) != delta or delta < 1:
        raise ValueError(f"delta must be a positive integer (frames), got {delta}")
    delta = int(delta)
    n = len(P)
    if all_pairs:
        i = np.arange(0, n - delta)
    else:
        i = np.arange(0, n, delta)[:-1]
    j = i + delta
    if len(i) == 0:
        raise ValueError(f"no frame pair at delta={delta} in a trajectory of {n} poses")
    S = align_trajectories(P, Q, align)
    P = S.apply_poses(P)
    Q_rel = _relative(Q, i, j)
    P_rel = _relative(P, i, j)
    E = _inv_mul(Q_rel, P_rel)
    trans_err = np.linalg.norm(E[:, :3, 3], axis=1)
    rot_err = rotation_angle_deg(E[:, :3, :3])
    return RPEResult(
        align=align,
        alignment=S,
        delta=delta,
        all_pairs=all_pairs,
        pairs=np.stack((i, j), axis=1),
        trans=ErrorStats.of(trans_err),
        rot_deg=ErrorStats.of(rot_err),
        trans_errors=trans_err,
        rot_errors_deg=rot_err,
    )


def _auc_from_errors(
    rot_err: np.ndarray, trans_err: np.ndarray, thresholds: Sequence[int]
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """AUC / rotation accuracy / translation accuracy per threshold, as fractions."""
    err = np.maximum(rot_err, trans_err)
    err = np.where(np.isfinite(err), err, np.inf)
    auc, racc, tacc = {}, {}, {}
    for T in thresholds:
        if int(T) != T or T < 1:
            raise ValueError(f"AUC thresholds must be positive integers (degrees), got {T}")
        T = int(T)
        # fraction(err < k) for k = 1..T-1, and err <= T for the last bin (np.histogram's closed edge).
        below = [(err < k).mean() for k in range(1, T)] + [(err <= T).mean()]
        auc[T] = float(np.mean(below))
        racc[T] = float((rot_err < T).mean())
        tacc[T] = float((trans_err < T).mean())
    return auc, racc, tacc


def pose_auc(
    T_world_cam_est: ArrayLike,
    T_world_cam_ref: ArrayLike,
    *,
    thresholds: Sequence[int] = AUC_THRESHOLDS,
    fold_translation: bool = True,
) -> PoseAUCResult:
    """Pose AUC over all frame pairs ``i < j`` (see the module docstring).

    Args:
        T_world_cam_est: estimated poses ``[N, 3|4, 4]``, ``N >= 2``.
        T_world_cam_ref: reference poses of the same frames.
        thresholds: AUC thresholds in whole degrees.
        fold_translation: use ``min(a, 180 - a)`` for the translation-direction angle (the
            direction's sign is not penalised), as the published numbers do.

    Pairs whose reference or estimated relative translation is zero get a 180-degree (or,
    folded, 90-degree) translation error.
    """
    P, Q = _check_pair(T_world_cam_est, T_world_cam_ref)
    if len(P) < 2:
        raise ValueError("pose AUC needs at least 2 poses")
    i_all, j_all = np.triu_indices(len(P), k=1)
    rot_err = np.empty(len(i_all))
    trans_err = np.empty(len(i_all))
    for start in range(0, len(i_all), _PAIR_CHUNK):  # bounded memory for long sequences
        sl = slice(start, start + _PAIR_CHUNK)
        P_rel = _relative(P, i_all[sl], j_all[sl])
        Q_rel = _relative(Q, i_all[sl], j_all[sl])
        rot_err[sl] = rotation_angle_deg(np.swapaxes(Q_rel[:, :3, :3], -1, -2) @ P_rel[:, :3, :3])
        tp, tq = P_rel[:, :3, 3], Q_rel[:, :3, 3]
        norms = np.linalg.norm(tp, axis=1) * np.linalg.norm(tq, axis=1)
        cos = np.einsum("ma,ma->m", tp, tq) / np.where(norms > 0, norms, 1.0)
        trans_err[sl] = np.where(norms > 0, np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))), 180.0)
    if fold_translation:
        trans_err = np.minimum(trans_err, 180.0 - trans_err)
    auc, racc, tacc = _auc_from_errors(rot_err, trans_err, thresholds)
    return PoseAUCResult(auc, racc, tacc, rot_err, trans_err, num_pairs=len(i_all))


def aggregate_auc(
    results: Sequence[PoseAUCResult], *, mode: str = "macro", thresholds: Sequence[int] | None = None
) -> PoseAUCResult:
    """Combine per-sequence AUC results.

    Args:
        results: one :class:`PoseAUCResult` per sequence.
        mode: ``"macro"`` = mean of the per-sequence values (every sequence weighs the same);
            ``"micro"`` = AUC of all pairs of all sequences pooled (long sequences dominate).
        thresholds: default: those of the first result.

    Returns:
        A :class:`PoseAUCResult`; for ``"macro"`` its error arrays are the pooled ones too.
    """
    if not results:
        raise ValueError("no AUC results to aggregate")
    if mode not in ("macro", "micro"):
        raise ValueError(f"mode must be 'macro' or 'micro', got {mode!r}")
    ths = list(thresholds) if thresholds is not None else list(results[0].auc)
    rot = np.concatenate([r.rot_errors_deg for r in results])
    trans = np.concatenate([r.trans_errors_deg for r in results])
    if mode == "micro":
        auc, racc, tacc = _auc_from_errors(rot, trans, ths)
    else:
        auc = {T: float(np.mean([r.auc[T] for r in results])) for T in ths}
        racc = {T: float(np.mean([r.rot_acc[T] for r in results])) for T in ths}
        tacc = {T: float(np.mean([r.trans_acc[T] for r in results])) for T in ths}
    return PoseAUCResult(auc, racc, tacc, rot, trans, num_pairs=len(rot))
