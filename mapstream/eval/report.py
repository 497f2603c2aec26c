"""What `mapstream eval` reports: each scene's metrics (`SceneReport`) and the whole
evaluation's (`EvalReport`), which `mapstream.eval.runner` fills and `mapstream.eval.table`
prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mapstream.eval.trajectory import PoseAUCResult

__all__ = ["EvalReport", "SceneReport"]


@dataclass
class SceneReport:
    """Results of one scene.

    Attributes:
        name: scene name.
        pred_dir, gt_dir: where the prediction and the ground truth were read.
        match: how frames were matched (``"name"``, ``"timestamp"`` or ``"index"``).
        num_frames: matched frames.
        metrics: ``{group: {metric: value, "align": ..., settings...}}`` (JSON-ready).
        errors: ``{group: message}`` for groups that could not be computed.
    """

    name: str
    pred_dir: str
    gt_dir: str
    match: str = ""
    num_frames: int = 0
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    auc: PoseAUCResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {
            "pred_dir": self.pred_dir, "gt_dir": self.gt_dir, "match": self.match,
            "num_frames": self.num_frames, "metrics": self.metrics, "errors": self.errors,
        }


@dataclass
class EvalReport:
    """All scenes plus the dataset-level aggregate (``{group: {metric: mean over scenes}}``)."""

    scenes: list[SceneReport]
    aggregate: dict[str, dict[str, Any]]
    settings: dict[str, Any]

    def to_dict(self) -> dict:
        return {
            "settings": self.settings,
            "scenes": {s.name: s.to_dict() for s in self.scenes},
            "aggregate": self.aggregate,
        }
