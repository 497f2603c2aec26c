"""Ground-truth depth carried through the geometry of a run's preprocessing.

A run's model sees each photo turned (``rotate``), resized to :func:`mapstream.io.images.resized_shape`
(a stretch: both sides are rounded on their own), then cut to ``image_size`` rows (``crop``) or
letterboxed into an ``image_size`` square (``pad``), then padded or cut to the run's common frame
height. Its depth maps are pixel for pixel in that frame, so the ground truth is mapped through
the same steps: each prediction pixel takes the ground-truth pixel under its centre (nearest, so
no depth is blended across an edge), and a pixel of the padding takes NaN, which the metrics
leave out.

The steps are read from the run folder's ``run.json`` (``config``: ``preprocess``,
``image_size``, ``rotate``). A prediction without that record (an oracle, another tool) is taken
as an aspect-keeping resize that covers the frame, centre-cropped (``"cover"``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mapstream.config import DEFAULT_IMAGE_SIZE
from mapstream.io.images import preprocess_pixel_map, resized_shape

__all__ = ["InputGeometry", "read_input_geometry", "depth_in_model_frame"]

log = logging.getLogger(__name__)

_PATCH = 14  # the model's patch size: resized sides are rounded to multiples of it


@dataclass(frozen=True)
class InputGeometry:
    """How a run turned a photo into the model's frame.

    Attributes:
        mode: ``"crop"`` or ``"pad"`` (the run's ``--preprocess``), or ``"cover"`` when the run
            left no record.
        image_size: the run's ``--image-size`` (unused for ``"cover"``).
        rotate: degrees clockwise the photos were turned first (0, 90, 180, 270).
        patch_size: the model's patch size.
    """

    mode: str
    image_size: int = DEFAULT_IMAGE_SIZE
    rotate: int = 0
    patch_size: int = _PATCH

    def describe(self) -> str:
        if self.mode == "cover":
            return "nearest resize + centre crop (no run.json: the run's preprocessing is assumed)"
        turned = f", turned {self.rotate} deg" if self.rotate else ""
        return f"nearest, as the run's {self.mode} preprocessing at {self.image_size}{turned}"


def read_input_geometry(run_dir: str | Path) -> InputGeometry:
    """The preprocessing a run folder's ``run.json`` records (``"cover"`` when it records none).

    Raises:
        ValueError: run.json records preprocessing settings this module cannot follow.
    """
    path = Path(run_dir) / "run.json"
    try:
        config = json.loads(path.read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return InputGeometry("cover")
    if not isinstance(config, dict) or "preprocess" not in config:
        return InputGeometry("cover")
    mode, size, rotate = config.get("preprocess"), config.get("image_size"), config.get("rotate", 0) or 0
    if mode not in ("crop", "pad") or not isinstance(size, int) or size < _PATCH or rotate not in (0, 90, 180, 270):
        raise ValueError(
            f"{path} records preprocess={mode!r}, image_size={size!r}, rotate={rotate!r}; evaluation follows "
            "crop/pad at a positive image size turned by 0/90/180/270 degrees: write the run again with `mapstream run`"
        )
    return InputGeometry(mode, size, rotate)


def _placement(geometry: InputGeometry, image_wh: tuple[int, int], frame_hw: tuple[int, int]):
    """``(resized_w, resized_h, top, left)``: the photo as resized, and where the model frame's
    first row and column lie in it (negative: the frame starts with padding)."""
    width, height = image_wh
    frame_h, frame_w = frame_hw
    if geometry.mode == "cover":
        scale = max(frame_h / height, frame_w / width)
        new_w, new_h = round(width * scale), round(height * scale)
        return new_w, new_h, (new_h - frame_h) // 2, (new_w - frame_w) // 2
    size = geometry.image_size
    new_w, new_h = resized_shape(width, height, geometry.mode, size, geometry.patch_size)
    shift = preprocess_pixel_map(width, height, geometry.mode, size, geometry.patch_size)[:2, 2]
    own_h, top, left = size if geometry.mode == "pad" else min(size, new_h), -int(shift[1]), -int(shift[0])
    own_w = size
    if frame_w != own_w or (geometry.mode == "pad" and frame_h != own_h):
        raise ValueError(
            f"the prediction is {frame_w}x{frame_h} but a {width}x{height} photo under {geometry.mode} "
            f"preprocessing at {size} gives {own_w}x{own_h}: run.json does not describe this prediction"
        )
    # The run pads shorter frames (white, centred) or cuts taller ones (centred) to one height.
    top += (own_h - frame_h) // 2 if own_h >= frame_h else -((frame_h - own_h) // 2)
    return new_w, new_h, top, left


def depth_in_model_frame(
    depth: np.ndarray, geometry: InputGeometry, frame_hw: tuple[int, int], image_hw: tuple[int, int] | None = None,
) -> np.ndarray:
    """Ground-truth depth ``[h, w]`` as the model's ``frame_hw`` frame sees it (NaN on padding).

    Args:
        depth: the ground-truth depth map of the photo (any resolution of the photo's aspect).
        geometry: the run's preprocessing (:func:`read_input_geometry`).
        frame_hw: ``(H, W)`` of the prediction.
        image_hw: ``(H, W)`` of the photo before the run turned it (default: the depth map's):
            the run rounds the resized sides from the photo's own size.
    """
    turns = geometry.rotate // 90
    depth = np.rot90(np.asarray(depth, dtype=np.float32), k=-turns)  # k < 0: clockwise, as the run turns
    if image_hw is None:
        photo_h, photo_w = depth.shape
    else:
        photo_h, photo_w = image_hw[::-1] if turns % 2 else image_hw
    new_w, new_h, top, left = _placement(geometry, (photo_w, photo_h), frame_hw)
    rows = np.arange(frame_hw[0]) + top
    cols = np.arange(frame_hw[1]) + left
    inside_r = (rows >= 0) & (rows < new_h)
    inside_c = (cols >= 0) & (cols < new_w)
    src_h, src_w = depth.shape
    # A resized pixel's centre (i + 0.5) lies at (i + 0.5) * src / new in the photo (PIL's rule).
    src_r = np.clip(np.floor((rows + 0.5) * src_h / new_h).astype(np.int64), 0, src_h - 1)
    src_c = np.clip(np.floor((cols + 0.5) * src_w / new_w).astype(np.int64), 0, src_w - 1)
    out = depth[np.ix_(src_r, src_c)].copy()
    out[~inside_r, :] = np.nan
    out[:, ~inside_c] = np.nan
    return out
