"""Reading and writing depth maps: float32 OpenEXR, ``.npy`` and 16-bit PNG.

* ``.exr``: one float32 channel in metres (the authors' benchmark format). Written with the
  ``OpenEXR`` Python bindings (PyPI ``openexr``, wheels, no system library needed) as a single
  ``Y`` channel, ZIP-compressed (lossless). Read with ``OpenEXR`` too, or else through
  ``imageio`` if one of its EXR plugins works on this machine (imageio's own EXR support needs
  the FreeImage binary, which it downloads at run time, so it usually does not work offline).
* ``.npy``: a float32 ``[H, W]`` array in metres (lossless fallback when ``OpenEXR`` is missing).
* ``.png``: 16-bit unsigned integers, ``depth = value / scale`` (``scale = 1000``: millimetres,
  the fallback here; ``5000`` for TUM RGB-D); 0 = invalid.

Invalid depth is 0 (or non-finite) everywhere.
"""
from __future__ import annotations

import importlib
import logging
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["DEPTH_SUFFIXES", "exr_available", "read_depth", "write_depth"]

log = logging.getLogger(__name__)

DEPTH_SUFFIXES: tuple[str, ...] = (".exr", ".npy", ".png")
_EXR_CHANNEL_PREFERENCE = ("Y", "Z", "depth", "R")


def _openexr():
    try:
        return importlib.import_module("OpenEXR")
    except ImportError:
        return None


def exr_available() -> bool:
    """True when ``.exr`` depth can be written (the ``OpenEXR`` bindings are importable)."""
    return _openexr() is not None


def _read_exr(path: Path) -> np.ndarray:
    exr = _openexr()
    if exr is not None:
        with exr.File(str(path)) as f:
            channels = {name: np.asarray(ch.pixels) for name, ch in f.channels().items()}
        if not channels:
            raise ValueError(f"{path}: EXR file without channels")
        name = next((c for c in _EXR_CHANNEL_PREFERENCE if c in channels), None)
        if name is None:
            name = sorted(channels)[0]
        data = channels[name]
        return data[..., 0] if data.ndim == 3 else data
    try:
        import imageio.v3 as iio

        data = np.asarray(iio.imread(path))
    except Exception as err:  # imageio raises many kinds of errors for a missing plugin
        raise RuntimeError(
            f"cannot read {path}: no working EXR reader (install the `openexr` package: "
            f"pip install openexr); imageio said: {err}"
        ) from err
    return data[..., 0] if data.ndim == 3 else data


def read_depth(path: str | Path, *, png_scale: float = 1000.0) -> np.ndarray:
    """Read a depth map in metres.

    Args:
        path: ``.exr``, ``.npy`` or ``.png`` file.
        png_scale: raw 16-bit PNG value per metre (1000: millimetres; TUM RGB-D: 5000).

    Returns:
        ``[H, W]`` float32 depth in metres; invalid pixels are 0 or non-finite.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise FileNotFoundError(f"depth file not found: {path}")
    if suffix == ".exr":
        depth = _read_exr(path)
    elif suffix == ".npy":
        depth = np.load(path, allow_pickle=False)
    elif suffix == ".png":
        with Image.open(path) as im:
            raw = np.asarray(im)
        if raw.ndim != 2:
            raise ValueError(f"{path}: a PNG depth map must have one channel, got shape {raw.shape}")
        depth = raw.astype(np.float64) / png_scale
    else:
        raise ValueError(f"unsupported depth file {path} (expected one of {DEPTH_SUFFIXES})")
    depth = np.asarray(depth, dtype=np.float32)
    if depth.ndim != 2:
        raise ValueError(f"{path}: depth must be [H, W], got shape {depth.shape}")
    return depth


def write_depth(path: str | Path, depth: np.ndarray, *, png_scale: float = 1000.0) -> Path:
    """Write a depth map in metres; the format follows ``path``'s suffix.

    Args:
        path: destination ``.exr`` (needs ``OpenEXR``), ``.npy`` or ``.png`` (16-bit).
        depth: ``[H, W]`` depth in metres; non-finite or <= 0 means invalid (stored as 0).
        png_scale: raw PNG value per metre; values beyond 65535 raise ``ValueError``.

    Returns:
        ``path`` as a ``Path``.
    """
    path = Path(path)
    d = np.asarray(depth, dtype=np.float32)
    if d.ndim != 2:
        raise ValueError(f"depth must be [H, W], got shape {d.shape}")
    d = np.where(np.isfinite(d) & (d > 0), d, np.float32(0))
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".exr":
        exr = _openexr()
        if exr is None:
            raise RuntimeError("writing .exr needs the `openexr` package (pip install openexr); use .npy instead")
        header = {"compression": exr.ZIP_COMPRESSION, "type": exr.scanlineimage}
        with exr.File(header, {"Y": np.ascontiguousarray(d)}) as f:
            f.write(str(path))
    elif suffix == ".npy":
        np.save(path, d)
    elif suffix == ".png":
        raw = np.round(d.astype(np.float64) * png_scale)
        if raw.max(initial=0) > 65535:
            raise ValueError(f"depth {d.max():.3f} m does not fit a 16-bit PNG at scale {png_scale}")
        Image.fromarray(raw.astype(np.uint16)).save(path)
    else:
        raise ValueError(f"unsupported depth file {path} (expected one of {DEPTH_SUFFIXES})")
    return path
