"""Summary figure: the trajectory seen from above and a few sample frames with their depth.

The top view plots camera centres on the world x-z plane (x to the right, z upwards): with the
OpenCV-style world (y down) that is the view from above, not mirrored. Centres are coloured by
time, keyframes are circled in red, the first frame is marked with a triangle. Matplotlib is
used through its object API with the Agg canvas (no pyplot, no global backend change).

A figure of predictions from untrained weights, or from mapstream's own small model, says so
across its top (:mod:`mapstream.export.captions`).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mapstream.export._optional import import_optional
from mapstream.export.captions import CAPTION_COLOR, SMALL_CAPTION, UNTRAINED_CAPTION, weights_caption
from mapstream.export.depth import colorize_depth, depth_range
from mapstream.export.reconstruction import Reconstruction
from mapstream.io.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

__all__ = ["SMALL_CAPTION", "UNTRAINED_CAPTION", "sample_frames", "summary_figure", "weights_caption",
           "write_summary_figure"]

def sample_frames(num_frames: int, count: int) -> list[int]:
    """Up to ``count`` frame indices evenly spread over ``[0, num_frames - 1]`` (first and last included)."""
    count = max(1, min(count, num_frames))
    return sorted({int(i) for i in np.rint(np.linspace(0, num_frames - 1, count))})


def summary_figure(
    recon: Reconstruction, *, num_samples: int = 4, colormap: str = "viridis", caption: str | None = None
) -> Figure:
    """Build the figure (see the module docstring); its first axes is the top view.

    The keyframe markers are the collection labelled ``"keyframes"`` on the top-view axes.
    ``caption``: a warning written in bold red across the top (e.g. :data:`UNTRAINED_CAPTION`).
    """
    import_optional("matplotlib", "drawing the summary figure")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    samples = sample_frames(len(recon), num_samples)
    H, W = recon.image_hw
    panel_w = 2.4
    panel_h = panel_w * H / W
    figure = Figure(figsize=(5.0 + panel_w * len(samples), max(4.5, 2 * panel_h + 1.0)), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 1 + len(samples), width_ratios=[5.0 / panel_w] + [1.0] * len(samples))

    if caption:
        figure.suptitle(caption, color=CAPTION_COLOR, fontsize="x-large", fontweight="bold")
    top = figure.add_subplot(grid[:, 0])
    x, z = recon.T_world_cam[:, 0, 3], recon.T_world_cam[:, 2, 3]
    top.plot(x, z, color="0.6", linewidth=1, zorder=1)
    dots = top.scatter(x, z, c=recon.timestamps, cmap=colormap, s=14, zorder=2)
    figure.colorbar(dots, ax=top, label="time [s]", shrink=0.8)
    key = recon.keyframe
    top.scatter(x[key], z[key], s=70, facecolors="none", edgecolors="red", linewidths=1.2,
                zorder=3, label="keyframes")
    top.scatter(x[:1], z[:1], marker="^", s=40, color="black", zorder=2.5, label="first frame")
    top.set_xlabel("x")
    top.set_ylabel("z")
    top.set_aspect("equal", adjustable="datalim")
    top.set_title(f"Trajectory, top view ({len(recon)} frames, {int(key.sum())} keyframes)")
    top.legend(loc="best", fontsize="small")

    near, far = depth_range(recon)
    sky = recon.sky_mask
    for column, i in enumerate(samples, start=1):
        image_ax = figure.add_subplot(grid[0, column])
        image_ax.imshow(recon.images[i])
        image_ax.set_title(f"{recon.names[i]}\nt = {recon.timestamps[i]:.2f} s", fontsize="small")
        depth_ax = figure.add_subplot(grid[1, column])
        depth_ax.imshow(colorize_depth(recon.depth[i], near, far, invalid=None if sky is None else sky[i]))
        depth_ax.set_title(f"depth [{near:.2g}, {far:.2g}]", fontsize="small")
        for ax in (image_ax, depth_ax):
            ax.set_axis_off()
    return figure


def write_summary_figure(
    recon: Reconstruction, path: str | os.PathLike[str], *, num_samples: int = 4, dpi: int = 100,
    caption: str | None = None,
) -> Path:
    """Draw :func:`summary_figure` and save it atomically (format from the suffix, e.g. ``.png``).

    ``caption``: None takes :func:`weights_caption` of the folder written into (a run's
    folder: its records say which weights made the predictions); ``""`` draws none.
    """
    path = Path(path)
    if caption is None:
        caption = weights_caption(path.parent)
    figure = summary_figure(recon, num_samples=num_samples, caption=caption)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    logger.info("wrote %s", path)
    return path
