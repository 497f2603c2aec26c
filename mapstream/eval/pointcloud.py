"""Point-cloud metrics (accuracy, completeness, Chamfer, precision / recall / F1) and a small ICP.

With ``d(x, Y) = min_y |x - y|`` (scipy ``cKDTree``), for a predicted cloud ``P`` and a
ground-truth cloud ``G`` (both already in the same world frame and units, optionally
voxel-downsampled and ICP-refined first):

* ``accuracy = mean_{p in P} d(p, G)``, ``completeness = mean_{g in G} d(g, P)``,
* ``chamfer = (accuracy + completeness) / 2`` (the authors' definition),
* ``precision = fraction_{p in P}(d(p, G) < threshold)``,
  ``recall = fraction_{g in G}(d(g, P) < threshold)``, ``f1 = 2 P R / (P + R)`` (0 if both 0).

Distances are in the clouds' units (metres); precision / recall / F1 are fractions.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial import cKDTree

from mapstream.geometry.align import ArrayLike, Sim3, as_float64, umeyama

__all__ = ["ICPResult", "PointCloudMetrics", "voxel_downsample", "icp", "pointcloud_metrics"]

log = logging.getLogger(__name__)


def _points(x: ArrayLike, name: str) -> np.ndarray:
    p = as_float64(x, name)
    if p.ndim != 2 or p.shape[1] != 3:
        raise ValueError(f"{name} must have shape [N, 3], got {list(p.shape)}")
    p = p[np.isfinite(p).all(1)]
    if len(p) == 0:
        raise ValueError(f"{name} has no finite point")
    return p


def voxel_downsample(points: ArrayLike, voxel_size: float) -> np.ndarray:
    """One point per occupied voxel: the centroid of the points in it.

    Args:
        points: ``[N, 3]``; non-finite rows are dropped.
        voxel_size: edge of the cubic voxels (grid anchored at the origin), > 0.

    Returns:
        ``[M, 3]`` float64, ordered by voxel index (deterministic).
    """
    if not voxel_size > 0:
        raise ValueError(f"voxel_size must be > 0, got {voxel_size}")
    p = _points(points, "points")
    keys = np.floor(p / voxel_size).astype(np.int64)
    keys -= keys.min(axis=0)
    span = keys.max(axis=0) + 1
    if np.prod(span.astype(np.float64)) < 2**62:  # one int64 per voxel: much faster than axis=0
        flat = (keys[:, 0] * span[1] + keys[:, 1]) * span[2] + keys[:, 2]
        _, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
    else:
        _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    sums = np.zeros((len(counts), 3))
    np.add.at(sums, inverse, p)
    return sums / counts[:, None]


@dataclass(frozen=True)
class ICPResult:
    """Outcome of :func:`icp`.

    Attributes:
        transform: ``S_dst_src``, maps the source cloud onto the destination cloud.
        iterations: iterations run.
        converged: the inlier RMSE changed by less than ``tol`` before ``max_iters``.
        rmse: RMSE of the inlier correspondences at the end (cloud units).
        fitness: fraction of source points with a correspondence within ``max_dist``.
    """

    transform: Sim3
    iterations: int
    converged: bool
    rmse: float
    fitness: float


def icp(
    src: ArrayLike,
    dst: ArrayLike,
    *,
    max_dist: float,
    max_iters: int = 30,
    with_scale: bool = False,
    tol: float = 1e-9,
    init: Sim3 | None = None,
) -> ICPResult:
    """Point-to-point ICP: nearest neighbours within ``max_dist``, then Umeyama, repeated.

    Each iteration re-estimates the whole transform from the original source points to their
    current matches (no accumulation of increments).

    Args:
        src: source cloud ``[N, 3]`` (e.g. the prediction).
        dst: destination cloud ``[M, 3]`` (e.g. the ground truth).
        max_dist: correspondences farther than this are ignored (cloud units).
        max_iters: iteration limit.
        with_scale: estimate a similarity instead of a rigid transform.
        tol: stop when the inlier RMSE changes by less than this.
        init: initial transform (default: identity).

    Returns:
        An :class:`ICPResult`; if fewer than 3 correspondences are found, the current
        transform is returned unchanged with ``converged=False`` (and a warning is logged).
    """
    s_pts = _points(src, "src")
    d_pts = _points(dst, "dst")
    tree = cKDTree(d_pts)
    S = init if init is not None else Sim3.identity()
    prev = np.inf
    rmse, fitness, converged, it = np.inf, 0.0, False, 0
    for it in range(1, max_iters + 1):
        dist, idx = tree.query(S.apply_points(s_pts), distance_upper_bound=max_dist)
        inl = np.isfinite(dist)
        fitness = float(inl.mean())
        if inl.sum() < 3:
            log.warning("ICP: %d correspondences within %.4g, keeping the current transform", inl.sum(), max_dist)
            break
        rmse = float(np.sqrt(np.mean(dist[inl] ** 2)))
        if abs(prev - rmse) < tol:
            converged = True
            break
        prev = rmse
        try:
            S = umeyama(s_pts[inl], d_pts[idx[inl]], with_scale=with_scale)
        except ValueError as err:
            log.warning("ICP: degenerate correspondences (%s), keeping the current transform", err)
            break
    return ICPResult(S, it, converged, rmse, fitness)


@dataclass(frozen=True)
class PointCloudMetrics:
    """Cloud-to-cloud metrics (see the module docstring).

    Attributes:
        accuracy, completeness, chamfer: mean distances (cloud units).
        accuracy_median, completeness_median: median distances.
        precision, recall, f1: fractions at ``threshold``.
        threshold: distance threshold for precision / recall / F1.
        voxel_size: voxel size used to downsample both clouds (``None``: not downsampled).
        icp: the ICP refinement applied to the prediction, if any.
        num_pred, num_gt: points evaluated (after downsampling).
    """

    accuracy: float
    completeness: float
    chamfer: float
    accuracy_median: float
    completeness_median: float
    precision: float
    recall: float
    f1: float
    threshold: float
    voxel_size: float | None
    icp: ICPResult | None = field(repr=False)
    num_pred: int
    num_gt: int


def pointcloud_metrics(
    pred: ArrayLike,
    gt: ArrayLike,
    *,
    threshold: float = 0.05,
    voxel_size: float | None = None,
    icp_refine: bool = False,
    icp_max_dist: float | None = None,
    icp_with_scale: bool = False,
) -> PointCloudMetrics:
    """Compare a predicted point cloud with the ground truth (see the module docstring).

    Args:
        pred: predicted points ``[N, 3]``, already in the ground truth's frame and units
            (e.g. moved by the trajectory's Sim(3) alignment).
        gt: ground-truth points ``[M, 3]``.
        threshold: precision / recall / F1 distance threshold.
        voxel_size: if given, both clouds are voxel-downsampled first (:func:`voxel_downsample`).
        icp_refine: refine the prediction onto the ground truth with :func:`icp` first.
        icp_max_dist: ICP correspondence distance (default ``2 * threshold``).
        icp_with_scale: let ICP also correct the scale.
    """
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    P = _points(pred, "pred")
    G = _points(gt, "gt")
    if voxel_size is not None:
        P, G = voxel_downsample(P, voxel_size), voxel_downsample(G, voxel_size)
    icp_result = None
    if icp_refine:
        max_dist = icp_max_dist if icp_max_dist is not None else 2.0 * threshold
        icp_result = icp(P, G, max_dist=max_dist, with_scale=icp_with_scale)
        P = icp_result.transform.apply_points(P)
    d_pg, _ = cKDTree(G).query(P)
    d_gp, _ = cKDTree(P).query(G)
    acc, comp = float(d_pg.mean()), float(d_gp.mean())
    prec, rec = float((d_pg < threshold).mean()), float((d_gp < threshold).mean())
    f1 = 2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
    return PointCloudMetrics(
        accuracy=acc,
        completeness=comp,
        chamfer=(acc + comp) / 2,
        accuracy_median=float(np.median(d_pg)),
        completeness_median=float(np.median(d_gp)),
        precision=prec,
        recall=rec,
        f1=f1,
        threshold=float(threshold),
        voxel_size=voxel_size,
        icp=icp_result,
        num_pred=len(P),
        num_gt=len(G),
    )
