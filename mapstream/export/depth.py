"""Depth maps as 16-bit PNG (millimetres of the predicted scale) plus colourised previews.

* ``depth/<stem>.png``: uint16, ``value = round(depth * 1000)`` clipped to ``[1, 65535]``
  (so depths beyond 65.535 units saturate), ``0`` = invalid (non-finite or <= 0 depth, and sky
  pixels when a sky mask is applied). The unit is the model's predicted scale, not metres.
* ``depth_preview/<stem>.png``: RGB, a matplotlib colormap over one depth range for the whole
  sequence (2nd-98th percentile of valid depths) so colours compare across frames; invalid
  pixels are black.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from PIL import Image

from mapstream.export._optional import import_optional
from mapstream.export.captions import draw_caption, weights_caption
from mapstream.export.frames import save_png
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import prepare_dir

logger = logging.getLogger(__name__)

__all__ = ["colorize_depth", "depth_range", "depth_to_millimetres", "write_depth_maps"]


def depth_to_millimetres(depth: np.ndarray, invalid: np.ndarray | None = None) -> np.ndarray:
    """``[H, W]`` depth -> uint16 millimetres (see the module docstring); ``invalid`` -> 0."""
    depth = np.asarray(depth, dtype=np.float64)
    bad = ~np.isfinite(depth) | (depth <= 0)
    if invalid is not None:
        bad |= invalid
    millimetres = np.clip(np.rint(np.where(bad, 1.0, depth) * 1000.0), 1, 65535)
    return np.where(bad, 0, millimetres).astype(np.uint16)


def depth_range(
    recon: Reconstruction, *, mask_sky: bool = True, percentiles: tuple[float, float] = (2, 98)
) -> tuple[float, float]:
    """Robust ``(near, far)`` of the valid depths of the whole sequence (strided sample)."""
    valid = np.isfinite(recon.depth) & (recon.depth > 0)
    if mask_sky and recon.sky_mask is not None:
        valid &= ~recon.sky_mask
    stride = max(1, int(np.ceil(valid.size / 10_000_000)))
    sample = recon.depth.reshape(-1)[::stride][valid.reshape(-1)[::stride]]
    if sample.size == 0:
        return 0.0, 1.0
    near, far = (float(v) for v in np.percentile(sample, percentiles))
    return (near, far) if far > near else (near, near + 1e-6 + abs(near) * 1e-3)


def colorize_depth(
    depth: np.ndarray, near: float, far: float, *, invalid: np.ndarray | None = None, colormap: str = "turbo"
) -> np.ndarray:
    """``[H, W]`` depth -> ``[H, W, 3]`` uint8 RGB; ``near`` maps to the colormap's start, black = invalid."""
    matplotlib = import_optional("matplotlib", "colourising depth maps")
    depth = np.asarray(depth, dtype=np.float64)
    bad = ~np.isfinite(depth) | (depth <= 0)
    if invalid is not None:
        bad |= invalid
    scaled = np.clip((np.where(bad, near, depth) - near) / (far - near), 0.0, 1.0)
    rgb = (np.asarray(matplotlib.colormaps[colormap](scaled))[..., :3] * 255).round().astype(np.uint8)
    rgb[bad] = 0
    return rgb


def write_depth_maps(
    recon: Reconstruction,
    folder: str | os.PathLike[str],
    *,
    mask_sky: bool = True,
    preview: bool = True,
    colormap: str = "turbo",
    caption: str | None = None,
) -> dict[str, Path]:
    """Write ``folder/depth/<stem>.png`` (16-bit mm) and ``folder/depth_preview/<stem>.png``.

    Returns ``{"depth": folder/depth, "depth_preview": folder/depth_preview}`` (the second only
    with ``preview``). Sky pixels are written as 0 when ``mask_sky`` and a sky mask exist.
    ``caption``: drawn across the top of each preview, as the summary figure draws it; None
    takes :func:`~mapstream.export.captions.weights_caption` of ``folder`` (a run's folder: its
    records say which weights made the depth), ``""`` draws none. The 16-bit maps are data: no
    caption.
    """
    if caption is None:
        caption = weights_caption(folder)
    folder = prepare_dir(folder)
    out = {"depth": prepare_dir(folder / "depth")}
    if preview:
        out["depth_preview"] = prepare_dir(folder / "depth_preview")
        near, far = depth_range(recon, mask_sky=mask_sky)
    sky = recon.sky_mask if mask_sky else None
    for i, stem in enumerate(recon.file_stems()):
        invalid = None if sky is None else sky[i]
        save_png(depth_to_millimetres(recon.depth[i], invalid), out["depth"] / f"{stem}.png")
        if preview:
            rgb = colorize_depth(recon.depth[i], near, far, invalid=invalid, colormap=colormap)
            if caption:
                canvas = Image.fromarray(rgb)
                draw_caption(canvas, caption)
                rgb = np.asarray(canvas)
            save_png(rgb, out["depth_preview"] / f"{stem}.png")
    logger.info("wrote %d depth maps to %s", len(recon), folder)
    return out
