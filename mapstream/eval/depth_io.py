"""Reading and writing depth maps: float32 OpenEXR, ``.npy`` and 16-bit PNG.

* ``.exr``: one float32 channel in metres (the authors' benchmark format). Two backends, tried
  in this order:

  1. the ``OpenEXR`` Python bindings (PyPI ``openexr``, wheels with no system library): reads any
     channel layout (a single channel of any name, else ``Y``, ``Z``, ``depth``, ``R``);
  2. PyAV (``av``, already used for video input), whose FFmpeg EXR codec reads and writes float
     EXR losslessly but only understands a ``Y`` channel or full ``R``/``G``/``B`` sets; files
     with a single ``Z``/``depth``/``R`` channel need backend 1.

  Both write a single ``Y`` channel, ZIP-compressed (lossless), which every EXR reader accepts.
  (``imageio``'s EXR support does not work offline: it needs the FreeImage binary, downloaded at
  run time, and otherwise decodes EXR through FFmpeg to 8-bit RGB.)
* ``.npy``: a float32 ``[H, W]`` array in metres (lossless, no dependency).
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

from mapstream.io.atomic import atomic_path

__all__ = ["DEPTH_SUFFIXES", "exr_backend", "exr_available", "read_depth", "write_depth"]

log = logging.getLogger(__name__)

DEPTH_SUFFIXES: tuple[str, ...] = (".exr", ".npy", ".png")
_EXR_CHANNEL_PREFERENCE = ("Y", "Z", "depth", "R")
_NO_EXR = "no EXR backend: install the `openexr` package (pip install openexr) or PyAV (pip install av)"


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _openexr():
    return _module("OpenEXR")


def exr_backend() -> str | None:
    """``"openexr"``, ``"pyav"`` or ``None``: what reads and writes ``.exr`` here."""
    if _openexr() is not None:
        return "openexr"
    if _module("av") is not None:
        return "pyav"
    return None


def exr_available() -> bool:
    """True when ``.exr`` depth can be read and written (see :func:`exr_backend`)."""
    return exr_backend() is not None


def _read_exr(path: Path) -> np.ndarray:
    exr = _openexr()
    if exr is not None:
        with exr.File(str(path)) as f:
            channels = {name: np.asarray(ch.pixels) for name, ch in f.channels().items()}
        if not channels:
            raise ValueError(f"{path}: EXR file without channels")
        name = next((c for c in _EXR_CHANNEL_PREFERENCE if c in channels), sorted(channels)[0])
        data = channels[name]
        return data[..., 0] if data.ndim == 3 else data
    av = _module("av")
    if av is None:
        raise RuntimeError(f"cannot read {path}: {_NO_EXR}")
    try:
        with av.open(str(path)) as container:
            frame = next(container.decode(video=0))
            gray = frame.format.name.startswith("gray")
            data = frame.to_ndarray(format="grayf32le" if gray else "gbrpf32le")
    except (av.FFmpegError, StopIteration) as err:
        raise RuntimeError(
            f"cannot read {path} with PyAV/FFmpeg, which only supports EXR files with a Y channel or "
            f"R, G, B channels ({err}); install the `openexr` package (pip install openexr)"
        ) from err
    return data if gray else data[..., 0]


def _write_exr(path: Path, depth: np.ndarray) -> None:
    exr = _openexr()
    if exr is not None:
        header = {"compression": exr.ZIP_COMPRESSION, "type": exr.scanlineimage}
        with exr.File(header, {"Y": np.ascontiguousarray(depth)}) as f:
            f.write(str(path))
        return
    av = _module("av")
    if av is None:
        raise RuntimeError(f"cannot write {path}: {_NO_EXR}; or use .npy")
    codec = av.CodecContext.create("exr", "w")
    codec.width, codec.height = depth.shape[1], depth.shape[0]
    codec.pix_fmt = "grayf32le"
    codec.options = {"format": "float", "compression": "zip16"}
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(depth), format="grayf32le")
    packets = list(codec.encode(frame)) + list(codec.encode(None))
    path.write_bytes(b"".join(bytes(p) for p in packets))


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
        try:
            depth = np.load(path, allow_pickle=False)
        except (EOFError, ValueError) as exc:  # cut short, or holds objects
            raise ValueError(f"cannot read depth file {path}: {exc}") from None
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
        path: destination ``.exr`` (needs ``OpenEXR`` or PyAV), ``.npy`` or ``.png`` (16-bit).
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
    if suffix not in DEPTH_SUFFIXES:
        raise ValueError(f"unsupported depth file {path} (expected one of {DEPTH_SUFFIXES})")
    raw = None
    if suffix == ".png":
        raw = np.round(d.astype(np.float64) * png_scale)
        if raw.max(initial=0) > 65535:
            raise ValueError(f"depth {d.max():.3f} m does not fit a 16-bit PNG at scale {png_scale}")
    with atomic_path(path) as tmp:  # the temp file keeps the suffix, which picks the format
        if suffix == ".exr":
            _write_exr(tmp, d)
        elif suffix == ".npy":
            np.save(tmp, d)
        else:
            Image.fromarray(raw.astype(np.uint16)).save(tmp)
    return path
