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

from .config import CacheConfig, ModelConfig, get_preset, preset_names
from .io.images import list_images, load_images
from .models import GCTStream, StreamState, fill_synthetic_
from .models.checkpoint import CheckpointError, convert_checkpoint, load_model
from .multistream import step_together
from .session import FramePrediction, Session
from .windowed import WindowedSession

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "CacheConfig",
    "CheckpointError",
    "WindowedSession",
    "convert_checkpoint",
    "list_images",
    "load_images",
    "load_model",
    "FramePrediction",
    "GCTStream",
    "ModelConfig",
    "Session",
    "step_together",
    "StreamState",
    "build_model",
    "fill_synthetic_",
    "get_preset",
    "preset_names",
    "__version__",
]


def build_model(preset: str = "lingbot-map", **overrides) -> GCTStream:
    """Build a model from a named preset ("lingbot-map", "tiny") with reference-style overrides,
    e.g. `build_model("lingbot-map", kv_cache_sliding_window=32, enable_point=True)`.
    Weights are uninitialised placeholders (zeros); load a checkpoint or fill synthetic ones."""
    p = get_preset(preset)
    return GCTStream(p.model, p.cache, **overrides)
