"""`mapstream convert` and `mapstream eval`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import tyro


@dataclass
class Convert:
    """Write a .safetensors copy of a checkpoint (.pt file, folder or hub repo id)."""

    src: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="CKPT")]
    """Checkpoint to convert: a .pt file, a folder holding one, or a hub repo id."""
    dst: Annotated[Optional[str], tyro.conf.arg(metavar="PATH")] = None
    """Output path (default: beside a CKPT file with the suffix .safetensors; inside a CKPT folder; for a hub id, in the working folder)."""
    trust_pickle: bool = False
    """Allow .pt files that pickle Python objects besides tensors (only from a trusted source)."""

    def main(self) -> int:
        from ..checkpoint import convert_checkpoint, default_converted_path

        path = convert_checkpoint(self.src, self.dst or default_converted_path(self.src), trust_pickle=self.trust_pickle)
        print(f"wrote {path}")
        return 0


@dataclass
class Eval:
    """Score a run (or a folder of runs) against ground truth: TUM RGB-D or the benchmark
    layout (traj.txt, intrinsics.txt, depth). Prints a table and writes JSON."""

    pred: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="RUN")]
    """Run folder written by `mapstream run` (or a folder of per-scene runs)."""
    gt: Annotated[str, tyro.conf.arg(metavar="FOLDER")]
    """Ground-truth scene or dataset folder."""
    out: Annotated[Optional[str], tyro.conf.arg(metavar="PATH")] = None
    """JSON path (default: RUN/eval.json)."""
    align: Literal["none", "se3", "sim3"] = "sim3"
    """Trajectory alignment before ATE/RPE (recorded next to every number)."""
    match: Literal["auto", "name", "timestamp", "index"] = "auto"
    """How frames are paired: by file name, by timestamp (the run's own times, or its names read as seconds where those pair more; the nearest run frame per ground-truth frame, so a run denser than its ground truth is evaluated on the paired frames), by position (equal counts), or auto (the first that pairs every frame)."""
    max_dt: float = 0.02
    """Timestamp pairing tolerance in seconds (also used to pair TUM depth maps and poses)."""
    points_align: Literal["poses", "trajectory"] = "poses"
    """How the predicted point cloud is placed on the ground truth's: by the cameras' poses (the rotation from their orientations, scale and translation from their centres; a short or straight path's centres alone leave the rotation about it loose) or by the trajectory's alignment (the centres alone, as ATE)."""

    def main(self) -> int:
        from ..eval.runner import eval_main

        return eval_main(self.pred, self.gt, self.out, self.align, emit=print, match=self.match, max_dt=self.max_dt,
                         points_align=self.points_align)
