"""One frame of each of N streams in the pieces form (`BatchedPiecewiseGraphs`).

The work whose shapes the batch size and the frame size fix (embedding, frame blocks, the
global blocks' projections and MLPs, the dense heads) is `PiecewiseGraphs`' graphs captured
N frames wide; between them each stream's cache attention runs eagerly against its own
cache (exact visible range, its own write), as `GCTNetwork.forward_streams` runs it. The
camera head runs eagerly on the N camera tokens with each stream's own cache (the batched
form of the network's), beside the dense heads' replay. Every stream's special tokens and
3D-RoPE time index follow its own count of stored frames, as in the eager batched forward.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from ..models.gct import heads_without_autocast
from .pieces import PiecewiseGraphs

__all__ = ["BatchedPiecewiseGraphs"]


class BatchedPiecewiseGraphs(PiecewiseGraphs):
    """The single-frame step of `streams` independent streams at one frame size, all past
    their scale phase, replayed from graphs between eager per-stream cache attentions.

    A call replaces `model.forward_streams` for one batch: build one per (model, number of
    streams, frame size) and call it for every batch of that shape (`mapstream.step_together`
    keeps them). capture=False runs the same decomposition eagerly, on any device.
    """

    def __init__(self, model, image_hw: tuple[int, int], *, streams: int, capture: bool = True,
                 conv_search: bool = True) -> None:
        if streams < 1:
            raise ValueError(f"a batched step serves at least one stream, got streams={streams}")
        super().__init__(model, image_hw, capture=capture, conv_search=conv_search, streams=streams)

    def __call__(self, frames: torch.Tensor, states: Sequence, *, stores: Sequence[bool],
                 backend) -> dict[str, torch.Tensor]:
        """frames [N, 1, 3, H, W] (values already checked; frame b continues the sequence of
        `states[b]` and is stored there if `stores[b]`) -> the model's outputs for them:
        pose_enc [N, 1, 9], depth [N, 1, H, W, 1], ... (fp32; no pose_enc_list, as
        `forward_streams`)."""
        if tuple(frames.shape) != tuple(self.frame.shape):
            raise ValueError(f"this batched step takes frames {list(self.frame.shape)}, got {list(frames.shape)}")
        if not len(states) == len(stores) == self.streams:
            raise ValueError(
                f"a batched step of {self.streams} streams got {len(states)} states, {len(stores)} store flags"
            )
        if len({id(state) for state in states}) != self.streams:
            raise ValueError("each stream needs its own cache (the same state appears twice)")
        with self._on_device(), contextlib.ExitStack() as scopes:
            for state, store in zip(states, stores):
                scopes.enter_context(state.step(store))
            self._load_frame(frames, [state.aggregator for state in states])
            first = self._first_piece()
            with self._open_steps([state.aggregator for state in states], list(stores)) as steps:
                self._run_trunk(first, steps, backend)
            return self._heads(states, stores)

    def _heads(self, states: Sequence, stores: Sequence[bool]) -> dict[str, torch.Tensor]:
        """The dense heads' graph, and the camera head eagerly beside it; fresh tensors."""
        head = self.model.camera_head
        if head is None:
            (heads,) = self._dense_piece()
            return {k: v.clone() for k, v in heads.items()}

        def camera() -> torch.Tensor:
            token = self._camera_token(*self._layer_outputs())
            with heads_without_autocast(self.frame.device):
                poses = head.forward_streams(token, caches=[s.camera for s in states], stores=list(stores))
            return poses[-1].float()

        # The dense heads' replay is one launch: queued first (on the second stream), the GPU
        # runs it while the host launches the camera head's small kernels.
        (heads,), pose_enc = self._side_by_side(self._dense_piece, camera)
        out = {k: v.clone() for k, v in heads.items()}
        out["pose_enc"] = pose_enc
        return out
