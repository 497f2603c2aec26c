"""Evaluation: trajectory, pose-AUC, depth and point-cloud metrics, dataset readers, the runner.

* :mod:`mapstream.eval.trajectory` — ATE / RPE (equal to evo's) and pairwise pose AUC;
* :mod:`mapstream.eval.depth` — abs-rel ... delta_3 with scale / scale-and-shift alignment;
* :mod:`mapstream.eval.pointcloud` — accuracy / completeness / Chamfer / F1, voxel grid, ICP;
* :mod:`mapstream.eval.datasets` — TUM RGB-D and the authors' benchmark layout;
* :mod:`mapstream.eval.predictions` — the ``mapstream run`` output contract;
* :mod:`mapstream.eval.input_geometry` — ground-truth depth through the run's preprocessing;
* :mod:`mapstream.eval.matching` — pairing run frames with ground-truth frames;
* :mod:`mapstream.eval.runner` — :func:`evaluate`, :func:`eval_main`;
* :mod:`mapstream.eval.table` — :func:`format_table`, the printed table.

Alignment (Umeyama SE(3) / Sim(3)) lives in :mod:`mapstream.geometry.align`. See docs/EVALUATION.md.
"""
from mapstream.eval.datasets import (
    GroundTruthSequence,
    find_scenes,
    read_benchmark_scene,
    read_sequence,
    read_tum_sequence,
    write_benchmark_scene,
)
from mapstream.eval.depth import DepthMetrics, depth_metrics
from mapstream.eval.pointcloud import ICPResult, PointCloudMetrics, icp, pointcloud_metrics, voxel_downsample
from mapstream.eval.predictions import Predictions, read_predictions, write_predictions
from mapstream.eval.runner import EvalReport, SceneReport, eval_main, evaluate, format_table, match_frames
from mapstream.eval.trajectory import (
    ATEResult,
    ErrorStats,
    PoseAUCResult,
    RPEResult,
    aggregate_auc,
    ate,
    pose_auc,
    rpe,
)

__all__ = [
    "ATEResult",
    "DepthMetrics",
    "ErrorStats",
    "EvalReport",
    "GroundTruthSequence",
    "ICPResult",
    "PointCloudMetrics",
    "PoseAUCResult",
    "Predictions",
    "RPEResult",
    "SceneReport",
    "aggregate_auc",
    "ate",
    "depth_metrics",
    "eval_main",
    "evaluate",
    "find_scenes",
    "format_table",
    "icp",
    "match_frames",
    "pointcloud_metrics",
    "pose_auc",
    "read_benchmark_scene",
    "read_predictions",
    "read_sequence",
    "read_tum_sequence",
    "rpe",
    "voxel_downsample",
    "write_benchmark_scene",
    "write_predictions",
]
