"""The reference's names and stateful protocol, in one place.

Code written for LingBot-Map keeps working: `GCTStream(...)` builds the network with the
reference's constructor arguments; `model(frames)` reads and extends a default state until
`model.clean_kv_cache()` (also `aggregator.clean_kv_cache()`, `camera_head.clean_kv_cache()`
and the manager's `reset()`, each for its part); `inference_streaming` and
`inference_windowed` take the reference's arguments; `GCTStreamWindow`, `GCTStreamWindowV2`
and `FlashInferKVCacheManager` are the reference's other names. Everything here is a thin
layer over the network (`GCTNetwork`), sessions and windowed inference, which hold the
behaviour.
"""
from __future__ import annotations

from typing import Any

import torch

from .cache import FlashInferKVCacheManager, reference_cache, shared_pools
from .config import ModelConfig, StreamConfig
from .keyframes import FlowKeyframes
from .models.aggregator import Trace
from .models.gct import GCTNetwork
from .models.state import StreamState
from .sequences import each_sequence
from .session import Session
from .validation import check_count, check_images, keyframe_flag
from .windowed import windowed_inference

__all__ = ["FlashInferKVCacheManager", "GCTStream", "GCTStreamWindow", "GCTStreamWindowV2"]


class GCTStream(GCTNetwork):
    """LingBot-Map's model under its reference name, with the reference's stateful protocol.

    Args:
        config: architecture (default: the official `lingbot-map` preset's).
        stream: the stream settings of its sessions and of `inference_streaming` (default:
            the preset's).
        backend: attention backend for the global blocks ("auto", "sdpa", "flashinfer",
            "triton"); the stream's `backend` setting.
        num_frame_for_scale: the scale frames of `forward` and `inference_streaming` when
            not given (the stream's `num_scale_frames`).
        **overrides: reference constructor arguments (`kv_cache_sliding_window`,
            `enable_3d_rope`, `enable_point`, `use_sdpa`, ...) or `ModelConfig`/`StreamConfig`
            fields.
    """

    def __init__(
        self,
        config: ModelConfig | None = None,
        stream: StreamConfig | None = None,
        *,
        backend: str | None = None,
        num_frame_for_scale: int | None = None,
        **overrides: Any,
    ) -> None:
        if overrides.get("use_sdpa"):
            backend = "sdpa"  # the reference's switch; False keeps `backend` (the fastest usable)
        if backend is not None:
            overrides["backend"] = backend
        overrides["num_frame_for_scale"] = num_frame_for_scale
        super().__init__(config, stream, **overrides)
        # Made now, so that `aggregator.clean_kv_cache()` and the other module-level names of
        # the protocol find the caches of this model's settings, not default ones.
        self.default_state  # noqa: B018

    @property
    def default_state(self) -> StreamState:
        """The state of the reference protocol's `forward` calls (made with this model's stream
        settings on first use: when the model is built, or by a copy of a model)."""
        spec = self.stream_config.cache_spec()
        aggregator = reference_cache(self.aggregator, lambda: self.aggregator.new_cache(self.stream_config))
        camera = (
            reference_cache(self.camera_head, lambda: self.camera_head.new_cache(spec))
            if self.camera_head is not None else None
        )
        return StreamState(aggregator, camera)

    @property
    def backend_name(self) -> str:
        return self.stream_config.backend

    def set_backend(self, name: str) -> None:
        """Use attention backend `name` ("auto", "sdpa", "triton", ...) from the next step on
        (the stream setting of this model's later sessions and protocol calls)."""
        self.stream_config = self.stream_config.with_settings(backend=name)

    def clean_kv_cache(self) -> None:
        """Forget every frame of the default state: the next `forward` starts a new sequence,
        with outputs identical to those of a freshly built model. Leased cache pages are kept
        for reuse; `free_kv_cache()` returns them."""
        self.aggregator.clean_kv_cache()
        if self.camera_head is not None:
            self.camera_head.clean_kv_cache()

    def free_kv_cache(self) -> int:
        """Clean and release every cache page no live session holds (e.g. before switching
        resolution or to hand memory back). Returns the number of bytes released."""
        self.default_state.reset(release=True)
        released = shared_pools().trim()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return released

    def forward(self, images: torch.Tensor, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """The network's step when given a state (`GCTNetwork.forward(images, state, *,
        store=...)`, what sessions call), else the reference's stateful protocol
        (`reference_forward`)."""
        if (args and isinstance(args[0], StreamState)) or "store" in kwargs:
            return super().forward(images, *args, **kwargs)
        return self.reference_forward(images, *args, **kwargs)

    def reference_forward(
        self,
        images: torch.Tensor,
        num_frame_for_scale: int | None = None,
        num_frame_per_block: int | None = None,
        causal_inference: bool = True,
        *,
        keyframe: bool = True,
        state: StreamState | None = None,
        trace: Trace | None = None,
        validate: bool = True,
    ) -> dict[str, torch.Tensor]:
        """One stateful step over the frames in `images` (the reference's protocol).

        Args:
            images: [S, 3, H, W] or [1, S, 3, H, W] RGB in [0, 1], H and W multiples of 14.
            num_frame_for_scale: scale frames of the sequence. Default: the model's.
            num_frame_per_block: accepted for compatibility; the block is the frames given.
            causal_inference: must be True (the non-causal path is a training path).
            keyframe: store these frames in the caches (False: attend, then forget them).
            state: the sequence's caches (default: the default state, extended until
                `clean_kv_cache()`).
        Returns the network's outputs, and `images` in eval mode.
        """
        if not causal_inference:
            raise ValueError(
                "causal_inference=False is the reference's training path and is not supported; "
                "use causal_inference=True (streaming) or inference_streaming()"
            )
        keyframe = keyframe_flag(keyframe)
        if keyframe is None:
            raise TypeError("keyframe must be True or False for a forward call (sessions let a policy decide)")
        images = check_images(images, self.config.patch_size, check_values=validate)
        out = super().forward(
            images, self.default_state if state is None else state, store=keyframe,
            num_frame_for_scale=num_frame_for_scale, trace=trace, validate=False,
        )
        if not self.training:
            out["images"] = images
        return out

    def session(self, config: StreamConfig | None = None, **kwargs: Any) -> Session:
        """A new online `Session` with caches of its own (see `mapstream.Session`)."""
        return Session(self, config, **kwargs)

    @torch.no_grad()
    def inference_streaming(
        self,
        images: torch.Tensor,
        num_scale_frames: int | None = None,
        keyframe_interval: int = 1,
        output_device: torch.device | str | None = None,
        flow_threshold: float = 0.0,
        max_non_keyframe_gap: int = 30,
        *,
        progress: bool | None = None,
    ) -> dict[str, torch.Tensor]:
        """Stream a whole sequence: scale frames together, then one frame at a time.

        Cleans the default state first and again at the end: afterwards no frame of the
        sequence is visible to anything (the reference leaves its caches populated when
        `output_device` is None). Frame i >= scale is a keyframe iff keyframe_interval <= 1
        or (i - scale) % keyframe_interval == 0. With `flow_threshold` > 0 keyframes are
        chosen by image motion instead: `FlowKeyframes(flow_threshold, max_non_keyframe_gap)`.
        The cache keeps the model's own count of scale frames whatever `num_scale_frames` says,
        as the reference's does.

        A batch [B, S, 3, H, W] is B independent sequences, each run on a clean cache in turn
        (the reference takes batch 1 only); the outputs are stacked. Returns pose_enc
        [B,S,9], depth [B,S,H,W,1], depth_conf [B,S,H,W] (+ world points), images; on
        `output_device` if given. progress: a bar over each sequence's frames (None: when
        stderr is a terminal).
        """
        images = check_images(images, self.config.patch_size)
        keyframes = _streaming_keyframes(keyframe_interval, flow_threshold, max_non_keyframe_gap)
        config = self._reference_stream(num_scale_frames)

        def one_sequence(sequence: torch.Tensor) -> dict[str, torch.Tensor]:
            session = Session(
                self, config.with_settings(keyframe_interval=keyframes()), output_device=output_device,
                state=self.default_state,
            )
            try:
                session.reset()
                return session.run(sequence, progress=progress)
            finally:
                self.clean_kv_cache()

        return each_sequence(images, one_sequence)

    def inference_windowed(
        self,
        images: torch.Tensor,
        window_size: int = 16,
        overlap_size: int | None = None,
        overlap_keyframes: int | None = None,
        num_scale_frames: int | None = None,
        scale_mode: str = "median",
        output_device: torch.device | str | None = None,
        keyframe_interval: int = 1,
        flow_threshold: float = 0.0,
        max_non_keyframe_gap: int = 30,
        *,
        precision: str | None = None,
        return_windows: bool = False,
        progress: bool | None = None,
    ) -> dict[str, Any]:
        """Long sequences with the reference's arguments, defaults (windows of 16 slots, an
        overlap of the scale frames) and join (window_join="anchor"):
        `mapstream.windowed.windowed_inference`. Leaves no
        cache populated. `flow_threshold` and `max_non_keyframe_gap` complete the reference's
        signature: only flow_threshold=0 (fixed-interval windows) runs."""
        if scale_mode != "median":
            raise ValueError(f"scale_mode must be 'median' (the only estimator), got {scale_mode!r}")
        if flow_threshold > 0:
            raise ValueError(
                f"flow_threshold={flow_threshold}: windows are planned from a fixed keyframe interval; motion-based "
                "keyframes run in streaming (inference_streaming(..., flow_threshold=...), or keyframe_interval='auto' "
                "in a session); give flow_threshold=0 and a keyframe_interval here"
            )
        for name, value, least in (("window_size", window_size, 1), ("overlap_size", overlap_size, 0),
                                   ("overlap_keyframes", overlap_keyframes, 0)):
            if value is not None:
                check_count(name, value, least)  # named as the caller gave it
        config = self._reference_stream(num_scale_frames).with_settings(
            window_size=window_size, overlap=overlap_size, overlap_keyframes=overlap_keyframes,
            keyframe_interval=keyframe_interval, window_join="anchor",
        )
        if precision is not None:
            config = config.with_settings(precision=precision)
        return windowed_inference(
            self, images, config, output_device=output_device, return_windows=return_windows, progress=progress
        )

    def _reference_stream(self, num_scale_frames: int | None) -> StreamConfig:
        """The model's stream settings with the reference's count of scale frames for one call;
        the cache keeps its own count, as the reference's does."""
        config = self.stream_config
        if num_scale_frames is None:
            return config
        return config.with_settings(num_scale_frames=num_scale_frames, cache_scale_frames=config.anchor_frames)


class GCTStreamWindow(GCTStream):
    """`GCTStream` under the reference's windowed-module name (same model, same weights)."""


class GCTStreamWindowV2(GCTStream):
    """`GCTStream` with `enable_point=True` unless told otherwise (the reference's second
    windowed module). A checkpoint without `point_head.*` weights fails strict loading
    instead of giving random world points."""

    def __init__(self, *args: Any, enable_point: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, enable_point=enable_point, **kwargs)


def _streaming_keyframes(keyframe_interval, flow_threshold: float, max_non_keyframe_gap: int):
    """`inference_streaming`'s keyframe rule, as a maker called for each sequence: the interval
    as given, or with flow_threshold > 0 a fresh flow policy (a policy remembers its last
    keyframe, so sequences must not share one)."""
    if not flow_threshold > 0:
        return lambda: keyframe_interval
    if keyframe_interval not in (1, None):
        raise ValueError(
            f"give either keyframe_interval ({keyframe_interval!r}) or flow_threshold ({flow_threshold}), "
            "not both: flow_threshold > 0 chooses keyframes by image motion"
        )
    FlowKeyframes(flow_threshold, max_non_keyframe_gap)  # its own error for a bad gap
    return lambda: FlowKeyframes(flow_threshold, max_non_keyframe_gap)
