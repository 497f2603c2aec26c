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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..export.reconstruction import Reconstruction
from ..geometry import mat_to_quat, quat_to_mat
from ..globalmap import BackgroundMap, GlobalMap, MapConfig

__all__ = ["MapRun", "corrected_reconstruction", "known_poses_of", "read_known_poses", "stored_frames"]

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

    def __init__(self, model, config: MapConfig, *, on_map=None) -> None:
        """on_map(keyframe_poses, loops): called after every loop the map closes and once at
        the end, with each keyframe's corrected camera-to-world [3, 4] and the loop edges as
        (candidate, query) frame pairs (e.g. `LiveView.show_map`)."""
        if model is None:
            raise ValueError("loop closure runs the network on this machine (it measures loops on short clips): "
                             "it is not available when a server predicts the frames; leave out --loop-closure")
        self.config = config
        self.on_map = on_map
        loops = None if on_map is None else (lambda _check, poses: on_map(poses, self._loops()))
        self.background = BackgroundMap(model, config, on_loop=loops)
        self.started = time.perf_counter()

    def resume(self, recon: Reconstruction, scale_frames: np.ndarray | None = None) -> None:
        """Hand over the frames an earlier run finished (in order); `scale_frames` (bool, one
        a frame) marks those that were a window's scale frames, as the stream marked them."""
        for pred, image in stored_frames(recon, scale_frames):
            self.background.submit(pred, image)

    def take(self, pred, frame: torch.Tensor, index: int) -> None:
        self.background.submit(dataclasses.replace(pred, index=index) if pred.index != index else pred, frame)

    def _loops(self) -> list[tuple[int, int]]:
        return [(c.candidate, c.query) for c in self.background.loops]

    def finish(self) -> GlobalMap:
        gmap = self.background.finish()
        if self.on_map is not None:
            self.on_map(gmap.keyframe_poses(), self._loops())
        return gmap

    def close(self) -> None:
        self.background.close()


def stored_frames(recon: Reconstruction, scale_frames: np.ndarray | None = None) -> Iterator[tuple[_Finished, torch.Tensor]]:
    """The frames of a stored run as a global map takes them, in order: each prediction (with
    its scale-frame mark from `scale_frames`, bool one a frame; None: unmarked) and its image
    [3, H, W] in [0, 1]."""
    if scale_frames is not None and len(scale_frames) != len(recon):
        raise ValueError(f"{len(scale_frames)} scale-frame marks for {len(recon)} frames")
    for i in range(len(recon)):
        pred = _Finished(i, torch.from_numpy(np.asarray(recon.T_world_cam[i])), torch.from_numpy(np.asarray(recon.K[i])),
                         torch.from_numpy(np.asarray(recon.depth[i])), torch.from_numpy(np.asarray(recon.depth_conf[i])),
                         scale_frame=bool(scale_frames[i]) if scale_frames is not None else False)
        yield pred, torch.from_numpy(np.asarray(recon.images[i])).permute(2, 0, 1).float() / 255


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


def read_known_poses(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps [N] and camera-to-world poses [N, 4, 4] from a TUM trajectory
    (`timestamp tx ty tz qx qy qz qw` a line) or a benchmark traj.txt (`timestamp` and a
    row-major 3x4 camera-to-world); `#` starts a comment. ValueError names the line at fault."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--known-poses {path}: no such file (a TUM trajectory: timestamp tx ty tz qx qy qz qw)")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            values = [float(v) for v in line.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"{path}:{number}: not numbers: {line[:60]!r}") from None
        if len(values) not in (8, 13) or (rows and len(values) != len(rows[0])):
            raise ValueError(f"{path}:{number}: expected 8 values (TUM: timestamp tx ty tz qx qy qz qw) or 13 "
                             f"(timestamp and a 3x4 pose), got {len(values)}")
        rows.append(values)
    if not rows:
        raise ValueError(f"{path} holds no pose")
    data = np.asarray(rows, dtype=np.float64)
    if not np.isfinite(data).all():
        raise ValueError(f"{path} has non-finite values")
    poses = np.tile(np.eye(4), (len(data), 1, 1))
    if data.shape[1] == 8:
        quat = data[:, 4:8] / np.linalg.norm(data[:, 4:8], axis=1, keepdims=True)
        poses[:, :3, :3] = quat_to_mat(torch.from_numpy(quat)).numpy()
        poses[:, :3, 3] = data[:, 1:4]
    else:
        poses[:, :3] = data[:, 1:].reshape(-1, 3, 4)
    return data[:, 0], poses


def known_poses_of(recon: Reconstruction, path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The frames of `recon` with a known pose in `path`, matched by timestamp (nearest, within
    half the median interval between frames): frame index -> (known pose, the stream's)."""
    from ..eval.datasets import nearest_timestamps

    stamps, poses = read_known_poses(path)
    times = np.asarray(recon.timestamps, dtype=np.float64)
    spacing = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    known = {i: (poses[j], np.asarray(recon.T_world_cam[i], dtype=np.float64))
             for i, j in enumerate(nearest_timestamps(times, stamps, spacing / 2)) if j >= 0}
    if not known:
        raise ValueError(
            f"--known-poses {path}: none of its {len(stamps)} timestamps ({stamps[0]:.3f}..{stamps[-1]:.3f} s) is "
            f"within {spacing / 2:.3f} s of a frame's ({times[0]:.3f}..{times[-1]:.3f} s); give the poses the frames' "
            "own times (a video's, or the frame index / --fps for a folder)"
        )
    log.info("known poses: %d of the %d frames matched by timestamp", len(known), len(times))
    return known
