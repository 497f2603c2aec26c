"""The caption of pictures made from predictions of untrained weights or of mapstream's own
small model: the summary figure, the depth previews and the rendered videos carry it across
their top, since each looks like a result on its own, shared without the run's log.

:func:`weights_caption` reads it from the run folder's records (``run.json``,
``progress.json``), where a run records its model (``tiny (synthetic weights)``,
:data:`mapstream.weights.SMALL_MODEL`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from mapstream.export.run_info import names_untrained_weights
from mapstream.weights import names_small_weights

__all__ = ["CAPTION_COLOR", "SMALL_CAPTION", "UNTRAINED_CAPTION", "draw_caption", "weights_caption"]

UNTRAINED_CAPTION = "UNTRAINED WEIGHTS (tiny preset): this is not a reconstruction of the scene"
"""The caption of figures and videos of predictions from untrained weights."""
SMALL_CAPTION = "MAPSTREAM'S SMALL MODEL (trained on procedural rooms), not the official LingBot-Map weights"
"""The caption of figures and videos of predictions from mapstream's shipped small model."""
CAPTION_COLOR = "#c00000"
"""The caption's colour (the red of its band)."""


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


def _caption_lines(draw: ImageDraw.ImageDraw, caption: str, font: Any, width: int) -> list[str]:
    """``caption`` broken at spaces into lines that fit ``width`` pixels (a word longer than
    the width stays whole)."""
    lines: list[str] = []
    for word in caption.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def draw_caption(canvas: Image.Image, caption: str) -> int:
    """White text on a red band across the top of ``canvas``; returns the band's height."""
    draw = ImageDraw.Draw(canvas)
    try:
        font = ImageFont.load_default(size=max(10, canvas.height // 28))
    except TypeError:  # Pillow before 10.1: one bitmap size only
        font = ImageFont.load_default()
    lines = _caption_lines(draw, caption, font, canvas.width - 16)
    line_h = getattr(font, "size", 11) + 4  # the bitmap fallback font (no FreeType) is 11 px
    band = 8 + line_h * len(lines)
    draw.rectangle((0, 0, canvas.width, band), fill=CAPTION_COLOR)
    for i, line in enumerate(lines):
        draw.text((8, 4 + i * line_h), line, fill=(255, 255, 255), font=font)
    return band
