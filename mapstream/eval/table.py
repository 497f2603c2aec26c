"""The plain-text table of an evaluation report (what `mapstream eval` prints)."""
from __future__ import annotations

import math
from typing import Any

from mapstream.eval.depth import DEPTH_METRIC_NAMES
from mapstream.eval.report import EvalReport
from mapstream.eval.trajectory import AUC_THRESHOLDS

__all__ = ["AGGREGATED", "format_table"]

AGGREGATED: dict[str, tuple[str, ...]] = {
    "trajectory": ("ate", "ate_mean", "ate_median", "ate_max", "rpe_trans", "rpe_trans_mean", "rpe_rot_deg",
                   "rpe_rot_deg_mean"),
    "depth": DEPTH_METRIC_NAMES,
    "points": ("accuracy", "completeness", "chamfer", "precision", "recall", "f1"),
}
"""The metrics of each group that a dataset report averages over its scenes."""


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{100 * v:.2f}" if pct else f"{v:.4f}"


def format_table(report: EvalReport) -> str:
    """A plain-text table of the report: one section per metric group, a row per scene, then
    (several scenes) the mean over scenes, and for pose AUC the macro ("mean") and micro rows."""
    rows = [(s.name, s.metrics) for s in report.scenes]
    if len(report.scenes) > 1:
        agg = report.aggregate
        mean = {g: agg[g] for g in AGGREGATED if g in agg}
        if "pose_auc_macro" in agg:
            mean["pose_auc"] = agg["pose_auc_macro"]
        rows.append(("mean", mean))
        if "pose_auc_micro" in agg:
            rows.append(("micro", {"pose_auc": agg["pose_auc_micro"]}))
    thresholds = report.settings.get("auc_thresholds", list(AUC_THRESHOLDS))
    sections = [
        ("trajectory", "Trajectory", [("ATE", "ate", False), ("RPE-t", "rpe_trans", False),
                                      ("RPE-r(deg)", "rpe_rot_deg", False)]),
        ("pose_auc", "Pose AUC (%)", [(f"AUC@{t}", f"auc@{t}", True) for t in thresholds]),
        ("depth", "Depth", [(k, k, False) for k in DEPTH_METRIC_NAMES]),
        ("points", "Points", [("acc", "accuracy", False), ("comp", "completeness", False),
                              ("chamfer", "chamfer", False), ("P(%)", "precision", True),
                              ("R(%)", "recall", True), ("F1(%)", "f1", True)]),
    ]
    width = max([5] + [len(n) for n, _ in rows])
    lines = []
    for group, title, cols in sections:
        present = [(n, m[group]) for n, m in rows if group in m]
        if not present:
            continue
        first = present[0][1]
        extra = f", threshold {first['threshold']:g}" if group == "points" else ""
        lines.append(f"{title} [align: {first['align']}{extra}]")
        lines.append(f"{'scene':<{width}}  " + "  ".join(f"{c[0]:>10}" for c in cols))
        for name, g in present:
            lines.append(f"{name:<{width}}  " + "  ".join(f"{_fmt(g.get(k), pct):>10}" for _, k, pct in cols))
        lines.append("")
    for s in report.scenes:
        for group, msg in s.errors.items():
            lines.append(f"{s.name}: {group} not computed: {msg}")
    return "\n".join(lines).rstrip() + "\n"
