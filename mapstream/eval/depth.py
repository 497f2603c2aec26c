"""Depth-map metrics with scale (or scale-and-shift) alignment and validity masks.

For valid pixels (``gt`` finite and in ``(min_depth, max_depth)``, ``pred`` finite and > 0, and
the optional ``mask``), the prediction is first aligned:

* ``"none"``: used as is (metric predictions);
* ``"median"``: ``pred * s`` with ``s = median(gt) / median(pred)``;
* ``"scale_shift"``: ``pred * s + b`` with ``(s, b)`` the least-squares fit to ``gt``;

per frame (``per="frame"``: one ``s`` (and ``b``) per depth map) or per sequence
(``per="sequence"``: one for all frames, pixels pooled). The aligned prediction is then
clamped to ``[min_depth, max_depth]`` and, per frame,

* ``abs_rel = mean(|p - g| / g)``, ``sq_rel = mean((p - g)^2 / g)``,
* ``rmse = sqrt(mean((p - g)^2))``, ``log_rmse = sqrt(mean((log p - log g)^2))``,
* ``delta_k = fraction(max(p / g, g / p) < 1.25^k)`` for k = 1, 2, 3.

The sequence values are the means of the per-frame values over frames with at least one valid
pixel. Depths are camera-space z in the ground truth's units (metres); the deltas are fractions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mapstream.geometry.align import ArrayLike, as_float64

__all__ = ["DepthMetrics", "DEPTH_ALIGN_MODES", "DEPTH_METRIC_NAMES", "depth_metrics"]

DEPTH_ALIGN_MODES: tuple[str, ...] = ("none", "median", "scale_shift")
DEPTH_METRIC_NAMES: tuple[str, ...] = (
    "abs_rel", "sq_rel", "rmse", "log_rmse", "delta_1", "delta_2", "delta_3",
)


@dataclass(frozen=True)
class DepthMetrics:
    """Depth metrics of a sequence (means over frames).

    Attributes:
        values: ``{name: mean over frames}`` for :data:`DEPTH_METRIC_NAMES`.
        per_frame: ``{name: [N] per-frame values}`` (NaN for frames without valid pixels).
        align: ``"none"``, ``"median"`` or ``"scale_shift"``.
        per: ``"frame"`` or ``"sequence"``.
        scales, shifts: ``[N]`` alignment applied to each frame (``1`` / ``0`` for "none").
        valid_pixels: ``[N]`` number of valid pixels per frame.
        min_depth, max_depth: the validity range used.
    """

    values: dict[str, float]
    per_frame: dict[str, np.ndarray] = field(repr=False)
    align: str
    per: str
    scales: np.ndarray = field(repr=False)
    shifts: np.ndarray = field(repr=False)
    valid_pixels: np.ndarray = field(repr=False)
    min_depth: float
    max_depth: float | None

    def __getitem__(self, name: str) -> float:
        return self.values[name]


def _as_array(x: ArrayLike) -> np.ndarray:
    """A numpy view of an array or tensor (floating dtypes kept, others as float64)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    return x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float64)


def _fit(pred: np.ndarray, gt: np.ndarray, align: str) -> tuple[float, float]:
    """Scale and shift mapping ``pred`` values onto ``gt`` values (1-D, valid pixels only)."""
    if align == "none":
        return 1.0, 0.0
    if align == "median":
        return float(np.median(gt) / np.median(pred)), 0.0
    # scale_shift: least squares on [pred, 1] (falls back to a scale if pred is constant).
    A = np.stack((pred, np.ones_like(pred)), axis=1)
    (s, b), *_ = np.linalg.lstsq(A, gt, rcond=None)
    return float(s), float(b)


def _frame_metrics(p: np.ndarray, g: np.ndarray) -> dict[str, float]:
    diff = p - g
    ratio = np.maximum(p / g, g / p)
    return {
        "abs_rel": float(np.mean(np.abs(diff) / g)),
        "sq_rel": float(np.mean(diff * diff / g)),
        "rmse": float(np.sqrt(np.mean(diff * diff))),
        "log_rmse": float(np.sqrt(np.mean((np.log(p) - np.log(g)) ** 2))),
        "delta_1": float(np.mean(ratio < 1.25)),
        "delta_2": float(np.mean(ratio < 1.25**2)),
        "delta_3": float(np.mean(ratio < 1.25**3)),
    }


def depth_metrics(
    pred: ArrayLike,
    gt: ArrayLike,
    *,
    align: str = "median",
    per: str = "frame",
    min_depth: float = 1e-3,
    max_depth: float | None = None,
    mask: ArrayLike | None = None,
) -> DepthMetrics:
    """Depth metrics of predicted depth maps against ground truth (see the module docstring).

    Args:
        pred: predicted depth ``[N, H, W]`` or ``[H, W]`` (any scale unless ``align="none"``).
        gt: ground-truth depth, same shape, in metres; 0, negative or non-finite = invalid.
        align: ``"none"``, ``"median"`` or ``"scale_shift"``.
        per: ``"frame"`` or ``"sequence"`` alignment.
        min_depth: ground truth at or below this is invalid; aligned predictions are clamped to it.
        max_depth: ground truth at or above this is invalid (``None``: no upper limit).
        mask: optional extra validity mask ``[N, H, W]`` / ``[H, W]`` (True = evaluate).

    Raises:
        ValueError: unknown mode, mismatched shapes, or no valid pixel at all.
    """
    if align not in DEPTH_ALIGN_MODES:
        raise ValueError(f"depth align must be one of {DEPTH_ALIGN_MODES}, got {align!r}")
    if per not in ("frame", "sequence"):
        raise ValueError(f"per must be 'frame' or 'sequence', got {per!r}")
    P = _as_array(pred)  # kept in its dtype; frames are converted to float64 one at a time
    G = _as_array(gt)
    if P.shape != G.shape or P.ndim not in (2, 3):
        raise ValueError(
            f"pred and gt must have the same shape, [N, H, W] or [H, W], got {list(P.shape)} and {list(G.shape)}"
        )
    if P.ndim == 2:
        P, G = P[None], G[None]
    hi = np.inf if max_depth is None else float(max_depth)
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(G) & (G > min_depth) & (G < hi) & np.isfinite(P) & (P > 0)
    if mask is not None:
        M = as_float64(mask, "mask") != 0
        if M.ndim == 2:
            M = M[None]
        if M.shape != valid.shape:
            raise ValueError(f"mask shape {list(M.shape)} does not match depth shape {list(valid.shape)}")
        valid &= M
    counts = valid.reshape(len(P), -1).sum(1)
    if counts.sum() == 0:
        raise ValueError("no valid depth pixel (check min_depth / max_depth and the ground truth's units)")

    n = len(P)
    scales, shifts = np.ones(n), np.zeros(n)
    if per == "sequence":
        s, b = _fit(P[valid].astype(np.float64), G[valid].astype(np.float64), align)
        scales[:], shifts[:] = s, b
    per_frame = {k: np.full(n, np.nan) for k in DEPTH_METRIC_NAMES}
    for f in range(n):
        if counts[f] == 0:
            continue
        p, g = P[f][valid[f]].astype(np.float64), G[f][valid[f]].astype(np.float64)
        if per == "frame":
            scales[f], shifts[f] = _fit(p, g, align)
        p = np.clip(p * scales[f] + shifts[f], min_depth, hi)
        for k, v in _frame_metrics(p, g).items():
            per_frame[k][f] = v
    values = {k: float(np.nanmean(v)) for k, v in per_frame.items()}
    return DepthMetrics(values, per_frame, align, per, scales, shifts, counts, float(min_depth), max_depth)
