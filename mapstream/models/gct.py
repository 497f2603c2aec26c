"""GCTStream: the Geometric Context Transformer for streaming 3D reconstruction.

    images [B, S, 3, H, W] -> aggregator (ViT + 24 x [frame, global] blocks, KV cache)
                           -> camera head (causal, iterative)  -> pose_enc [B, S, 9]
                           -> DPT depth head                    -> depth [B, S, H, W, 1], depth_conf
                           -> DPT point head (optional)         -> world_points, world_points_conf

State (the KV caches of one sequence) lives in a `StreamState`. The model keeps a default
state for low-level `forward()` calls, which are stateful exactly like the reference's:
every call reads and extends the default caches until `clean_kv_cache()`. Sessions
(`model.session()`) own states of their own.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from ..attention import AttentionBackend, select_backend
from ..cache import PoolRegistry, StreamCacheManager
from ..config import CacheConfig, ModelConfig, get_preset, split_overrides
from ..geometry import camera_matrices
from ..heads import CameraCausalHead, DPTHead
from ..validation import check_images, keyframe_flag
from .aggregator import AggregatorStream, Trace, aggregator_cache_spec, kv_dtype

__all__ = ["GCTStream", "StreamState"]

log = logging.getLogger(__name__)


@dataclass
class StreamState:
    """The caches of one sequence (aggregator and camera head), reset together."""

    aggregator: StreamCacheManager
    camera: StreamCacheManager | None

    def reset(self, *, release: bool = False) -> None:
        self.aggregator.reset(release=release)
        if self.camera is not None:
            self.camera.reset(release=release)

    def release(self) -> None:
        self.aggregator.release()
        if self.camera is not None:
            self.camera.release()

    @contextlib.contextmanager
    def step(self, store: bool) -> Iterator[None]:
        """The scope of one step over both caches, which must hold the same frames. Each cache
        commits its own part when it is done, so a step that raises after the aggregator's
        part (in the camera head, a dense head, the copy of the outputs) would leave a stored
        frame in one cache only, or in both for a call that returned nothing. Then both refuse
        further steps until `reset`; a failed unstored step leaves them valid, but its frame
        can no longer be promoted with `store_last`."""
        try:
            yield
        except BaseException:
            for cache in (self.aggregator, self.camera):
                if cache is not None:
                    cache.step_failed(stored=store)
            raise

    @property
    def frames_stored(self) -> int:
        return self.aggregator.frames_stored


class GCTStream(nn.Module):
    """LingBot-Map's streaming model; state-dict compatible with the official checkpoints.

    Args:
        config: architecture (default: the official `lingbot-map` preset).
        cache: streaming-cache policy (default: the preset's).
        backend: attention backend for the global blocks: "auto", "sdpa", "flashinfer", "triton".
        num_frame_for_scale: default number of scale frames for `inference_streaming`
            (default: `cache.scale_frames`).
        **overrides: reference constructor arguments (`kv_cache_sliding_window`,
            `enable_3d_rope`, `enable_point`, ...) or `ModelConfig`/`CacheConfig` fields.
    """

    def __init__(
        self,
        config: ModelConfig | None = None,
        cache: CacheConfig | None = None,
        *,
        backend: str = "auto",
        num_frame_for_scale: int | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        if "use_sdpa" in overrides and overrides["use_sdpa"]:
            backend = "sdpa"  # the reference's switch; False keeps `backend` (the fastest usable)
        preset = get_preset("lingbot-map")
        config, cache, inert = split_overrides(config or preset.model, cache or preset.cache, overrides)
        if inert:
            log.info("ignoring reference arguments with no effect at inference: %s", ", ".join(inert))
        self.config = config
        self.cache_config = cache
        self.backend_name = backend
        self.num_frame_for_scale = num_frame_for_scale
        self.pools = PoolRegistry()
        head_dim_in = 2 * config.embed_dim
        self.aggregator = AggregatorStream(config, cache, self.pools)
        self.camera_head = (
            CameraCausalHead(
                head_dim_in,
                trunk_depth=config.camera_trunk_depth,
                num_heads=config.camera_num_heads,
                num_iterations=config.camera_num_iterations,
                cache_spec=aggregator_cache_spec(cache),
                pools=self.pools,
            )
            if config.enable_camera
            else None
        )

        def dpt(output_dim: int, activation: str) -> DPTHead:
            return DPTHead(
                head_dim_in,
                patch_size=config.patch_size,
                output_dim=output_dim,
                activation=activation,
                features=config.dpt_features,
                out_channels=config.dpt_out_channels,
                head_features=config.dpt_head_features_2,
                chunk_frames=config.dpt_chunk_frames,
            )

        # Registration order fixes the state-dict order: camera, point, depth.
        self.point_head = dpt(4, "inv_log") if config.enable_point else None
        self.depth_head = dpt(2, "exp") if config.enable_depth else None
        self._backends: dict[tuple, AttentionBackend] = {}

    # ------------------------------------------------------------------ state
    # (T_world_cam, T_cam_world, K) of pose encodings, for predictions; `compile_model` puts
    # a compiled copy on the instance.
    camera_matrices = staticmethod(camera_matrices)

    def new_state(self, cache: CacheConfig | None = None) -> StreamState:
        """Empty caches for one new sequence (sharing this model's page pools), with the
        model's cache policy or `cache`."""
        cache = cache or self.cache_config
        camera = self.camera_head.new_cache(aggregator_cache_spec(cache)) if self.camera_head else None
        return StreamState(self.aggregator.new_cache(cache), camera)

    @property
    def default_state(self) -> StreamState:
        return StreamState(self.aggregator.kv_cache, self.camera_head.kv_cache if self.camera_head else None)

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
        released = self.pools.trim()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return released

    def cast_for_inference(self, dtype: torch.dtype | str, *, heads: bool = False) -> "GCTStream":
        """Cast the aggregator's weights to `dtype` (bf16/fp16 for GPU inference, as the
        reference demo does) and return self. The normalisation constants stay fp32 (the
        reference rounds those to bf16 as a side effect; we do not); the dense heads'
        convolution weights are laid out channels-last.

        The heads stay fp32 (the reference's choice) unless `heads=True`: then they are cast
        too and run in `dtype` (on an H200: 1.7 ms less GPU work a frame, 0.5-1.0 ms less
        wall time; outputs within bf16 rounding of the fp32 heads' — docs/BENCHMARKS.md,
        "2026-11-30 (session 4)", part 3). Outputs are fp32 either way."""
        if isinstance(dtype, str):
            names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                     "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
            if dtype not in names:
                raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}")
            dtype = names[dtype]
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"cast_for_inference takes bf16, fp16 or fp32 (a floating-point dtype the kernels "
                             f"run in), got {dtype!r}")
        for param in self.aggregator.parameters():
            param.data = param.data.to(dtype)
        if heads:
            for head in self._head_modules():
                head.to(dtype)
        for head in (self.depth_head, self.point_head):
            if head is not None:  # values unchanged; NHWC convolutions (see DPTHead)
                head.to(memory_format=torch.channels_last)
        return self

    def _head_modules(self) -> list[nn.Module]:
        return [h for h in (self.camera_head, self.depth_head, self.point_head) if h is not None]

    @property
    def head_dtype(self) -> torch.dtype:
        """The dtype the heads compute in: that of their weights (fp32 unless
        `cast_for_inference(..., heads=True)`)."""
        for head in self._head_modules():
            return next(head.parameters()).dtype
        return torch.float32

    def set_backend(self, name: str) -> None:
        """Use attention backend `name` ("auto", "sdpa", "triton", ...) from the next step on."""
        self.backend_name = name
        self._backends.clear()

    def attention_backend(self, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
        key = (self.backend_name, torch.device(device).type, dtype)
        if key not in self._backends:
            self._backends[key] = select_backend(self.backend_name, torch.device(device), dtype)
        return self._backends[key]

    # ------------------------------------------------------------------ forward
    def forward(
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
        graphs=None,
    ) -> dict[str, torch.Tensor]:
        """One stateful step over the frames in `images` (reference semantics).

        Args:
            images: [S, 3, H, W] or [B, S, 3, H, W] RGB in [0, 1], H and W multiples of 14.
            num_frame_for_scale: scale frames of the sequence (the scale token's copy 0 goes
                to its first this-many frames). Default: the model's.
            num_frame_per_block: accepted for compatibility; the block is the frames given.
            causal_inference: must be True (the non-causal path is a training path).
            keyframe: store these frames in the caches (False: attend, then forget them).
            state: the sequence's caches (default: the model's default state).
            validate: check values (range, NaN) as well as shapes; costs a device sync.
            graphs: a `mapstream.fast.GraphedStep` for this state and frame size: runs a
                single frame through it (CUDA graphs) instead of eagerly.
        Returns:
            pose_enc [B,S,9], pose_enc_list (per camera iteration), depth [B,S,H,W,1],
            depth_conf [B,S,H,W], world_points [B,S,H,W,3] and world_points_conf [B,S,H,W]
            with a point head, and images (in eval mode).
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
        if images.shape[0] != 1:
            raise ValueError(
                f"batch size {images.shape[0]}: a streaming state serves one sequence; run one session per sequence, "
                "or model.inference_streaming(images) for a batch of whole sequences"
            )
        state = self.default_state if state is None else state
        nfs = num_frame_for_scale if num_frame_for_scale is not None else self._default_scale_frames()
        backend = self.attention_backend(images.device, kv_dtype(images))
        if graphs is not None and images.shape[1] == 1 and trace is None:
            with state.step(keyframe):
                out = graphs(images, state, store=keyframe, backend=backend)
            if not self.training:
                out["images"] = images
            return out
        with state.step(keyframe):
            layers, patch_start = self.aggregator(
                images, num_frame_for_scale=nfs, cache=state.aggregator, store=keyframe, backend=backend, trace=trace
            )
            out, poses = self._heads(
                layers, images, patch_start,
                lambda tokens: self.camera_head(tokens, cache=state.camera, store=keyframe, trace=trace), trace,
            )
        if poses is not None:
            out["pose_enc_list"] = poses
        if not self.training:
            out["images"] = images
        return out

    def forward_streams(
        self,
        images: torch.Tensor,
        states: Sequence[StreamState],
        *,
        keyframes: Sequence[bool],
        num_frame_for_scale: Sequence[int],
        validate: bool = True,
    ) -> dict[str, torch.Tensor]:
        """One frame of each of N independent streams in one batched pass.

        images [N, 3, H, W] or [N, 1, 3, H, W]: frame b continues the sequence held by
        `states[b]` (past its scale phase) and is stored there if `keyframes[b]`. Each stream
        gets what a single-stream `forward` would give it: per-frame work is batched, cache
        attention stays per stream. Returns pose_enc [N, 1, 9], depth [N, 1, H, W, 1], ...
        (no images, no pose_enc_list).
        """
        if images.dim() == 4:
            images = images.unsqueeze(1)
        images = check_images(images, self.config.patch_size, check_values=validate)
        backend = self.attention_backend(images.device, kv_dtype(images))
        with contextlib.ExitStack() as steps:
            for state, store in zip(states, keyframes, strict=True):
                steps.enter_context(state.step(store))
            layers, patch_start = self.aggregator.forward_streams(
                images, num_frame_for_scale=num_frame_for_scale, caches=[s.aggregator for s in states],
                stores=keyframes, backend=backend,
            )
            out, _ = self._heads(
                layers, images, patch_start,
                lambda tokens: self.camera_head.forward_streams(
                    tokens, caches=[s.camera for s in states], stores=list(keyframes)
                ),
                None,
            )
        return out

    def _heads(self, layers, images, patch_start, camera, trace):
        """The heads (in `head_dtype`, autocast off) on the aggregator's selected layers
        [B, S, P, 2C]. `camera` runs the camera head on the camera tokens with the right
        caches. Returns (outputs, the camera head's per-iteration poses or None), fp32."""
        out: dict[str, torch.Tensor] = {}
        poses = None
        image_hw = (images.shape[-2], images.shape[-1])
        with heads_without_autocast(images.device):
            layers = [t.to(self.head_dtype) for t in layers]
            if self.camera_head is not None:
                poses = [p.float() for p in camera(layers[-1][:, :, 0])]
                out["pose_enc"] = poses[-1]
            if self.depth_head is not None:
                out["depth"], out["depth_conf"] = self.depth_head(layers, image_hw, patch_start, trace=trace)
            if self.point_head is not None:
                out["world_points"], out["world_points_conf"] = self.point_head(layers, image_hw, patch_start)
        return {k: v.float() for k, v in out.items()}, poses

    def _default_scale_frames(self) -> int:
        return self.num_frame_for_scale if self.num_frame_for_scale is not None else self.cache_config.scale_frames

    # ------------------------------------------------------------------ high level
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
        `output_device` is None). What remains is the default state's leased cache pages,
        kept for the next call (no memory growth across calls); `free_kv_cache()` returns
        them. Frame i >= scale is a keyframe iff keyframe_interval <= 1 or
        (i - scale) % keyframe_interval == 0. With `flow_threshold` > 0 (the windowed
        module's form of the reference) keyframes are chosen by image motion instead:
        `FlowKeyframes(flow_threshold, max_non_keyframe_gap)`, i.e. the first streaming frame,
        a frame whose mean flow against the last keyframe exceeds `flow_threshold` pixels, or
        one `max_non_keyframe_gap` frames after it.

        A batch [B, S, 3, H, W] is B independent sequences, each run on a clean cache in turn
        (the reference takes batch 1 only, LIMITS.md 14); the outputs are stacked.

        Returns pose_enc [B,S,9], depth [B,S,H,W,1], depth_conf [B,S,H,W] (+ world points),
        images; on `output_device` if given, else on the model's device. progress: a bar over
        each sequence's frames (None: when stderr is a terminal).
        """
        from ..session import Session

        images = check_images(images, self.config.patch_size)
        keyframes = _streaming_keyframes(keyframe_interval, flow_threshold, max_non_keyframe_gap)

        def one_sequence(sequence: torch.Tensor) -> dict[str, torch.Tensor]:
            session = Session(
                self,
                num_scale_frames=num_scale_frames,
                keyframe_interval=keyframes(),
                output_device=output_device,
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
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Long sequences: overlapping windows, each on a clean cache, aligned by Sim(3) and
        stitched (see `mapstream.windowed.inference_windowed`). Leaves no cache populated.
        A batch [B, S, 3, H, W] is B independent sequences, run in turn and stacked."""
        from ..windowed import inference_windowed

        return inference_windowed(
            self,
            images,
            window_size=window_size,
            overlap_size=overlap_size,
            overlap_keyframes=overlap_keyframes,
            num_scale_frames=num_scale_frames,
            scale_mode=scale_mode,
            output_device=output_device,
            keyframe_interval=keyframe_interval,
            **kwargs,
        )

    def session(self, **kwargs: Any):
        """A new online `Session` with caches of its own (see `mapstream.Session`)."""
        from ..session import Session

        return Session(self, **kwargs)


def each_sequence(images: torch.Tensor, run) -> dict[str, Any]:
    """`run(sequence)` on every sequence [1, S, 3, H, W] of the batch `images`, one after
    another; tensors of the outputs are concatenated along the batch, plain values (settings
    echoed back) kept once when every sequence gave the same, anything else (e.g. the raw
    windows) listed per sequence."""
    if images.shape[0] == 1:
        return run(images)
    outs = [run(images[b : b + 1]) for b in range(images.shape[0])]
    merged: dict[str, Any] = {}
    for key in outs[0]:
        values = [out[key] for out in outs]
        if isinstance(values[0], torch.Tensor):
            merged[key] = torch.cat(values)
        else:
            plain = all(isinstance(v, (str, int, float, bool, type(None))) for v in values)
            merged[key] = values[0] if plain and all(v == values[0] for v in values[1:]) else values
    return merged


@contextlib.contextmanager
def heads_without_autocast(device: torch.device):
    """The heads run in the dtype of their weights with autocast off (fp32 by default, as
    the reference does)."""
    if device.type == "cuda":
        with torch.autocast("cuda", enabled=False):
            yield
    else:
        with torch.autocast("cpu", enabled=False):
            yield


def _streaming_keyframes(keyframe_interval, flow_threshold: float, max_non_keyframe_gap: int):
    """`inference_streaming`'s keyframe rule, as a maker called for each sequence: the interval
    as given, or with flow_threshold > 0 a fresh flow policy (a policy remembers its last
    keyframe, so sequences must not share one)."""
    from ..keyframes import FlowKeyframes

    if not flow_threshold > 0:
        return lambda: keyframe_interval
    if keyframe_interval not in (1, None):
        raise ValueError(
            f"give either keyframe_interval ({keyframe_interval!r}) or flow_threshold ({flow_threshold}), "
            "not both: flow_threshold > 0 chooses keyframes by image motion"
        )
    FlowKeyframes(flow_threshold, max_non_keyframe_gap)  # its own error for a bad gap
    return lambda: FlowKeyframes(flow_threshold, max_non_keyframe_gap)
