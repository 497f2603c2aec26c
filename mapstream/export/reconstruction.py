"""The data contract between the run pipeline and the writers: :class:`Reconstruction`.

All arrays are numpy, N frames of H x W pixels:

==============  ================  ======================================================
field           shape / dtype     meaning
==============  ================  ======================================================
images          [N, H, W, 3] u8   the preprocessed RGB frames the model saw
depth           [N, H, W] f32     camera-space z (predicted scale); NaN/inf/<=0 = invalid
depth_conf      [N, H, W] f32     confidence (1 + exp(x) > 1 from the model; higher = better)
T_world_cam     [N, 3, 4] f32     camera-to-world ``[R | t]``, OpenCV camera axes
                                  (x right, y down, z forward): ``X_world = R X_cam + t``
K               [N, 3, 3] f32     pinhole intrinsics in pixels; pixel (u, v) = integer
                                  (column, row) index, principal point (W/2, H/2)
pose_enc        [N, 9] f32        the model's raw pose encoding (absT_quaR_FoV)
names           list[str]         frame file names (or ``frame_000123``)
keyframe        [N] bool          frames kept as keyframes by the streaming cache
timestamps      [N] f64           seconds; default ``index / fps`` (or ``index`` without fps)
sky_mask        [N, H, W] bool    optional, True = sky
==============  ================  ======================================================

``T_cam_world`` (world-to-camera, COLMAP's and the reference demo's "extrinsic") is derived.
``predictions.npz`` (:meth:`Reconstruction.save_npz`) holds exactly the keys of
:data:`NPZ_KEYS` (+ ``sky_mask`` when present).
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

from mapstream.io.atomic import atomic_open
from mapstream.geometry import POSE_ENCODING_DIM, invert_se3

logger = logging.getLogger(__name__)

__all__ = ["NPZ_KEYS", "Reconstruction"]

NPZ_KEYS: tuple[str, ...] = (
    "images", "depth", "depth_conf", "T_world_cam", "T_cam_world", "K",
    "pose_enc", "names", "keyframe", "image_hw", "timestamps",
)
"""Keys always present in ``predictions.npz``; ``sky_mask`` is added when the run has one."""


def _shape_str(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check(name: str, value: Any, expected: Sequence[int | None], dtype: np.dtype | type) -> np.ndarray:
    """``value`` as a C-contiguous array of ``dtype`` with shape ``expected`` (None = any size)."""
    array = np.asarray(value)
    if array.ndim != len(expected) or any(e is not None and e != s for e, s in zip(expected, array.shape)):
        wanted = _shape_str(["?" if e is None else e for e in expected])
        raise ValueError(f"Reconstruction.{name} must have shape {wanted}, got {_shape_str(array.shape)}")
    return np.ascontiguousarray(array, dtype=dtype)


@dataclass(eq=False)
class Reconstruction:
    """Per-frame outputs of a run (see the module docstring for shapes, units and axes).

    Inputs are validated and converted on construction: float arrays are cast to float32
    (timestamps to float64), ``depth`` / ``depth_conf`` may carry a trailing size-1 axis,
    ``T_world_cam`` may be ``[N, 4, 4]``. ``keyframe=None`` means no keyframe; ``timestamps=None``
    means ``arange(N) / fps`` (``arange(N)`` when ``fps`` is None). ``fps`` is not saved.

    Raises:
        ValueError: an array has the wrong shape, the frame counts or image sizes disagree,
            poses or intrinsics are not finite, or N is 0.
        TypeError: ``images`` is not uint8 or ``names`` is not a list of strings.
    """

    images: np.ndarray
    depth: np.ndarray
    depth_conf: np.ndarray
    T_world_cam: np.ndarray
    K: np.ndarray
    pose_enc: np.ndarray
    names: list[str]
    keyframe: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    sky_mask: np.ndarray | None = None
    fps: float | None = None

    def __post_init__(self) -> None:
        images = np.asarray(self.images)
        if images.dtype != np.uint8:
            raise TypeError(f"Reconstruction.images must be uint8 RGB [N, H, W, 3], got dtype {images.dtype}")
        self.images = _check("images", images, (None, None, None, 3), np.uint8)
        n, h, w = self.images.shape[:3]
        if n == 0:
            raise ValueError("Reconstruction holds no frame (N = 0)")
        if h == 0 or w == 0:
            raise ValueError(f"Reconstruction.images has an empty image size {h}x{w}")
        self.depth = _check("depth", _drop_channel(self.depth), (n, h, w), np.float32)
        self.depth_conf = _check("depth_conf", _drop_channel(self.depth_conf), (n, h, w), np.float32)
        pose = np.asarray(self.T_world_cam)
        if pose.ndim == 3 and pose.shape[1:] == (4, 4):
            pose = pose[:, :3]
        self.T_world_cam = _check("T_world_cam", pose, (n, 3, 4), np.float32)
        self.K = _check("K", self.K, (n, 3, 3), np.float32)
        self.pose_enc = _check("pose_enc", self.pose_enc, (n, POSE_ENCODING_DIM), np.float32)
        for name in ("T_world_cam", "K"):
            if not np.isfinite(getattr(self, name)).all():
                bad = np.flatnonzero(~np.isfinite(getattr(self, name)).reshape(n, -1).all(1))
                raise ValueError(f"Reconstruction.{name} has non-finite values (frames {bad[:10].tolist()})")
        if isinstance(self.names, (str, bytes)) or not all(isinstance(s, str) for s in self.names):
            raise TypeError("Reconstruction.names must be a list of str")
        self.names = list(self.names)
        if len(self.names) != n:
            raise ValueError(f"Reconstruction.names has {len(self.names)} entries for {n} frames")
        keyframe = np.zeros(n, bool) if self.keyframe is None else self.keyframe
        self.keyframe = _check("keyframe", keyframe, (n,), np.bool_)
        if self.timestamps is None:
            self.timestamps = np.arange(n, dtype=np.float64) / (self.fps if self.fps else 1.0)
        self.timestamps = _check("timestamps", self.timestamps, (n,), np.float64)
        if self.sky_mask is not None:
            self.sky_mask = _check("sky_mask", _drop_channel(self.sky_mask), (n, h, w), np.bool_)

    # -- derived ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def image_hw(self) -> tuple[int, int]:
        """``(H, W)`` in pixels."""
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def T_cam_world(self) -> np.ndarray:
        """World-to-camera ``[N, 3, 4]`` float32, the inverse of ``T_world_cam`` (computed in float64)."""
        inverse = invert_se3(torch.from_numpy(self.T_world_cam.astype(np.float64)))
        return inverse.numpy().astype(np.float32)

    def file_stems(self) -> list[str]:
        """One file-system- and COLMAP-safe, unique stem per frame, derived from ``names``.

        ``"clip/img 01.jpg" -> "img_01"``: the directory and extension are dropped, characters
        other than letters, digits, ``.``, ``_``, ``-`` become ``_``, and a name that repeats
        (case-insensitively) gets ``_<index>`` appended. Writers use it for per-frame files.
        """
        stems: list[str] = []
        seen: set[str] = set()
        for index, name in enumerate(self.names):
            stem = re.sub(r"[^A-Za-z0-9._-]+", "_", PurePath(name).stem).lstrip(".") or f"frame_{index:06d}"
            candidate = stem
            while candidate.lower() in seen:
                candidate = f"{stem}_{index:06d}" if candidate == stem else f"{candidate}_"
            seen.add(candidate.lower())
            stems.append(candidate)
        return stems

    # -- selection ----------------------------------------------------------------------------
    def select(self, index: Sequence[int] | np.ndarray | slice) -> Reconstruction:
        """A new Reconstruction with the frames ``index`` (indices, boolean mask or slice)."""
        order = np.arange(len(self))[index]
        order = np.atleast_1d(order)
        per_frame = {
            f.name: getattr(self, f.name)[order]
            for f in fields(self)
            if f.name not in ("names", "fps") and getattr(self, f.name) is not None
        }
        return Reconstruction(**per_frame, names=[self.names[i] for i in order], fps=self.fps)

    @classmethod
    def concat(cls, parts: Sequence[Reconstruction]) -> Reconstruction:
        """Frames of ``parts`` one after the other (e.g. a resumed run appended to the saved one).

        A sky mask is kept only if every part has one.
        """
        if not parts:
            raise ValueError("Reconstruction.concat needs at least one part")
        arrays = {
            f.name: np.concatenate([getattr(p, f.name) for p in parts])
            for f in fields(cls)
            if f.name not in ("names", "fps", "sky_mask")
        }
        has_sky = all(p.sky_mask is not None for p in parts)
        sky = np.concatenate([p.sky_mask for p in parts]) if has_sky else None
        names = [name for p in parts for name in p.names]
        return cls(**arrays, names=names, sky_mask=sky, fps=parts[0].fps)

    # -- predictions.npz ----------------------------------------------------------------------
    def to_npz_dict(self) -> dict[str, np.ndarray]:
        """The arrays of ``predictions.npz`` (names as a unicode array, image_hw as int64 [2])."""
        arrays = {
            "images": self.images,
            "depth": self.depth,
            "depth_conf": self.depth_conf,
            "T_world_cam": self.T_world_cam,
            "T_cam_world": self.T_cam_world,
            "K": self.K,
            "pose_enc": self.pose_enc,
            "names": np.array(self.names, dtype=np.str_),
            "keyframe": self.keyframe,
            "image_hw": np.array(self.image_hw, dtype=np.int64),
            "timestamps": self.timestamps,
        }
        if self.sky_mask is not None:
            arrays["sky_mask"] = self.sky_mask
        return arrays

    def save_npz(self, path: str | os.PathLike[str], *, compress: bool = False) -> Path:
        """Write ``predictions.npz`` atomically (keys :data:`NPZ_KEYS` + ``sky_mask`` if any).

        Readable with ``np.load(path)`` (no pickle). ``compress`` uses zip deflate (smaller, slower).
        """
        save = np.savez_compressed if compress else np.savez
        with atomic_open(path, "wb") as handle:
            save(handle, **self.to_npz_dict())
        logger.info("wrote %s (%d frames)", path, len(self))
        return Path(path)

    @classmethod
    def load_npz(cls, path: str | os.PathLike[str]) -> Reconstruction:
        """Read a ``predictions.npz`` written by :meth:`save_npz` (``T_cam_world`` is re-derived)."""
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in NPZ_KEYS if k not in data.files]
            if missing:
                raise ValueError(f"{path} is not a mapstream predictions file: missing keys {missing}")
            recon = cls(
                images=data["images"],
                depth=data["depth"],
                depth_conf=data["depth_conf"],
                T_world_cam=data["T_world_cam"],
                K=data["K"],
                pose_enc=data["pose_enc"],
                names=[str(s) for s in data["names"]],
                keyframe=data["keyframe"],
                timestamps=data["timestamps"],
                sky_mask=data["sky_mask"] if "sky_mask" in data.files else None,
            )
            if tuple(data["image_hw"].tolist()) != recon.image_hw:
                raise ValueError(f"{path}: image_hw {data['image_hw'].tolist()} disagrees with images {recon.image_hw}")
        return recon


def _drop_channel(array: Any) -> np.ndarray:
    """``[N, H, W, 1] -> [N, H, W]``; other shapes unchanged."""
    array = np.asarray(array)
    return array[..., 0] if array.ndim == 4 and array.shape[-1] == 1 else array
