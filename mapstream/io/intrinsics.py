"""Known camera intrinsics: read from the forms users have them in, and carried through the
preprocessing onto the model's frames.

Every K here follows mapstream's pixel convention: pixel (u, v) is the integer index, so the
centre of the top-left pixel is (0, 0), as in OpenCV. COLMAP and nerfstudio put that centre
at (0.5, 0.5); their principal points are shifted by 0.5 on reading.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["KnownIntrinsics", "frame_intrinsics", "read_colmap_cameras", "read_intrinsics", "transforms_camera",
           "undistorted"]


@dataclass(frozen=True)
class KnownIntrinsics:
    """One camera's pinhole intrinsics in pixels of its images as they lie on disk."""

    K: np.ndarray  # [3, 3] float64, mapstream's pixel convention
    image_size: tuple[int, int] | None  # (width, height) the K is for; None: the input's own
    source: str  # where they came from, as run.json records it

    def for_size(self, width: int, height: int) -> np.ndarray:
        """K for images of `width` x `height`: this camera's K, scaled when it was given for
        another resolution of the same picture (a COLMAP model of downscaled images)."""
        if self.image_size is None or self.image_size == (width, height):
            return self.K.copy()
        w0, h0 = self.image_size
        if abs(w0 / h0 - width / height) > 0.01 * width / height:
            raise ValueError(
                f"the intrinsics from {self.source} are for {w0}x{h0} images, the input's are {width}x{height} "
                "(another aspect ratio, so not the same picture scaled): give the intrinsics of these images"
            )
        sx, sy = width / w0, height / h0
        scale = np.diag([sx, sy, 1.0])
        corner = _to_corner(self.K)
        return _from_corner(scale @ corner)


def undistorted(name: str, coeffs: Sequence[float]) -> None:
    """ValueError when a camera has lens distortion, which mapstream does not model."""
    if any(abs(float(c)) > 0 for c in coeffs):
        raise ValueError(f"{name}: distorted camera; undistort the images first (e.g. colmap image_undistorter)")


def read_colmap_cameras(path: Path) -> dict[str, tuple[np.ndarray, tuple[int, int]]]:
    """A COLMAP ``cameras.txt``: camera id -> (K, (height, width)). Pinhole models, or
    radial/OpenCV ones with zero distortion (binary models: ``colmap model_converter
    --output_type TXT``)."""
    cams = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        tok = line.split()
        if not tok or tok[0].startswith("#"):
            continue
        try:
            kind, w, h, p = tok[1], int(tok[2]), int(tok[3]), [float(x) for x in tok[4:]]
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{number}: expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS..., got {line[:60]!r}") \
                from None
        if kind in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL") and len(p) >= 3:
            fx = fy = p[0]
            cx, cy, rest = p[1], p[2], p[3:]
        elif kind in ("PINHOLE", "OPENCV", "FULL_OPENCV") and len(p) >= 4:
            fx, fy, cx, cy, rest = p[0], p[1], p[2], p[3], p[4:]
        else:
            raise ValueError(f"{path}:{number}: camera model {kind} with {len(p)} parameters is not supported "
                             "(pinhole, simple/radial or OpenCV models)")
        undistorted(f"{path} camera {tok[0]}", rest)
        cams[tok[0]] = (np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]]), (h, w))
    return cams


def transforms_camera(meta: dict, frame: dict, image_size: tuple[int, int] | None = None
                      ) -> tuple[np.ndarray, tuple[int, int]]:
    """One frame's camera in a nerfstudio / instant-ngp ``transforms.json``: (K, (height,
    width)). ``fl_x, fl_y, cx, cy, w, h`` per frame or at the top (``camera_angle_x`` when there
    is no focal length; ``cx, cy`` default to the centre); `image_size` (width, height) where
    the file gives no size."""
    def get(key, default=None):
        return frame.get(key, meta.get(key, default))

    w, h = get("w"), get("h")
    if w is None or h is None:
        if image_size is None:
            raise ValueError("transforms.json gives no image size (w, h)")
        w, h = image_size
    fx = get("fl_x")
    if fx is None:
        if get("camera_angle_x") is None:
            raise ValueError("transforms.json gives neither fl_x nor camera_angle_x")
        fx = 0.5 * w / math.tan(0.5 * get("camera_angle_x"))
    fy = get("fl_y", fx if get("camera_angle_y") is None else 0.5 * h / math.tan(0.5 * get("camera_angle_y")))
    undistorted("transforms.json", [get(k, 0.0) for k in ("k1", "k2", "k3", "k4", "p1", "p2")])
    cx, cy = get("cx", w / 2), get("cy", h / 2)
    return np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1.0]], dtype=np.float64), (int(h), int(w))


def read_intrinsics(spec: str) -> KnownIntrinsics:
    """`--intrinsics`: ``fx,fy,cx,cy`` (pixels of the input's images, OpenCV's convention), a
    COLMAP ``cameras.txt`` (or a model folder holding one: ``sparse/0``) or a nerfstudio /
    instant-ngp ``transforms.json``. One camera: a file with several different ones is refused."""
    text = str(spec).strip()
    parts = text.replace(" ", "").split(",")
    if len(parts) == 4 and not Path(text).exists():
        try:
            fx, fy, cx, cy = (float(v) for v in parts)
        except ValueError:
            raise ValueError(f"--intrinsics {text}: expected fx,fy,cx,cy in pixels, or a cameras.txt or "
                             "transforms.json file") from None
        K = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]])
        return _checked(KnownIntrinsics(K, None, f"fx,fy,cx,cy {fx:g},{fy:g},{cx:g},{cy:g}"))
    path = Path(text)
    if path.is_dir():
        found = next((d / name for d in (path / "sparse" / "0", path / "sparse", path)
                      for name in ("cameras.txt", "transforms.json") if (d / name).is_file()), None)
        if found is None:
            raise ValueError(f"--intrinsics {path}: the folder holds no cameras.txt or transforms.json")
        path = found
    if not path.is_file():
        raise ValueError(f"--intrinsics {text}: no such file, and not fx,fy,cx,cy (four numbers, commas between)")
    if path.suffix.lower() == ".json":
        try:
            meta = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"--intrinsics {path}: not JSON ({exc})") from None
        frames = meta.get("frames") or [{}]
        cameras = [transforms_camera(meta, f) for f in frames]
    else:
        cameras = list(read_colmap_cameras(path).values())
    distinct = {(tuple(np.round(K.ravel(), 6)), hw) for K, hw in cameras}
    if not cameras:
        raise ValueError(f"--intrinsics {path}: no camera in it")
    if len(distinct) > 1:
        raise ValueError(f"--intrinsics {path}: {len(distinct)} different cameras in it; mapstream takes one camera "
                         "for the whole input (give a file with that camera only)")
    K, (h, w) = cameras[0]
    return _checked(KnownIntrinsics(K, (w, h), str(path)))


def _checked(known: KnownIntrinsics) -> KnownIntrinsics:
    K = known.K
    if not np.isfinite(K).all() or K[0, 0] <= 0 or K[1, 1] <= 0:
        raise ValueError(f"intrinsics from {known.source}: focal lengths must be positive and finite")
    return known


def _to_corner(K: np.ndarray) -> np.ndarray:
    """K with pixel centres at +0.5 (continuous image coordinates), where resizing is a scale."""
    out = np.array(K, dtype=np.float64)
    out[..., :2, 2] += 0.5
    return out


def _from_corner(K: np.ndarray) -> np.ndarray:
    out = np.array(K, dtype=np.float64)
    out[..., :2, 2] -= 0.5
    return out


def frame_intrinsics(K: np.ndarray, pixel_map: np.ndarray) -> np.ndarray:
    """The intrinsics of a preprocessed frame: `K` [..., 3, 3] (of the image on disk) carried by
    `pixel_map` [3, 3], which maps the image's continuous pixel coordinates (pixel centres at
    +0.5) to the frame's (`FrameSource.pixel_map`). A quarter turn of the image turns the camera
    about its optical axis too, so the camera's axes turn with it and K stays upper triangular."""
    linear = pixel_map[:2, :2]
    turn = np.eye(3)
    turn[:2, :2] = linear / np.abs(linear).sum(axis=1, keepdims=True)  # the turn, without the scale
    return _from_corner(pixel_map @ _to_corner(K) @ turn.T)
