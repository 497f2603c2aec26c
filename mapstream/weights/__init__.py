"""mapstream's own trained weights, shipped inside the package: the network offline runs use
when the official LingBot-Map checkpoint is not at hand.

``small.safetensors`` holds the ``small-deep`` preset's weights (the ``small`` preset's width
at twice its depth) with its large matrices in 8 bits (`mapstream.weights.int8`), trained with
``mapstream train`` on procedural rooms (the recipe and its measured quality:
docs/TRAINING.md). Loaders build the preset the file fits. A run that uses them records
:data:`SMALL_MODEL` as its model and carries :data:`SMALL_WARNING`; figures of its
predictions carry a caption that says which weights made them.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["SMALL_MODEL", "SMALL_WARNING", "names_small_weights", "small_weights"]

SMALL_MODEL = "small (mapstream's own weights, trained on procedural rooms)"
"""The model a run records when it ran on the shipped small weights."""

SMALL_WARNING = (
    "USING MAPSTREAM'S OWN SMALL MODEL, not the official LingBot-Map weights: it is trained on procedural "
    "rooms only and its cameras and depth are far less accurate (docs/TRAINING.md gives its measured "
    "quality); it was trained on frames 294 pixels wide, the width runs give it unless --image-size says otherwise. Pass "
    "--model with the official checkpoint (or put it into the Hugging Face cache) for the official model's "
    "results."
)

_SMALL_FILE = Path(__file__).with_name("small.safetensors")


def small_weights() -> Path | None:
    """The shipped small weights' file, or None in an installation without it."""
    return _SMALL_FILE if _SMALL_FILE.is_file() else None


def names_small_weights(model: object) -> bool:
    """Whether a run's recorded model is the shipped small weights (:data:`SMALL_MODEL`)."""
    return model == SMALL_MODEL
