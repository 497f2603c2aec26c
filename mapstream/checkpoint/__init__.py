"""Loading and converting checkpoints: official `.pt` files, `.safetensors`, hub repos.

    model = load_model("lingbot-map-long.pt")                      # local file
    model = load_model("robbyant/lingbot-map")                     # hub (cached)
    convert_checkpoint("lingbot-map-long.pt", "lingbot-map-long.safetensors")

Loading is strict: every tensor of the model must come from the checkpoint with the right
shape and the checkpoint must hold nothing else, or a `CheckpointError` lists the
differences (`strict=False` loads what matches, logs the same report and attaches it as
`model.load_report`).

Memory: the checkpoint's tensors become the model's parameters (`load_state_dict(assign=True)`
on a model built without parameter storage), so the weights are never held twice. `.pt`
files (torch's zip format) are memory-mapped, as are `.safetensors` files with safetensors
>= 0.8 (older versions read one in-memory copy): pages are read from disk on first use and
are copy-on-write, so the file never changes. Casting (`dtype`) or moving (`device`) makes
the one copy in the target dtype/device.

`.pt` files are read with `torch.load(weights_only=True)`, which executes no pickled code;
files that also pickle other Python objects (e.g. training arguments) are refused unless
the caller passes `trust_pickle=True`.

The package: `files` reads checkpoint files, `report` matches their keys against a model,
`load` builds the model and loads them, `convert` writes them as safetensors.
"""
from __future__ import annotations

from ..config import DEFAULT_IMAGE_SIZE
from ..hub import DEFAULT_FILENAME
from .convert import convert_checkpoint, convert_main, default_converted_path
from .files import (
    IMAGE_SIZE_KEY,
    TRAINED_VIEWS_KEY,
    checkpoint_filter_fn,
    read_state_dict,
    recorded_image_size,
    recorded_preset,
    recorded_trained_views,
    resolve_checkpoint,
)
from .load import load_model, model_image_size, model_trained_views
from .report import CheckpointError, LoadReport, compare_keys

__all__ = [
    "DEFAULT_FILENAME",
    "DEFAULT_IMAGE_SIZE",
    "IMAGE_SIZE_KEY",
    "TRAINED_VIEWS_KEY",
    "CheckpointError",
    "LoadReport",
    "checkpoint_filter_fn",
    "compare_keys",
    "convert_checkpoint",
    "convert_main",
    "default_converted_path",
    "load_model",
    "model_image_size",
    "model_trained_views",
    "read_state_dict",
    "recorded_image_size",
    "recorded_preset",
    "recorded_trained_views",
    "resolve_checkpoint",
]
