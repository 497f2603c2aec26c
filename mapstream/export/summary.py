"""Summary figure: the trajectory seen from above and a few sample frames with their depth.

The top view plots camera centres on the world x-z plane (x to the right, z upwards): with the
OpenCV-style world (y down) that is the view from above, not mirrored. Centres are coloured by
time, keyframes are circled in red, the first frame is marked with a triangle. Matplotlib is
used through its object API with the Agg canvas (no pyplot, no global backend change).

A figure of predictions from untrained weights, or from mapstream's own small model, says so
across its top: a summary.png looks like a result on its own, shared without the run's log.
:func:`weights_caption` reads that from the run folder's records (``run.json``,
``progress.json``), where a run records its model (``tiny (synthetic weights)``,
:data:`mapstream.weights.SMALL_MODEL`).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mapstream.export._optional import import_optional
from mapstream.export.depth import colorize_depth, depth_range
from mapstream.export.reconstruction import Reconstruction
from mapstream.export.run_info import names_untrained_weights
from mapstream.io.atomic import atomic_path
from mapstream.weights import names_small_weights

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

__all__ = ["SMALL_CAPTION", "UNTRAINED_CAPTION", "sample_frames", "summary_figure", "weights_caption",
           "write_summary_figure"]

UNTRAINED_CAPTION = "UNTRAINED WEIGHTS (tiny preset): this is not a reconstruction of the scene"
"""The caption of figures and videos of predictions from untrained weights."""
SMALL_CAPTION = "MAPSTREAM'S SMALL MODEL (trained on procedural rooms), not the official LingBot-Map weights"
"""The caption of figures and videos of predictions from mapstream's shipped small model."""
_CAPTION_COLOR = "#c00000"


def _record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_of(settings: Any) -> str:
    model = settings.get("model") if isinstance(settings, dict) else None
    return model if isinstance(model, str) else ""


def weights_caption(run_folder: str | os.PathLike[str]) -> str | None:
    """:data:`UNTRAINED_CAPTION` when the run whose outputs the folder holds (or is being
    written) ran on untrained weights, :data:`SMALL_CAPTION` when it ran on mapstream's small
    model, else None (also for a folder without a run's records).

    The run is the one run.json names: while a run replaces the folder's outputs, run.json is
    marked (``state``) and its last ``replaced_by`` entry holds that run's settings; a
    finished run's are its ``config``. Without run.json, ``progress.json`` has the settings of
    the run keeping frames there.
    """
    folder = Path(run_folder)
    info = _record(folder / "run.json")
    replacing = info.get("replaced_by") if "state" in info else None
    if isinstance(replacing, list) and replacing and isinstance(replacing[-1], dict):
        model = _model_of(replacing[-1].get("settings"))
    elif info:
        model = _model_of(info.get("config"))
    else:
        model = _model_of(_record(folder / "progress.json").get("config"))
    if names_untrained_weights(model):
        return UNTRAINED_CAPTION
    return SMALL_CAPTION if names_small_weights(model) else None


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
        figure.suptitle(caption, color=_CAPTION_COLOR, fontsize="x-large", fontweight="bold")
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
