"""The whole step after its first graph as one CUDA graph (`WholeStepGraphs`)."""
from __future__ import annotations

import contextlib

import torch

from ..cache import DeviceStep
from .graphs import GraphedStep
from .piece import KeyedPiece

__all__ = ["WholeStepGraphs"]


class WholeStepGraphs(GraphedStep):
    """Two graphs a step: the first (no cache read), then everything else as one graph, its
    cache attentions reading write offsets and key ranges from a `DeviceStep`. Captured again
    when what the second graph holds fixed changes (cache storage, backend, key-norm hints)."""

    whole = True

    def __init__(self, model, image_hw: tuple[int, int], *, capture: bool = True, conv_search: bool = True) -> None:
        super().__init__(model, image_hw, capture=capture, conv_search=conv_search)
        self.agg_device_step = DeviceStep(self.tokens_per_frame, self.frame.device)
        self._whole = KeyedPiece(self._whole_step, capture, self.pool, "whole step", self._head_tables)
        self._backend = None
        self._key_norms: tuple = ()

    def _whole_step(self) -> tuple:
        """Everything after graph 0, whose static outputs it starts from."""
        backend, key_norms = self._backend, self._key_norms  # captured as kernel arguments
        layers = self.agg.run_layers(
            self._first_piece.outputs,
            lambda i, q, k, v: self.agg_device_step.attend(i, q, k, v, backend, key_norm=key_norms[i]),
            self.tokens_per_frame, self.frame_rotary, self.global_rotary,
        )
        frames, globals_ = [], []
        for _, frame_out, leaving in layers:
            frames.append(frame_out)
            globals_.append(leaving)
        # The heads side by side as in pieces mode, the camera head on a forked stream that
        # the capture joins (its branch becomes a parallel path of the graph).
        poses, heads = self._side_by_side(
            lambda: self._camera_poses(self._camera_token(frames, globals_)),
            lambda: self._dense_heads(self._selected_layers(frames, globals_)),
        )
        return heads, poses

    def finish(self, first: tuple, state, store: bool, backend) -> dict[str, torch.Tensor]:
        # The first graph's outputs are the static tensors the second graph reads.
        with contextlib.ExitStack() as steps:
            (agg_step,) = steps.enter_context(self._open_step(state.aggregator, store))
            camera_steps = steps.enter_context(self._camera_steps(state, store))
            # Planning queues GPU work only when a cache's storage changed (a new lease is
            # zero-filled, a grown trajectory memory is copied over), on the current stream
            # behind graph 0; the step's copies must follow it there. Otherwise they run
            # beside graph 0. (The graph is captured again for new storage anyway.)
            moved = agg_step.storage is not self.agg_device_step.storage or any(
                step.storage is not self.camera_device_step.storage for step in camera_steps
            )
            with contextlib.nullcontext() if moved else self._beside_first_graph():
                self.agg_device_step.prepare(agg_step)
                for step in camera_steps:
                    self.camera_device_step.prepare(step)
            # A graph holds the storage addresses, the backend and the key-norm hints (bounds
            # and counters) it was captured with.
            self._backend, self._key_norms = backend, self.agg.key_norms()
            hints = tuple(None if h is None else (h.bound, h.repairs.data_ptr()) for h in self._key_norms)
            key = (self.agg_device_step.storage_ptr, self.camera_device_step.storage_ptr, type(backend), hints)
            heads, poses = self._whole.for_key(key)()
        out: dict[str, torch.Tensor] = {k: v.clone() for k, v in heads.items()}
        if poses is not None:
            poses = [p.clone() for p in poses]
            out["pose_enc"], out["pose_enc_list"] = poses[-1], poses
        return out

    @contextlib.contextmanager
    def _beside_first_graph(self):
        """Queue the enclosed work on the second stream, after the frame's load (and so after
        the previous step) but beside graph 0, and make the current stream wait for it. For
        `DeviceStep.prepare`'s small kernels (trajectory moves, write offsets, key ranges): graph
        0 reads no cache, so they need not wait for it, and on the current stream they would.
        Only for work that needs nothing queued on the current stream after the frame's load. The temporaries it allocates belong to the
        second stream, whose work alone uses them."""
        if self.side_stream is None:
            yield
            return
        current = torch.cuda.current_stream()
        self.side_stream.wait_event(self._frame_loaded)
        try:
            with torch.cuda.stream(self.side_stream):
                yield
        finally:
            current.wait_stream(self.side_stream)
