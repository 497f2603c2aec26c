"""Streams for the batched-step tests (tests/fast, tests/gpu): states already past their
scale phase, each on its own frames."""
from __future__ import annotations

import torch


def started_states(model, images: torch.Tensor, scale: int, **cache) -> list:
    """One state a stream of `images` [N, S, 3, H, W], with the cache settings `cache`, each
    past its scale phase on its stream's first `scale` frames."""
    states = [model.new_state(model.stream_config.with_settings(**cache)) for _ in range(images.shape[0])]
    with torch.no_grad():
        for state, frames in zip(states, images):
            model(frames[:scale], state, store=True, num_frame_for_scale=scale)
    return states
