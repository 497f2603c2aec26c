"""Predictions of a ``mapstream run``: reading (and, for oracles and tests, writing) the run folder.

Contract: the run folder holds ``predictions.npz`` with

==============  =============  =====================================================
``T_world_cam``  ``[N, 3, 4]``  camera-to-world, OpenCV axes, in the model's units
``T_cam_world``  ``[N, 3, 4]``  its inverse
``K``            ``[N, 3, 3]``  intrinsics in pixels of ``image_hw``
``depth``        ``[N, H, W]``  camera-space z, the model's units
``depth_conf``   ``[N, H, W]``  confidence (> 1)
``names``        ``[N]``        frame names (strings: file names or stems)
``image_hw``     ``[2]``        ``(H, W)`` of the model input
``timestamps``   ``[N]``        optional, seconds (a run's default is ``index / fps``)
==============  =============  =====================================================

(the exporter's ``Reconstruction.save_npz`` writes these plus ``images``, ``pose_enc``,
``keyframe``, which evaluation does not need)

and ``trajectory_tum.txt`` (TUM format, ``timestamp tx ty tz qx qy qz qw`` per frame; not read
here: evaluation uses the npz).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from mapstream.io.atomic import atomic_open, atomic_write_text
from mapstream.geometry.align import as_float64, as_pose4

__all__ = ["Predictions", "PREDICTIONS_FILE", "read_predictions", "write_predictions"]

PREDICTIONS_FILE = "predictions.npz"


@dataclass
class Predictions:
    """One run's per-frame outputs (float64 poses; depth kept as stored).

    Attributes:
        run_dir: the run folder.
        names: ``[N]`` frame names as written by the run.
        T_world_cam: ``[N, 4, 4]`` float64 camera-to-world.
        K: ``[N, 3, 3]`` float64, pixels of ``image_hw``.
        depth: ``[N, H, W]`` float32 or ``None``.
        depth_conf: ``[N, H, W]`` or ``None``.
        image_hw: ``(H, W)``.
        timestamps: ``[N]`` float64 seconds, or ``None``.
    """

    run_dir: Path
    names: list[str]
    T_world_cam: np.ndarray
    K: np.ndarray
    depth: np.ndarray | None = field(default=None, repr=False)
    depth_conf: np.ndarray | None = field(default=None, repr=False)
    image_hw: tuple[int, int] = (0, 0)
    timestamps: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    def subset(self, indices: Sequence[int]) -> "Predictions":
        idx = np.asarray(indices, dtype=np.int64)
        return replace(
            self,
            names=[self.names[i] for i in idx],
            T_world_cam=self.T_world_cam[idx],
            K=self.K[idx],
            depth=None if self.depth is None else self.depth[idx],
            depth_conf=None if self.depth_conf is None else self.depth_conf[idx],
            timestamps=None if self.timestamps is None else self.timestamps[idx],
        )


def read_predictions(path: str | Path) -> Predictions:
    """Read a run folder (or its ``predictions.npz`` directly).

    ``T_world_cam`` is required unless ``T_cam_world`` is present (then it is inverted);
    ``K`` and ``names`` are required; ``depth`` / ``depth_conf`` are optional.

    Raises:
        FileNotFoundError: no ``predictions.npz``.
        ValueError: missing keys or inconsistent shapes.
    """
    path = Path(path)
    npz_path = path / PREDICTIONS_FILE if path.is_dir() else path
    if not npz_path.is_file():
        raise FileNotFoundError(f"no {PREDICTIONS_FILE} in {path} (is it a `mapstream run` output folder?)")
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # cut short, or not ours
        raise ValueError(f"{npz_path} is damaged or not a predictions file ({type(exc).__name__}: {exc}); "
                         "write it again with `mapstream run`") from None
    for key in ("K", "names"):
        if key not in data:
            raise ValueError(f"{npz_path}: missing array {key!r} (has {sorted(data)})")
    if "T_world_cam" in data:
        T = as_pose4(data["T_world_cam"], "T_world_cam")
    elif "T_cam_world" in data:
        T = np.linalg.inv(as_pose4(data["T_cam_world"], "T_cam_world"))
    else:
        raise ValueError(f"{npz_path}: neither T_world_cam nor T_cam_world (has {sorted(data)})")
    names = [str(n) for n in np.asarray(data["names"]).reshape(-1)]
    K = as_float64(data["K"], "K")
    n = len(names)
    if T.shape != (n, 4, 4) or K.shape != (n, 3, 3):
        raise ValueError(f"{npz_path}: {n} names but T_world_cam {list(T.shape)} and K {list(K.shape)}")
    depth = data.get("depth")
    if depth is not None and (depth.ndim != 3 or len(depth) != n):
        raise ValueError(f"{npz_path}: depth must be [N={n}, H, W], got {list(depth.shape)}")
    if "image_hw" in data:
        hw = tuple(int(v) for v in np.asarray(data["image_hw"]).reshape(-1)[:2])
    elif depth is not None:
        hw = tuple(depth.shape[1:])
    else:
        raise ValueError(f"{npz_path}: no image_hw and no depth to take the size from")
    timestamps = None
    if "timestamps" in data:
        timestamps = as_float64(data["timestamps"], "timestamps").reshape(-1)
        if len(timestamps) != n:
            raise ValueError(f"{npz_path}: {len(timestamps)} timestamps for {n} frames")
    return Predictions(
        run_dir=npz_path.parent,
        names=names,
        T_world_cam=T,
        K=K,
        depth=None if depth is None else depth.astype(np.float32, copy=False),
        depth_conf=data.get("depth_conf"),
        image_hw=(hw[0], hw[1]),
        timestamps=timestamps,
    )


def write_predictions(
    run_dir: str | Path,
    *,
    names: Sequence[str],
    T_world_cam: np.ndarray,
    K: np.ndarray,
    depth: np.ndarray,
    depth_conf: np.ndarray | None = None,
) -> Path:
    """Write a run folder following the contract above (for oracle runs and tests).

    Args:
        run_dir: destination folder (created).
        names: ``[N]`` frame names.
        T_world_cam: ``[N, 3|4, 4]`` camera-to-world.
        K: ``[N, 3, 3]``.
        depth: ``[N, H, W]``.
        depth_conf: ``[N, H, W]`` (default: all 2.0).

    Returns:
        The path of ``predictions.npz``.
    """
    from scipy.spatial.transform import Rotation

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    T = as_pose4(T_world_cam, "T_world_cam")
    depth = np.asarray(depth, dtype=np.float32)
    if depth_conf is None:
        depth_conf = np.full_like(depth, 2.0)
    path = run_dir / PREDICTIONS_FILE
    with atomic_open(path, "wb") as handle:  # a file object: savez adds no second suffix
        np.savez(
            handle,
            T_world_cam=T[:, :3].astype(np.float32),
            T_cam_world=np.linalg.inv(T)[:, :3].astype(np.float32),
            K=np.asarray(K, dtype=np.float32),
            depth=depth,
            depth_conf=np.asarray(depth_conf, dtype=np.float32),
            names=np.asarray([str(n) for n in names]),
            image_hw=np.asarray(depth.shape[1:], dtype=np.int64),
        )
    q = Rotation.from_matrix(T[:, :3, :3]).as_quat()  # (x, y, z, w)
    lines = [  # frame index as the timestamp
        f"{i} " + " ".join(f"{v:.9g}" for v in (*t, *qq)) for i, (t, qq) in enumerate(zip(T[:, :3, 3], q))
    ]
    atomic_write_text(run_dir / "trajectory_tum.txt", "\n".join(lines) + "\n")
    return path
