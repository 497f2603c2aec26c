"""mapstream: streaming 3D reconstruction with LingBot-Map's Geometric Context Transformer.

    import mapstream
    model = mapstream.load_model("lingbot-map-long.pt").eval()
    with model.session() as session:
        for frame in frames:
            for pred in session.step(frame):
                ...
"""
from __future__ import annotations

import logging

from .checkpoint import CheckpointError, convert_checkpoint, load_model
from .compat import GCTStream
from .config import ModelConfig, StreamConfig, get_preset, preset_names
from .globalmap import BackgroundMap, GlobalMap, MapConfig
from .io.images import list_images, load_images
from .models import GCTNetwork, StreamState, fill_synthetic_
from .multistream import step_together
from .session import FramePrediction, Session
from .windowed import WindowedSession, windowed_inference

from ._version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "BackgroundMap",
    "CheckpointError",
    "GlobalMap",
    "MapConfig",
    "WindowedSession",
    "convert_checkpoint",
    "list_images",
    "load_images",
    "load_model",
    "FramePrediction",
    "GCTNetwork",
    "GCTStream",
    "ModelConfig",
    "Session",
    "step_together",
    "StreamConfig",
    "StreamState",
    "build_model",
    "fill_synthetic_",
    "get_preset",
    "preset_names",
    "windowed_inference",
    "__version__",
]


def build_model(preset: str = "lingbot-map", **overrides) -> GCTStream:
    """Build a model from a named preset ("lingbot-map", "tiny") with reference-style overrides,
    e.g. `build_model("lingbot-map", kv_cache_sliding_window=32, enable_point=True)`.
    Weights are uninitialised placeholders (zeros); load a checkpoint or fill synthetic ones."""
    p = get_preset(preset)
    return GCTStream(p.model, p.stream, **overrides)
