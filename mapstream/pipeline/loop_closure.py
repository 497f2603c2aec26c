"""A run's global map (`mapstream run --loop-closure`): the finished frames handed to a
`BackgroundMap` as they are stored, and the map's corrections applied to every frame before
the exporters write them.

The frame store keeps the stream's own predictions (so an interrupted run resumes as
without loop closure); the map is built beside the stream, from every finished frame (on a
resume, the frames an earlier run finished are handed over first), and corrected poses and
depth are what every format receives.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from ..export.reconstruction import Reconstruction
from ..geometry import mat_to_quat
from ..globalmap import BackgroundMap, GlobalMap, MapConfig

__all__ = ["MapRun", "corrected_reconstruction"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Finished:
    """A frame an earlier run finished, as the map reads a prediction."""

    index: int
    T_world_cam: torch.Tensor
    K: torch.Tensor
    depth: torch.Tensor
    depth_conf: torch.Tensor
    scale_frame: bool = False


class MapRun:
    """The map of one run: `take` is the run's per-frame callback, `finish` the map."""

    def __init__(self, model, config: MapConfig, *, on_loop=None) -> None:
        if model is None:
            raise ValueError("loop closure runs the network on this machine (it measures loops on short clips): "
                             "it is not available when a server predicts the frames; leave out --loop-closure")
        self.config = config
        self.background = BackgroundMap(model, config, on_loop=on_loop)
        self.started = time.perf_counter()

    def resume(self, recon: Reconstruction) -> None:
        """Hand over the frames an earlier run finished (in order)."""
        for i in range(len(recon)):
            pred = _Finished(i, torch.from_numpy(np.asarray(recon.T_world_cam[i])), torch.from_numpy(np.asarray(recon.K[i])),
                             torch.from_numpy(np.asarray(recon.depth[i])), torch.from_numpy(np.asarray(recon.depth_conf[i])))
            image = torch.from_numpy(np.asarray(recon.images[i])).permute(2, 0, 1).float() / 255
            self.background.submit(pred, image)

    def take(self, pred, frame: torch.Tensor, index: int) -> None:
        self.background.submit(dataclasses.replace(pred, index=index) if pred.index != index else pred, frame)

    def finish(self) -> GlobalMap:
        return self.background.finish()

    def close(self) -> None:
        self.background.close()


def corrected_reconstruction(recon: Reconstruction, gmap: GlobalMap) -> Reconstruction:
    """`recon` with every frame's pose and depth moved by the map's correction (poses, pose
    encodings and depth maps change; the arrays are modified in place where they are
    writable, as the run's assembled copies are)."""
    T = np.array(recon.T_world_cam, dtype=np.float64)
    pose_enc = np.array(recon.pose_enc, dtype=np.float32)
    depth = recon.depth if getattr(recon.depth, "flags", None) is not None and recon.depth.flags.writeable \
        else np.array(recon.depth)
    for i in range(len(recon)):
        T[i], scale = gmap.correct_pose(i, T[i])
        if scale != 1.0:
            depth[i] *= np.float32(scale)
    pose_enc[:, :3] = T[:, :, 3]
    pose_enc[:, 3:7] = mat_to_quat(torch.from_numpy(T[:, :, :3])).numpy()
    return dataclasses.replace(recon, T_world_cam=T.astype(np.float32), pose_enc=pose_enc, depth=depth)
