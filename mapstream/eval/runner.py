"""`mapstream eval`: score `mapstream run` outputs against ground truth, per scene and aggregated.

    report = evaluate("runs/desk", "data/rgbd_dataset_freiburg1_desk", align="sim3", out="eval.json")
    print(format_table(report))

``pred_dir`` is a run folder (``predictions.npz``) for a single ground-truth scene, or a folder of
run folders named like the scenes of a dataset folder. Frames are matched by name (file stem),
then by timestamp (the run's ``timestamps``, or names read as seconds, within ``max_dt``),
then by index (equal counts); ``match="timestamp"`` pairs a run denser than its ground truth
(:mod:`mapstream.eval.matching`).
Each metric group is computed when its inputs exist (a failing group is recorded under
``errors`` and the others still run):

* ``trajectory``: ATE and RPE (``rpe_delta`` frames) after ``align`` (none / se3 / sim3);
* ``pose_auc``: AUC@3/5/15/30 over all frame pairs (alignment-free);
* ``depth``: abs-rel ... delta_3 with ``depth_align`` (median / scale_shift / none) per frame or
  per sequence, in the prediction's pixels: the ground truth goes through the geometry of the
  run's own preprocessing (:mod:`mapstream.eval.input_geometry`; padding left out);
* ``points``: predicted depth unprojected with predicted poses and moved by the poses'
  alignment (``points_align="poses"``: the rotation from the cameras' orientations, which a
  short or straight path's centres leave loose; ``"trajectory"``: the ATE's), against the
  ground-truth depth unprojected with ground-truth poses (or ``points.ply``),
  voxel-downsampled, optionally ICP-refined.

Every group in the JSON carries the alignment its numbers were computed with (``"align"``).
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from mapstream.io.atomic import atomic_open
from mapstream.eval.datasets import GroundTruthSequence, find_scenes, read_sequence
from mapstream.eval.depth import depth_metrics
from mapstream.eval.input_geometry import InputGeometry, depth_in_model_frame, read_input_geometry
from mapstream.eval.matching import MATCH_MODES, match_frames
from mapstream.eval.pointcloud import pointcloud_metrics
from mapstream.eval.predictions import PREDICTIONS_FILE, Predictions, read_predictions
from mapstream.eval.report import EvalReport, SceneReport
from mapstream.eval.table import AGGREGATED, format_table
from mapstream.eval.trajectory import AUC_THRESHOLDS, PoseAUCResult, aggregate_auc, ate, pose_auc, rpe
from mapstream.geometry import unproject_depth
from mapstream.geometry.align import ALIGN_MODES, Sim3, align_poses
from mapstream.progress import progress_bar

__all__ = ["EvalReport", "SceneReport", "evaluate", "match_frames", "format_table", "eval_main", "write_json_atomic"]

log = logging.getLogger(__name__)

POINTS_ALIGN: tuple[str, ...] = ("poses", "trajectory")

_AUC_ALIGN = "none (invariant to a Sim(3) of either trajectory)"


# ----------------------------------------------------------------------------- helpers
def _jsonable(x: Any) -> Any:
    """Plain JSON types; non-finite floats become ``None``."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    with atomic_open(path, "w") as f:
        json.dump(_jsonable(data), f, indent=2, allow_nan=False)
        f.write("\n")
    return path


def _cloud(depth: np.ndarray, K: np.ndarray, T_world_cam: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """World points ``[M, 3]`` of the masked pixels of one depth map (float64)."""
    pts = unproject_depth(torch.from_numpy(np.asarray(depth, np.float64)), torch.from_numpy(K),
                          torch.from_numpy(T_world_cam[:3])).numpy()
    return pts[mask]


def _subsample(points: np.ndarray, max_points: int, seed: int = 0) -> np.ndarray:
    """At most ``max_points`` rows, drawn without replacement (seeded, order kept)."""
    if len(points) <= max_points:
        return points
    keep = np.random.default_rng(seed).choice(len(points), max_points, replace=False)
    return points[np.sort(keep)]


# ----------------------------------------------------------------------------- one scene
def _evaluate_scene(pred: Predictions, gt: GroundTruthSequence, geometry: InputGeometry, report: SceneReport,
                    opts: dict) -> None:
    align = opts["align"]
    T_est, T_ref = pred.T_world_cam, gt.T_world_cam
    S: Sim3 | None = None

    try:
        a = ate(T_est, T_ref, align=align)
        r = rpe(T_est, T_ref, align=align, delta=opts["rpe_delta"])
        S = a.alignment
        report.metrics["trajectory"] = {
            "align": align, "ate": a.rmse, "ate_mean": a.stats.mean, "ate_median": a.stats.median,
            "ate_max": a.stats.max, "rpe_trans": r.trans.rmse, "rpe_trans_mean": r.trans.mean,
            "rpe_rot_deg": r.rot_deg.rmse, "rpe_rot_deg_mean": r.rot_deg.mean, "rpe_delta": r.delta,
            "num_frames": len(T_est), "alignment": S.to_dict(),
        }
    except ValueError as err:
        report.errors["trajectory"] = str(err)

    try:
        auc = pose_auc(T_est, T_ref, thresholds=opts["auc_thresholds"])
        report.auc = auc
        report.metrics["pose_auc"] = _auc_dict(auc)
    except ValueError as err:
        report.errors["pose_auc"] = str(err)

    groups = ("depth", "points") if opts["points"] else ("depth",)
    if pred.depth is None or not gt.has_depth:
        missing = "predicted" if pred.depth is None else "ground-truth"
        report.errors.update({g: f"no {missing} depth" for g in groups})
        return
    frame_hw = tuple(pred.depth.shape[1:])
    try:
        G = np.stack([depth_in_model_frame(gt.load_depth(i), geometry, frame_hw, gt.image_hw) for i in range(len(gt))])
    except (OSError, RuntimeError, ValueError) as err:
        report.errors.update({g: f"cannot map the ground-truth depth onto the prediction: {err}" for g in groups})
        return
    try:
        dm = depth_metrics(pred.depth, G, align=opts["depth_align"], per=opts["depth_per"],
                           min_depth=opts["min_depth"], max_depth=opts["max_depth"])
        report.metrics["depth"] = {
            "align": f"{dm.align} per {dm.per}", **dm.values, "min_depth": dm.min_depth,
            "max_depth": dm.max_depth, "gt_resize": geometry.describe(), "num_frames": len(G),
            "mean_scale": float(np.mean(dm.scales)),
        }
    except ValueError as err:
        report.errors["depth"] = str(err)

    if not opts["points"]:
        return
    try:
        report.metrics["points"] = _points_group(pred, gt, G, _points_alignment(T_est, T_ref, S, opts), opts)
    except (OSError, RuntimeError, ValueError) as err:
        report.errors["points"] = str(err)


def _points_alignment(T_est: np.ndarray, T_ref: np.ndarray, trajectory: Sim3 | None, opts: dict) -> Sim3:
    """What places the predicted cloud: the camera poses' own alignment (orientations fix the
    rotation that a short path's centres leave loose), or the trajectory's (centres only)."""
    if opts["points_align"] == "poses":
        return align_poses(T_est, T_ref, opts["align"])
    if trajectory is None:
        raise ValueError("needs the trajectory alignment, which failed")
    return trajectory


def _auc_dict(auc: PoseAUCResult) -> dict[str, Any]:
    out: dict[str, Any] = {"align": _AUC_ALIGN}
    out.update({f"auc@{t}": v for t, v in auc.auc.items()})
    out.update({f"rot_acc@{t}": v for t, v in auc.rot_acc.items()})
    out.update({f"trans_acc@{t}": v for t, v in auc.trans_acc.items()})
    out["num_pairs"] = auc.num_pairs
    return out


def _points_group(pred: Predictions, gt: GroundTruthSequence, G: np.ndarray, S: Sim3, opts: dict) -> dict[str, Any]:
    hi = np.inf if opts["max_depth"] is None else opts["max_depth"]
    per_frame = -(-opts["max_cloud_points"] // len(gt))  # memory bound: subsample frame by frame
    pred_pts, gt_pts = [], []
    for i in range(len(gt)):
        valid = np.isfinite(G[i]) & (G[i] > opts["min_depth"]) & (G[i] < hi)
        valid &= np.isfinite(pred.depth[i]) & (pred.depth[i] > 0)
        pred_pts.append(_subsample(_cloud(pred.depth[i], pred.K[i], pred.T_world_cam[i], valid), per_frame, i))
        if gt.points_path is None:
            d = gt.load_depth(i)
            gvalid = np.isfinite(d) & (d > opts["min_depth"]) & (d < hi)
            gt_pts.append(_subsample(_cloud(d, gt.K[i], gt.T_world_cam[i], gvalid), per_frame, i))
    P = S.apply_points(np.concatenate(pred_pts))
    if gt.points_path is not None:
        Gp = _subsample(gt.load_points(), opts["max_cloud_points"])
    else:
        Gp = np.concatenate(gt_pts)
    voxel = opts["voxel_size"] if opts["voxel_size"] is not None else opts["point_threshold"] / 2
    m = pointcloud_metrics(P, Gp, threshold=opts["point_threshold"], voxel_size=voxel or None,
                           icp_refine=opts["icp"])
    return {
        "align": f"{opts['align']} ({opts['points_align']})" + (" + ICP" if opts["icp"] else ""),
        "accuracy": m.accuracy, "completeness": m.completeness, "chamfer": m.chamfer,
        "accuracy_median": m.accuracy_median, "completeness_median": m.completeness_median,
        "precision": m.precision, "recall": m.recall, "f1": m.f1, "threshold": m.threshold,
        "voxel_size": m.voxel_size, "num_pred": m.num_pred, "num_gt": m.num_gt,
        "gt_source": "points.ply" if gt.points_path is not None else "depth",
        "icp_transform": m.icp.transform.to_dict() if m.icp is not None else None,
    }


# ----------------------------------------------------------------------------- entry points
def _pair_scenes(pred_dir: Path, gt: str | Path | GroundTruthSequence) -> list[tuple[str, Path | None, Any]]:
    """``[(scene name, run folder or None, ground truth path or sequence)]``."""
    if isinstance(gt, GroundTruthSequence):
        return [(gt.name, pred_dir, gt)]
    scenes = find_scenes(gt)
    if (pred_dir / PREDICTIONS_FILE).is_file() or pred_dir.suffix == ".npz":
        if len(scenes) != 1:
            raise ValueError(f"{pred_dir} is one run but {gt} holds {len(scenes)} scenes: point --gt at one scene")
        (name, path), = scenes.items()
        return [(name, pred_dir, path)]
    out = []
    for name, path in scenes.items():
        run = pred_dir / name
        out.append((name, run if (run / PREDICTIONS_FILE).is_file() else None, path))
    if all(run is None for _, run, _ in out):
        raise FileNotFoundError(f"{pred_dir}: no {PREDICTIONS_FILE}, nor a sub-folder per scene with one")
    return out


def evaluate(
    pred_dir: str | Path,
    gt: str | Path | GroundTruthSequence,
    *,
    align: str = "sim3",
    rpe_delta: int = 1,
    auc_thresholds: Sequence[int] = AUC_THRESHOLDS,
    depth_align: str = "median",
    depth_per: str = "frame",
    min_depth: float = 1e-3,
    max_depth: float | None = None,
    points: bool = True,
    point_threshold: float = 0.05,
    points_align: str = "poses",
    voxel_size: float | None = None,
    icp: bool = False,
    max_cloud_points: int = 2_000_000,
    match: str = "auto",
    max_dt: float = 0.02,
    tum_camera: str = "default",
    out: str | Path | None = None,
    progress: bool | None = None,
) -> EvalReport:
    """Evaluate run outputs against ground truth (see the module docstring).

    Args:
        pred_dir: a run folder (``predictions.npz``) or a folder of run folders named by scene.
        gt: a scene (TUM sequence, benchmark scene), a dataset folder of scenes, or a
            :class:`GroundTruthSequence`.
        align: trajectory alignment: ``"none"``, ``"se3"`` or ``"sim3"`` (Umeyama).
        rpe_delta: RPE frame offset.
        auc_thresholds: pose-AUC thresholds (degrees).
        depth_align: ``"median"``, ``"scale_shift"`` or ``"none"``; ``depth_per``: ``"frame"`` / ``"sequence"``.
        min_depth, max_depth: ground-truth validity range (metres) for depth and points.
        points: compute point-cloud metrics.
        point_threshold: precision / recall / F1 threshold (metres).
        points_align: how the predicted cloud is placed: ``"poses"`` (`align_poses`: the
            rotation from the cameras' orientations, scale and translation from their centres)
            or ``"trajectory"`` (the ATE's alignment of the centres alone).
        voxel_size: downsampling voxel (default ``point_threshold / 2``; 0 = none).
        icp: refine the aligned prediction onto the ground truth with ICP.
        max_cloud_points: random (seeded) subsampling of each cloud before voxelization.
        match: frame matching (``"auto"``, ``"name"``, ``"timestamp"``, ``"index"``).
        max_dt: timestamp tolerance (s) for matching and TUM association.
        tum_camera: TUM intrinsics (``"default"``, ``"freiburg1"``... or ``"auto"``).
        out: write the report's JSON there (atomically).
        progress: a bar over the scenes (None: when stderr is a terminal).

    Raises:
        ValueError / FileNotFoundError: bad arguments, or nothing to evaluate.
    """
    if align not in ALIGN_MODES:
        raise ValueError(f"align must be one of {ALIGN_MODES}, got {align!r}")
    if points_align not in POINTS_ALIGN:
        raise ValueError(f"points_align must be one of {POINTS_ALIGN}, got {points_align!r}")
    if match not in MATCH_MODES:
        raise ValueError(f"match must be one of {MATCH_MODES}, got {match!r}")
    if not (math.isfinite(max_dt) and max_dt >= 0):
        raise ValueError(f"max_dt must be a number of seconds >= 0, got {max_dt}")
    pred_dir = Path(pred_dir)
    opts = dict(align=align, rpe_delta=rpe_delta, auc_thresholds=tuple(auc_thresholds), depth_align=depth_align,
                depth_per=depth_per, min_depth=min_depth, max_depth=max_depth, points=points,
                point_threshold=point_threshold, points_align=points_align, voxel_size=voxel_size, icp=icp,
                max_cloud_points=max_cloud_points, match=match, max_dt=max_dt, tum_camera=tum_camera)
    scenes: list[SceneReport] = []
    pairs = _pair_scenes(pred_dir, gt)
    with progress_bar(len(pairs), desc="eval", unit="scene", progress=progress) as bar:
        for name, run, gt_src in pairs:
            _evaluate_pair(name, run, gt_src, pred_dir, len(pairs), scenes, opts)
            bar.update(1)
    result = EvalReport(scenes, _aggregate(scenes), _jsonable(opts))
    if out is not None:
        write_json_atomic(out, result.to_dict())
        log.info("wrote %s", out)
    return result


def _evaluate_pair(name: str, run: Path | None, gt_src, pred_dir: Path, num_pairs: int,
                   scenes: list[SceneReport], opts: dict[str, Any]) -> None:
    """Evaluate one (run folder, ground truth) pair into a new report appended to `scenes`;
    a bad scene of a dataset is reported and skipped, the only scene raises."""
    gt_path = str(gt_src.root) if isinstance(gt_src, GroundTruthSequence) else str(gt_src)
    report = SceneReport(name, str(run) if run else "", gt_path)
    scenes.append(report)
    if run is None:
        report.errors["scene"] = f"no run folder {pred_dir / name} with {PREDICTIONS_FILE}"
        log.warning("%s", report.errors["scene"])
        return
    try:
        seq = gt_src if isinstance(gt_src, GroundTruthSequence) else read_sequence(
            gt_src, max_dt=opts["max_dt"], camera=opts["tum_camera"])
        pred = read_predictions(run)
        geometry = read_input_geometry(pred.run_dir)
        pi, gi, report.match = match_frames(pred.names, seq, mode=opts["match"], max_dt=opts["max_dt"],
                                            pred_timestamps=pred.timestamps)
    except (OSError, ValueError) as err:
        if num_pairs == 1:
            raise
        report.errors["scene"] = str(err)  # one bad scene of a dataset: go on with the others
        log.warning("%s: skipped: %s", name, err)
        return
    report.num_frames = len(pi)
    log.info("%s: %d frames matched by %s", name, len(pi), report.match)
    _evaluate_scene(pred.subset(pi), seq.subset(gi), geometry, report, opts)
    for group, msg in report.errors.items():
        log.warning("%s: %s not computed: %s", name, group, msg)


def _aggregate(scenes: list[SceneReport]) -> dict[str, dict[str, Any]]:
    agg: dict[str, dict[str, Any]] = {}
    for group, keys in AGGREGATED.items():
        done = [s.metrics[group] for s in scenes if group in s.metrics]
        if done:
            agg[group] = {"align": done[0]["align"], "num_scenes": len(done),
                          **{k: float(np.mean([d[k] for d in done])) for k in keys}}
    aucs = [s.auc for s in scenes if s.auc is not None]
    for mode in ("macro", "micro") if aucs else ():
        agg[f"pose_auc_{mode}"] = {**_auc_dict(aggregate_auc(aucs, mode=mode)), "num_scenes": len(aucs)}
    return agg


def eval_main(pred: str, gt: str, out: str | None, align: str, *, emit: Callable[[str], None] | None = None,
              **options: Any) -> int:
    """CLI body of ``mapstream eval``: evaluate, write JSON, emit the table.

    Args:
        pred: run folder, or folder of per-scene run folders.
        gt: ground-truth scene or dataset folder.
        out: JSON path (default: ``<pred>/eval.json``).
        align: ``"none"``, ``"se3"`` or ``"sim3"``.
        emit: receives the table (default: logged at INFO on this module's logger).
        options: more of :func:`evaluate`'s keywords (e.g. ``match="timestamp"``, ``max_dt``).

    Returns:
        0 when at least one metric group was computed, 1 when none was, 2 on bad input
        (missing files, unreadable data, invalid arguments; the reason is logged as an error).
    """
    out_path = Path(out) if out else Path(pred) / "eval.json"
    try:
        report = evaluate(pred, gt, align=align, out=out_path, **options)
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as err:
        log.error("mapstream eval: %s", err)
        return 2
    table = format_table(report)
    (emit or (lambda text: log.info("\n%s", text)))(table)
    return 0 if any(s.metrics for s in report.scenes) else 1
