"""The Geometric Context Transformer for streaming 3D reconstruction: the network.

    images [B, S, 3, H, W] -> aggregator (ViT + 24 x [frame, global] blocks, KV cache)
                           -> camera head (causal, iterative)  -> pose_enc [B, S, 9]
                           -> DPT depth head                    -> depth [B, S, H, W, 1], depth_conf
                           -> DPT point head (optional)         -> world_points, world_points_conf

The network holds weights only. A stream's caches are a `StreamState` passed to `forward`,
which reads and extends them; the attention backend comes in as an argument too. Sessions,
windowed inference, the graphed fast path and the reference's stateful protocol
(`mapstream.compat.GCTStream`) sit above it.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..attention import AttentionBackend
from ..attention.choice import frame_backend
from ..cache import PoolRegistry
from ..config import ModelConfig, StreamConfig, get_preset, split_overrides
from ..geometry import camera_matrices
from ..heads import CameraCausalHead, DPTHead
from ..layers.quantized import is_quantized, quantize_linears
from ..validation import check_images, compute_dtype
from .aggregator import AggregatorStream, Trace, kv_dtype
from .compile import CompileOptions, compiler
from .state import StreamState

__all__ = ["GCTNetwork", "heads_without_autocast"]

log = logging.getLogger(__name__)

class GCTNetwork(nn.Module):
    """LingBot-Map's network; state-dict compatible with the official checkpoints.

    Args:
        config: architecture (default: the official `lingbot-map` preset's).
        stream: the stream settings this network's sessions start from (default: the
            preset's); configuration, not state.
        compile: build with torch.compile'd static parts (`CompileOptions`; True: the
            defaults). Compiling is slow at the first frame of each size, faster after on GPUs.
        **overrides: reference constructor arguments (`kv_cache_sliding_window`,
            `enable_3d_rope`, `enable_point`, ...) or `ModelConfig`/`StreamConfig` fields.
    """

    def __init__(
        self,
        config: ModelConfig | None = None,
        stream: StreamConfig | None = None,
        *,
        compile: CompileOptions | bool | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        preset = get_preset("lingbot-map")
        config, stream, inert = split_overrides(config or preset.model, stream or preset.stream, overrides)
        if inert:
            log.info("ignoring reference arguments with no effect at inference: %s", ", ".join(inert))
        self.config = config
        self.stream_config = stream
        head_dim_in = 2 * config.embed_dim
        self.aggregator = AggregatorStream(config)
        self.camera_head = CameraCausalHead(
            head_dim_in, trunk_depth=config.camera_trunk_depth, num_heads=config.camera_num_heads,
            num_iterations=config.camera_num_iterations,
        ) if config.enable_camera else None
        # Registration order fixes the state-dict order: camera, point, depth.
        self.point_head = DPTHead.for_config(config, output_dim=4, activation="inv_log") if config.enable_point else None
        self.depth_head = DPTHead.for_config(config, output_dim=2, activation="exp") if config.enable_depth else None
        self.compile_options = CompileOptions() if compile is True else (compile or None)
        self.trunk_weights = "auto"  # how the trunk's linear weights are stored (`quantize_trunk`)
        if self.compile_options is not None:
            self._compile_parts(self.compile_options)

    def _compile_parts(self, options: CompileOptions) -> None:
        compile = compiler(options)
        self.aggregator.compile_parts(compile)
        if self.camera_head is not None:
            self.camera_head.compile_parts(compile)
        self.camera_matrices = compile(camera_matrices)
        for head in (self.depth_head, self.point_head) if options.heads else ():
            if head is not None:
                head.compile_parts(compile)

    # (T_world_cam, T_cam_world, K) of pose encodings, for predictions.
    camera_matrices = staticmethod(camera_matrices)

    def new_state(self, stream: StreamConfig | None = None, *, pools: PoolRegistry | None = None) -> StreamState:
        """Empty caches for one new sequence, keeping what `stream` says (default: this
        network's `stream_config`), their pages from `pools` (default: the shared pools)."""
        spec = (stream or self.stream_config).cache_spec()
        aggregator = self.aggregator.new_cache(stream or self.stream_config, pools)
        camera = self.camera_head.new_cache(spec, pools) if self.camera_head is not None else None
        return StreamState(aggregator, camera)

    def cache_bytes(
        self, frame_hw: tuple[int, int], stream: StreamConfig | None = None, *, dtype: torch.dtype,
        head_dtype: torch.dtype | None = None,
    ) -> int:
        """The bytes one sequence's caches lease for frames of `frame_hw` (H, W) kept as
        `stream` says (default: this network's `stream_config`): the aggregator's keys and
        values computed in `dtype` (stored as `stream.kv_dtype` says) and the camera head's in
        `head_dtype` (default: the heads' own). Nothing is allocated."""
        height, width = frame_hw
        p = self.config.patch_size
        if height % p or width % p:
            raise ValueError(f"frame {height}x{width}: both sides must be multiples of the patch size {p}")
        state = self.new_state(stream)
        grid = (height // p, width // p)
        layout = self.aggregator.cache_layout(self.aggregator.patch_start_idx + grid[0] * grid[1], state.aggregator,
                                              grid)
        total = state.aggregator.lease_bytes(layout, dtype)
        if state.camera is not None:
            camera = self.camera_head.cache_layout(2 * self.config.embed_dim)
            total += state.camera.lease_bytes(camera, head_dtype or self.head_dtype)
        return total

    def cast_for_inference(self, dtype: torch.dtype | str, *, heads: bool = False) -> "GCTNetwork":
        """Cast the aggregator's weights to `dtype` (bf16/fp16 for GPU inference, as the
        reference demo does) and return self. The normalisation constants stay fp32 (the
        reference rounds those to bf16 as a side effect; we do not); the dense heads'
        convolution weights are laid out channels-last.

        The heads stay fp32 (the reference's choice) unless `heads=True`: then they are cast
        too and run in `dtype`, faster on a GPU, their outputs within `dtype`'s rounding of
        the fp32 heads'. Outputs are fp32 either way."""
        dtype = compute_dtype(dtype)
        for param in self.aggregator.parameters():
            if not is_quantized(param):  # quantized weights keep their form (`quantize_trunk`)
                param.data = param.data.to(dtype)
        if heads:
            for head in self._head_modules():
                head.to(dtype)
        for head in (self.depth_head, self.point_head):
            if head is not None:  # values unchanged; NHWC convolutions (see DPTHead)
                head.to(memory_format=torch.channels_last)
        return self

    def quantize_trunk(self, weights: str) -> "GCTNetwork":
        """Store the trunk's large linear layers' weights in 8 bits (`mapstream.layers.quantized`:
        "int8" weight-only, "fp8" with FP8 products; "auto" leaves them) and return self. Call
        after `cast_for_inference`: the products run in the dtype the weights were in."""
        quantize_linears(self.aggregator, weights)
        if weights != "auto":
            self.trunk_weights = weights
        return self

    @property
    def dense_chunk_frames(self) -> int:
        """Frames the dense heads take at a time (the scale phase's frames pass in chunks of
        this many: fewer hold less memory at once). The same outputs whatever the chunk."""
        heads = [h for h in (self.depth_head, self.point_head) if h is not None]
        return heads[0].chunk_frames if heads else self.config.dpt_chunk_frames

    @dense_chunk_frames.setter
    def dense_chunk_frames(self, frames: int) -> None:
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ValueError(f"dense_chunk_frames must be a positive int, got {frames!r}")
        for head in (self.depth_head, self.point_head):
            if head is not None:
                head.chunk_frames = frames

    def _head_modules(self) -> list[nn.Module]:
        return [h for h in (self.camera_head, self.depth_head, self.point_head) if h is not None]

    @property
    def head_dtype(self) -> torch.dtype:
        """The dtype the heads compute in: that of their weights (fp32 unless
        `cast_for_inference(..., heads=True)`)."""
        for head in self._head_modules():
            return next(head.parameters()).dtype
        return torch.float32

    def attention_backend(self, device: torch.device, dtype: torch.dtype, name: str | None = None) -> AttentionBackend:
        """The aggregator's cache-attention backend `name` (default: this network's stream
        setting) for K/V of `dtype` on `device`."""
        return frame_backend(name or self.stream_config.backend, device, dtype)

    @torch.no_grad()
    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The ViT's normalised patch tokens of frames [S, 3, H, W] in [0, 1]: [S, H/p, W/p, C]
        (stateless; what a place descriptor is pooled from, `mapstream.globalmap`)."""
        images = check_images(images, self.config.patch_size)[0]
        return self.aggregator.patch_tokens(images).float()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        images: torch.Tensor,
        state: StreamState,
        *,
        store: bool = True,
        num_frame_for_scale: int | None = None,
        backend: AttentionBackend | None = None,
        trace: Trace | None = None,
        validate: bool = True,
    ) -> dict[str, torch.Tensor]:
        """One step of the stream held by `state` over the frames in `images`.

        Args:
            images: [S, 3, H, W] or [1, S, 3, H, W] RGB in [0, 1], H and W multiples of 14.
            state: the sequence's caches (`new_state()`), read and extended.
            store: keep these frames in the caches (False: attend, then forget them).
            num_frame_for_scale: scale frames of the sequence (the scale token's copy 0 goes
                to its first this-many frames). Default: the network's stream setting.
            backend: the aggregator's cache-attention backend (default: `attention_backend`).
            validate: check values (range, NaN) as well as shapes; costs a device sync.
        Returns:
            pose_enc [1,S,9], pose_enc_list (per camera iteration), depth [1,S,H,W,1],
            depth_conf [1,S,H,W], and world_points [1,S,H,W,3], world_points_conf [1,S,H,W]
            with a point head; fp32.
        """
        images = check_images(images, self.config.patch_size, check_values=validate)
        if images.shape[0] != 1:
            raise ValueError(
                f"batch size {images.shape[0]}: a streaming state serves one sequence; run one session per sequence, "
                "or model.inference_streaming(images) for a batch of whole sequences"
            )
        scale = num_frame_for_scale if num_frame_for_scale is not None else self.stream_config.num_scale_frames
        backend = backend or self.attention_backend(images.device, kv_dtype(images))
        with state.step(store):
            layers, patch_start = self.aggregator(
                images, num_frame_for_scale=scale, cache=state.aggregator, store=store, backend=backend, trace=trace
            )
            return self.heads(
                layers, images.shape[-2:], patch_start,
                lambda token: self.camera_head(token, cache=state.camera, store=store, trace=trace), trace=trace,
            )

    def forward_streams(
        self,
        images: torch.Tensor,
        states: Sequence[StreamState],
        *,
        stores: Sequence[bool],
        num_frame_for_scale: Sequence[int],
        backend: AttentionBackend | None = None,
        validate: bool = True,
    ) -> dict[str, torch.Tensor]:
        """One frame of each of N independent streams in one batched pass.

        images [N, 3, H, W] or [N, 1, 3, H, W]: frame b continues the sequence held by
        `states[b]` (past its scale phase) and is stored there if `stores[b]`. Per-frame work
        is batched, cache attention stays per stream. Returns pose_enc [N, 1, 9],
        depth [N, 1, H, W, 1], ... (no pose_enc_list).
        """
        if images.dim() == 4:
            images = images.unsqueeze(1)
        images = check_images(images, self.config.patch_size, check_values=validate)
        backend = backend or self.attention_backend(images.device, kv_dtype(images))
        with contextlib.ExitStack() as steps:
            for state, store in zip(states, stores, strict=True):
                steps.enter_context(state.step(store))
            layers, patch_start = self.aggregator.forward_streams(
                images, num_frame_for_scale=num_frame_for_scale, caches=[s.aggregator for s in states],
                stores=stores, backend=backend,
            )
            out = self.heads(
                layers, images.shape[-2:], patch_start,
                lambda token: self.camera_head.forward_streams(
                    token, caches=[s.camera for s in states], stores=list(stores)
                ),
            )
        out.pop("pose_enc_list", None)
        return out

    def heads(
        self,
        layers: list[torch.Tensor],
        image_hw: Sequence[int],
        patch_start: int,
        camera: Callable[[torch.Tensor], list[torch.Tensor]] | None,
        *,
        trace: Trace | None = None,
        dense_autocast: bool = False,
        dense: bool = True,
    ) -> dict[str, torch.Tensor]:
        """The heads on the aggregator's selected layers [B, S, P, 2C], in `head_dtype` with
        autocast off. `camera(tokens)` runs the camera head on the camera tokens [B, S, 2C]
        with the stream's caches (None: no camera prediction). Returns fp32 outputs, with
        the camera head's per-iteration poses as pose_enc_list. dense_autocast: the depth and
        point heads run under the caller's autocast instead (training in bf16: the full-
        resolution DPT activations are most of a step's memory traffic). dense=False: the
        camera head alone (a training step that supervises only the camera)."""
        out: dict[str, Any] = {}
        image_hw = tuple(image_hw)
        with heads_without_autocast(layers[0].device):
            own = [t.to(self.head_dtype) for t in layers]
            if self.camera_head is not None and camera is not None:
                poses = [p.float() for p in camera(own[-1][:, :, 0])]
                out["pose_enc"], out["pose_enc_list"] = poses[-1], poses
            if dense and not dense_autocast:
                out.update(self.dense_heads(own, image_hw, patch_start, trace=trace))
        if dense and dense_autocast:
            out.update(self.dense_heads(layers, image_hw, patch_start, trace=trace))
        return out

    def dense_heads(
        self, layers: list[torch.Tensor], image_hw: Sequence[int], patch_start: int, *, trace: Trace | None = None
    ) -> dict[str, torch.Tensor]:
        """The depth (and point) heads on the selected layers, already in `head_dtype`: fp32
        depth [B,S,H,W,1], depth_conf [B,S,H,W] (and world points)."""
        out: dict[str, torch.Tensor] = {}
        if self.depth_head is not None:
            out["depth"], out["depth_conf"] = self.depth_head(layers, tuple(image_hw), patch_start, trace=trace)
        if self.point_head is not None:
            out["world_points"], out["world_points_conf"] = self.point_head(layers, tuple(image_hw), patch_start)
        return {k: v.float() for k, v in out.items()}


@contextlib.contextmanager
def heads_without_autocast(device: torch.device):
    """The heads run in the dtype of their weights with autocast off (fp32 by default, as
    the reference does)."""
    with torch.autocast("cuda" if device.type == "cuda" else "cpu", enabled=False):
        yield
