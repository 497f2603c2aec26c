"""Pairing a run's frames with ground-truth frames: by name, by timestamp, or by index.

A run can be denser than its ground truth (a video at 30 fps against poses at 10 Hz): timestamp
pairing then gives each ground-truth frame the nearest predicted frame within ``max_dt`` and
leaves the other predicted frames out.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from mapstream.eval.datasets import GroundTruthSequence

__all__ = ["MATCH_MODES", "match_frames"]

log = logging.getLogger(__name__)

MATCH_MODES: tuple[str, ...] = ("auto", "name", "timestamp", "index")

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".exr", ".npy"}


def frame_key(name: str) -> str:
    """A frame name without folders and image extension (``rgb/0.100000.png`` -> ``0.100000``)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    stem, dot, ext = base.rpartition(".")
    return stem if dot and f".{ext.lower()}" in _IMAGE_SUFFIXES else base


def _by_timestamp(stamps: np.ndarray, gt_stamps: np.ndarray, max_dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Each predicted frame's nearest ground-truth frame within ``max_dt``; where several take
    the same ground-truth frame, only the closest of them (the earliest on a tie) keeps it."""
    nearest = np.abs(stamps[:, None] - gt_stamps[None, :]).argmin(1)
    gap = np.abs(gt_stamps[nearest] - stamps)
    pred = np.flatnonzero(gap <= max_dt)
    order = pred[np.lexsort((pred, gap[pred]))]  # closest first
    _, first = np.unique(nearest[order], return_index=True)
    kept = np.sort(order[first])
    return kept, nearest[kept]


def _by_best_timestamps(
    keys: Sequence[str], pred_timestamps: np.ndarray | None, gt: GroundTruthSequence, max_dt: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Pairs by the run's own timestamps or by its names read as seconds, whichever pairs more
    frames (the run's own on a tie); None when the run has neither."""
    sources = []
    if pred_timestamps is not None and np.isfinite(np.asarray(pred_timestamps, dtype=np.float64)).all():
        sources.append(("the run's timestamps", np.asarray(pred_timestamps, dtype=np.float64)))
    try:
        sources.append(("the frame names read as seconds", np.array([float(k) for k in keys], dtype=np.float64)))
    except ValueError:
        pass
    if not sources:
        return None
    paired = [(_by_timestamp(stamps, gt.timestamps, max_dt), what) for what, stamps in sources]
    best, what = max(paired, key=lambda p: len(p[0][0]))  # max keeps the first on a tie
    log.info("%s: timestamps from %s", gt.name, what)
    return best


def _warn_if_most_unpaired(num_paired: int, num_pred: int, gt: GroundTruthSequence, max_dt: float) -> None:
    """A warning when fewer than half the frames that could pair did (the fewer of the run's
    and the ground truth's: a run denser than its ground truth leaves its extra frames out)."""
    could = min(num_pred, len(gt))
    if 2 * num_paired < could:
        log.warning("%s: only %d of %d predicted frames (%d ground-truth frames) paired by timestamp within "
                    "%g s; the scores cover those frames only (check the run's timestamps, --max-dt, or "
                    "--match name/index)", gt.name, num_paired, num_pred, len(gt), max_dt)


def match_frames(
    pred_names: Sequence[str],
    gt: GroundTruthSequence,
    *,
    mode: str = "auto",
    max_dt: float = 0.02,
    pred_timestamps: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """Pair predicted frames with ground-truth frames.

    Args:
        pred_names: the run's frame names.
        gt: the ground truth.
        mode: ``"name"``, ``"timestamp"``, ``"index"`` or ``"auto"`` (the first of those that
            pairs every predicted frame; else the best partial name/timestamp match if it pairs at
            least half of them; else an error).
        max_dt: timestamp tolerance in seconds.
        pred_timestamps: the run's own timestamps (seconds). Timestamp pairing uses them, or the
            names read as seconds where those pair more frames (a TUM folder's file names are its
            times; a run of ``000001.png`` files is timed by its own clock).

    Returns:
        ``(pred_idx [M], gt_idx [M], how)``.

    Raises:
        ValueError: an unknown mode, or no pairing (the message says which modes could help).
    """
    if mode not in MATCH_MODES:
        raise ValueError(f"match must be one of {MATCH_MODES}, got {mode!r}")
    keys = [frame_key(n) for n in pred_names]
    candidates: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if mode in ("auto", "name"):
        lookup = {frame_key(n): i for i, n in enumerate(gt.frame_names)}
        pi = [i for i, k in enumerate(keys) if k in lookup]
        candidates["name"] = (np.array(pi, dtype=np.int64), np.array([lookup[keys[i]] for i in pi], dtype=np.int64))
    if mode in ("auto", "timestamp") and len(gt.timestamps) and np.isfinite(gt.timestamps).all():
        paired = _by_best_timestamps(keys, pred_timestamps, gt, max_dt)
        if paired is not None:
            candidates["timestamp"] = paired
    if mode in ("auto", "index") and len(pred_names) == len(gt):
        idx = np.arange(len(gt))
        candidates["index"] = (idx, idx)
    if mode != "auto":
        if mode not in candidates or len(candidates[mode][0]) == 0:
            raise ValueError(f"{gt.name}: no frame could be matched by {mode}{_why_not(mode, pred_names, gt, max_dt)}")
        if mode == "timestamp":
            _warn_if_most_unpaired(len(candidates[mode][0]), len(pred_names), gt, max_dt)
        return (*candidates[mode], mode)
    for how in ("name", "timestamp", "index"):
        if how in candidates and len(candidates[how][0]) == len(pred_names):
            return (*candidates[how], how)
    partial = [h for h in ("name", "timestamp") if h in candidates]
    best = max(partial, key=lambda h: len(candidates[h][0]), default=None)
    if best is not None and len(candidates[best][0]) > 0 and 2 * len(candidates[best][0]) >= len(pred_names):
        log.warning("%s: only %d of %d predicted frames matched by %s", gt.name, len(candidates[best][0]),
                    len(pred_names), best)
        return (*candidates[best], best)
    denser = (
        "; a run with more frames than its ground truth is paired by timestamp: --match timestamp "
        "(match='timestamp'), within --max-dt seconds" if len(pred_names) > len(gt) else ""
    )
    raise ValueError(
        f"{gt.name}: cannot match the {len(pred_names)} predicted frames (e.g. {pred_names[0]!r}) to the "
        f"{len(gt)} ground-truth frames (e.g. {gt.frame_names[0]!r}) by name, timestamp or index{denser}"
    )


def _why_not(mode: str, pred_names: Sequence[str], gt: GroundTruthSequence, max_dt: float) -> str:
    if mode == "index":
        return f" (the run has {len(pred_names)} frames, the ground truth {len(gt)})"
    if mode == "timestamp":
        if not len(gt.timestamps) or not np.isfinite(gt.timestamps).all():
            return " (the ground truth has no timestamps)"
        return f" (none within {max_dt:g} s; the names must be seconds, or the run must record timestamps)"
    return ""
