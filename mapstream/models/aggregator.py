"""The aggregator: DINOv2 patch tokens + special tokens through alternating frame / global
attention, with the global attention reading and writing a streaming KV cache.

Per frame the trunk sees P = 6 + h*w tokens laid out as::

    [camera, register x4, scale, patch_0 ... patch_{h*w-1}]

Frame blocks attend within a frame (2D RoPE); global blocks attend across frames through
the cache (3D video RoPE in the official model). The outputs of the selected layers are
[frame-block output, global-block output] concatenated along channels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterator, NamedTuple, Sequence

import torch
from torch import nn

from ..attention import AttentionBackend, KeyNormHint
from ..cache import (
    CacheStateError, PoolRegistry, StreamCacheManager, TokenLayout, attend_streams, open_steps,
    reference_cache, shared_pools,
)
from ..config import ModelConfig, StreamConfig
from ..layers import Block, PatchEmbedViT, Rotary, patch_positions_2d, rope2d, rope3d, token_positions_3d
from .key_norms import KeyNormHints

__all__ = ["AggregatorStream", "LayerEntry", "LayerExit", "kv_dtype", "Trace"]

Trace = Callable[[str, torch.Tensor], None]
"""Optional observer of intermediate tensors (name, tensor); used by parity tests."""

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class LayerEntry(NamedTuple):
    """What a layer hands to its global block's cache attention: frame block i's output
    [B, S, P, C], the global block's input [B, S*P, C], and its q, k, v [B, heads, S*P, D]."""

    frame_out: torch.Tensor
    seq: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


class LayerExit(NamedTuple):
    """The work between two cache attentions: global block i-1's output [B, S*P, C], then
    layer i's `LayerEntry` fields."""

    global_out: torch.Tensor
    frame_out: torch.Tensor
    seq: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    @property
    def entry(self) -> LayerEntry:
        return LayerEntry(self.frame_out, self.seq, self.q, self.k, self.v)


def _enter(frame_block, global_block, tokens, frame_rotary, global_rotary, streams: int) -> LayerEntry:
    """Frame block, then the global block's attention inputs (`AggregatorStream.enter_layer`)."""
    frames = tokens.shape[0] // streams
    tokens = frame_block(tokens, frame_rotary)
    seq = tokens.view(streams, frames * tokens.shape[1], -1)
    q, k, v = global_block.attention_inputs(seq, global_rotary)
    return LayerEntry(tokens.view(streams, frames, tokens.shape[1], -1), seq, q, k, v)


def _between_layers(prev_global, frame_block, next_global, seq, attended, tokens_per_frame, frame_rotary,
                    global_rotary, streams: int) -> LayerExit:
    """`AggregatorStream.between_layers` on the blocks themselves (what a compiled network
    compiles: one graph serves every layer, the blocks' weights being its inputs)."""
    leaving = prev_global.attention_output(seq, attended)
    tokens = leaving.view(-1, tokens_per_frame, leaving.shape[-1])
    return LayerExit(leaving, *_enter(frame_block, next_global, tokens, frame_rotary, global_rotary, streams))


class AggregatorStream(nn.Module):
    """The trunk (weights only): a step's caches and attention backend come in as arguments."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        dim = c.embed_dim
        # Copy 0 of each special token is for the first frame (camera, registers) or the scale
        # frames (scale); copy 1 for every other frame.
        self.camera_token = nn.Parameter(torch.zeros(1, 2, 1, dim))
        self.register_token = nn.Parameter(torch.zeros(1, 2, c.num_register_tokens, dim))
        self.scale_token = nn.Parameter(torch.zeros(1, 2, 1, dim))
        self.patch_embed = PatchEmbedViT(
            img_size=c.img_size,
            patch_size=c.patch_size,
            dim=dim,
            depth=c.vit_depth,
            num_heads=c.vit_num_heads,
            num_registers=c.vit_num_registers,
            mlp_ratio=c.mlp_ratio,
        )

        def trunk_block() -> Block:
            return Block(dim, c.num_heads, mlp_ratio=c.mlp_ratio, norm_eps=1e-5, qk_norm=True, layer_scale_init=0.01)

        self.frame_blocks = nn.ModuleList(trunk_block() for _ in range(c.depth))
        self.global_blocks = nn.ModuleList(trunk_block() for _ in range(c.depth))
        self.register_buffer("_resnet_mean", torch.tensor(_IMAGENET_MEAN).view(1, 1, 3, 1, 1), persistent=False)
        self.register_buffer("_resnet_std", torch.tensor(_IMAGENET_STD).view(1, 1, 3, 1, 1), persistent=False)
        self.key_norm_hints = KeyNormHints(self.global_blocks)

    def key_norms(self) -> tuple[KeyNormHint | None, ...]:
        """Each global block's key-norm hint for its cache attention of the next step
        (`KeyNormHints`; call outside CUDA graph capture)."""
        return self.key_norm_hints.current()

    @property
    def patch_start_idx(self) -> int:
        return self.config.num_special_tokens

    def new_cache(self, stream: StreamConfig | None = None, pools: PoolRegistry | None = None) -> StreamCacheManager:
        """An empty cache for one sequence with the retention of `stream` (default settings
        when None), its pages leased from `pools` (the process's shared pools when None)."""
        stream = stream or StreamConfig()
        spec = dataclasses.replace(stream.cache_spec(), kv_dtype=stream.kv_dtype)
        return StreamCacheManager(spec, pools if pools is not None else shared_pools(), name="aggregator")

    # The reference's stateful protocol: its default cache is held by `mapstream.cache`'s
    # registry of reference caches, not by this module (`mapstream.compat`).
    def clean_kv_cache(self) -> None:
        """Forget every frame of the reference protocol's default cache."""
        self.kv_cache_manager.reset()

    @property
    def kv_cache_manager(self) -> StreamCacheManager:
        """The reference protocol's default cache (its `reset()` is what `clean_kv_cache`
        calls); created with default settings unless a `GCTStream` registered its own."""
        return reference_cache(self, self.new_cache)

    @kv_cache_manager.setter
    def kv_cache_manager(self, value: None) -> None:
        # The reference discards its manager (`= None`) to change resolution between
        # sequences; here that releases the default cache's pages, and the next sequence
        # leases storage of its own shape (a reset alone would do).
        if value is not None:
            raise TypeError("aggregator.kv_cache_manager can only be set to None (to release the default cache)")
        self.kv_cache_manager.reset(release=True)

    @property
    def total_frames_processed(self) -> int:
        """Stored frames of the reference protocol's default cache (the 3D-RoPE time counter)."""
        return self.kv_cache_manager.frames_stored

    # ------------------------------------------------------------------ tokens
    def special_tokens(self, num_frames: int, stored: int, num_frame_for_scale: int) -> torch.Tensor:
        """Special tokens [S, 6, C] for one stream's frames with indices stored .. stored+S-1."""
        index = torch.arange(stored, stored + num_frames, device=self.camera_token.device)
        first = (index == 0).long()  # copy 0 only for the very first frame of a sequence
        scale_limit = max(min(num_frame_for_scale, stored + num_frames), 1)
        scale_copy = 1 - (index < scale_limit).long()
        camera = self.camera_token[0, 1 - first]  # [S, 1, C]
        registers = self.register_token[0, 1 - first]
        scale = self.scale_token[0, scale_copy]
        return torch.cat((camera, registers, scale), dim=1)  # [S, 6, C]

    def global_rotary(self, stored: int, num_frames: int, grid_h: int, grid_w: int, pos2d: torch.Tensor) -> Rotary | None:
        c = self.config
        if c.disable_global_rope:
            return None
        if c.enable_3d_rope:
            frames = torch.arange(stored, stored + num_frames, device=pos2d.device)
            pos3d = token_positions_3d(frames, grid_h, grid_w, c.num_special_tokens)
            return rope3d(pos3d, c.rope3d_dims, c.rope3d_theta)
        return rope2d(pos2d.repeat(num_frames, 1), c.head_dim, c.rope2d_frequency)

    def _check_rope_range(self, grid_h: int, grid_w: int) -> None:
        c = self.config
        if c.enable_3d_rope and c.num_special_tokens + max(grid_h, grid_w) > c.max_frame_num:
            raise ValueError(
                f"max_frame_num={c.max_frame_num} is too small for a {grid_h}x{grid_w} patch grid: the 3D RoPE "
                f"needs max_frame_num >= {c.num_special_tokens + max(grid_h, grid_w)}"
            )

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        images: torch.Tensor,
        *,
        num_frame_for_scale: int,
        cache: StreamCacheManager,
        store: bool = True,
        backend: AttentionBackend,
        trace: Trace | None = None,
    ) -> tuple[list[torch.Tensor], int]:
        """Run one step of S frames.

        Args:
            images: [B, S, 3, H, W] in [0, 1]; B must be 1 (one stream per cache).
            num_frame_for_scale: frames of the sequence that get the scale token's copy 0.
            cache: the sequence's cache.
            store: keep these frames in the cache (keyframes) or only attend (non-keyframes).
            backend: the cache attention's backend (`mapstream.attention.frame_backend`).
        Returns:
            ([B, S, P, 2C] for each selected layer], patch_start_idx).
        """
        return self._step(images, [cache], [store], [num_frame_for_scale], backend, trace)

    def forward_streams(
        self,
        images: torch.Tensor,
        *,
        num_frame_for_scale: Sequence[int],
        caches: Sequence[StreamCacheManager],
        stores: Sequence[bool],
        backend: AttentionBackend,
    ) -> tuple[list[torch.Tensor], int]:
        """One single-frame step of N independent streams in one pass.

        images [N, 1, 3, H, W]: frame b belongs to the stream of `caches[b]` (one frame per
        stream). Everything per frame (ViT, frame blocks, projections, MLPs) runs batched;
        each stream's global attention reads and writes only its own cache, with its own
        3D-RoPE time index. Returns what `forward` returns, with B = N and S = 1.
        """
        streams, num_frames = images.shape[:2]
        if num_frames != 1 or not streams == len(caches) == len(stores) == len(num_frame_for_scale):
            raise ValueError(
                f"forward_streams takes one frame per stream: images {list(images.shape)} for "
                f"{len(caches)} caches, {len(stores)} store flags, {len(num_frame_for_scale)} scale counts"
            )
        if len({id(cache) for cache in caches}) != streams:
            raise ValueError("each stream needs its own cache (the same cache appears twice)")
        return self._step(images, caches, stores, num_frame_for_scale, backend, None)

    def _step(
        self,
        images: torch.Tensor,
        caches: Sequence[StreamCacheManager],
        stores: Sequence[bool],
        scale_counts: Sequence[int],
        backend: AttentionBackend,
        trace: Trace | None,
    ) -> tuple[list[torch.Tensor], int]:
        """One step of B streams (batch row b: S frames of the stream of `caches[b]`)."""
        c = self.config
        streams, num_frames, _, height, width = images.shape
        if streams != len(caches):
            raise CacheStateError("a streaming cache serves one sequence (batch size 1); use one session per stream")
        grid_h, grid_w = height // c.patch_size, width // c.patch_size
        self._check_rope_range(grid_h, grid_w)
        # Each stream's special-token copies and 3D-RoPE time indices follow its own count of
        # stored frames.
        special = torch.cat([
            self.special_tokens(num_frames, cache.frames_stored, nfs) for cache, nfs in zip(caches, scale_counts)
        ])
        tokens = self.embed(images, special, trace)  # [B*S, P, C]
        per_frame = tokens.shape[1]
        pos2d = patch_positions_2d(grid_h, grid_w, c.num_special_tokens, tokens.device)
        frame_rotary = rope2d(pos2d, c.head_dim, c.rope2d_frequency)
        global_rotary = stack_rotary(
            [self.global_rotary(cache.frames_stored, num_frames, grid_h, grid_w, pos2d) for cache in caches]
        )
        selected: dict[int, torch.Tensor] = {}
        with open_steps(
            caches, stores, num_frames=num_frames,
            layout=lambda cache: self.cache_layout(per_frame, cache, (grid_h, grid_w)),
            dtype=kv_dtype(tokens), device=tokens.device,
        ) as steps:
            entered = self.enter_layer(0, tokens, frame_rotary, global_rotary, streams=streams)
            key_norms = self.key_norms()
            layers = self.run_layers(
                entered,
                lambda i, q, k, v: attend_streams(steps, i, q, k, v, functools.partial(backend.attend, key_norm=key_norms[i])),
                per_frame, frame_rotary, global_rotary, streams=streams,
            )
            for i, frame_out, out in layers:
                if trace:
                    trace(f"agg.frame_blocks.{i}", frame_out.flatten(0, 1))
                    trace(f"agg.global_blocks.{i}", out)
                if i in c.selected_layers:
                    selected[i] = torch.cat((frame_out, out.view(streams, num_frames, per_frame, -1)), dim=-1)
        outputs = [selected[i] for i in c.selected_layers]
        if trace:
            for j, out in enumerate(outputs):
                trace(f"agg.out.{j}", out)
        return outputs, c.num_special_tokens

    # ------------------------------------------------------------------ the pieces of a step
    # A step is: embed -> for each layer i: enter_layer(i) -> cache attention -> leave_layer(i),
    # where leave_layer(i - 1) + enter_layer(i) run as one `between_layers(i)`; `run_layers`
    # chains them around a given cache attention (`forward`, the whole-step graph), the
    # pieces mode splits the chain between graphs at the attentions.
    # Everything but the cache attention has shapes fixed by the frame size, which is what
    # lets a fast path capture these pieces in CUDA graphs (mapstream.fast).
    def embed(self, images: torch.Tensor, special: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
        """Normalised images [B, S, 3, H, W] + special tokens [B*S, 6, C] -> tokens [B*S, P, C]."""
        batch, num_frames, _, height, width = images.shape
        x = (images - self._resnet_mean) / self._resnet_std
        x = x.to(self.camera_token.dtype)  # weights cast for inference (bf16) take bf16 input
        patches = self.patch_embed(x.reshape(batch * num_frames, 3, height, width))
        tokens = torch.cat((special.to(patches.dtype), patches), dim=1)
        if trace:
            trace("agg.patch_tokens", patches)
            trace("agg.tokens_in", tokens)
        return tokens

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The ViT's normalised patch tokens of images [S, 3, H, W] in [0, 1] -> [S, H/p, W/p, C]:
        a frame's own appearance, before any attention across frames (no cache is read)."""
        x = (images[None] - self._resnet_mean) / self._resnet_std
        tokens = self.patch_embed(x[0].to(self.camera_token.dtype))
        p = self.config.patch_size
        return tokens.reshape(images.shape[0], images.shape[-2] // p, images.shape[-1] // p, -1)

    def enter_layer(
        self, i: int, tokens: torch.Tensor, frame_rotary: Rotary, global_rotary: Rotary | None, *, streams: int = 1
    ) -> LayerEntry:
        """Frame block i on tokens [B*S, P, C] (B streams of S frames), then global block i's
        attention inputs."""
        return _enter(self.frame_blocks[i], self.global_blocks[i], tokens, frame_rotary, global_rotary, streams)

    def leave_layer(self, i: int, seq: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Global block i's output from its input [B, S*P, C] and its attention result."""
        return self.global_blocks[i].attention_output(seq, attended)

    def between_layers(
        self, i: int, seq: torch.Tensor, attended: torch.Tensor, tokens_per_frame: int,
        frame_rotary: Rotary, global_rotary: Rotary | None, *, streams: int = 1,
    ) -> LayerExit:
        """`leave_layer(i - 1)`, then `enter_layer(i)` on its output: all the work between two
        cache attentions, as one function, so that a compiled network (`compile_parts`) fuses
        across the blocks' boundaries (a block's last residual add with the next block's
        first norm, one kernel where there were two)."""
        return self._between(
            self.global_blocks[i - 1], self.frame_blocks[i], self.global_blocks[i],
            seq, attended, tokens_per_frame, frame_rotary, global_rotary, streams,
        )

    _between = staticmethod(_between_layers)  # a compiled network uses a compiled one (`compile_parts`)

    def compile_parts(self, compile) -> None:
        """Use compiled forms of the per-frame parts whose shapes are static within a phase:
        the ViT's blocks, the work between two cache attentions (one graph serves every
        layer: the blocks' weights are its inputs, and a block's last residual add fuses
        with the next block's first norm), and the blocks' halves for the callers that run
        a layer alone. Called once, when the network is built to be compiled."""
        self.patch_embed.compile_parts(compile)
        self._between = compile(_between_layers)
        for block in self.frame_blocks:
            block.compile_parts(compile, whole=True)
        for block in self.global_blocks:
            block.compile_parts(compile, whole=False)

    def run_layers(
        self, entered: LayerEntry, attend: Callable, tokens_per_frame: int, frame_rotary: Rotary,
        global_rotary: Rotary | None, *, streams: int = 1,
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """The trunk from `enter_layer(0)`'s result, layer i's cache attention being
        `attend(i, q, k, v)` (eager cache steps in `forward`, a graph-safe `DeviceStep` in the
        whole-step graph). Yields (i, frame block i's output [B, S, P, C], global block i's
        output [B, S*P, C]) as each layer finishes."""
        layer = entered
        depth = self.config.depth
        for i in range(depth):
            attended = attend(i, layer.q, layer.k, layer.v)
            if i + 1 == depth:
                yield i, layer.frame_out, self.leave_layer(i, layer.seq, attended)
                return
            leaving = self.between_layers(
                i + 1, layer.seq, attended, tokens_per_frame, frame_rotary, global_rotary, streams=streams
            )
            yield i, layer.frame_out, leaving.global_out
            layer = leaving.entry

    def cache_layout(
        self, tokens_per_frame: int, cache: StreamCacheManager, patch_grid: tuple[int, int]
    ) -> TokenLayout:
        c = self.config
        return TokenLayout(
            num_layers=c.depth,
            num_heads=c.num_heads,
            head_dim=c.head_dim,
            tokens_per_frame=tokens_per_frame,
            trajectory_tokens=_TRAJECTORY_TOKENS[cache.spec.trajectory_keep](c.num_special_tokens),
            patch_grid=patch_grid,
        )


def stack_rotary(rotaries: Sequence[Rotary | None]) -> Rotary | None:
    """Per-stream rotation tables [N_tokens, D/2] -> one table [streams, 1, N_tokens, D/2] that
    broadcasts over the heads of q, k [streams, heads, N_tokens, D]."""
    if rotaries[0] is None:
        return None
    if len(rotaries) == 1:
        return rotaries[0]
    return dataclasses.replace(
        rotaries[0],
        cos=torch.stack([r.cos for r in rotaries]).unsqueeze(1),
        sin=torch.stack([r.sin for r in rotaries]).unsqueeze(1),
    )


def kv_dtype(tokens: torch.Tensor) -> torch.dtype:
    """Storage dtype of the cache: the attention's compute dtype (the autocast dtype under
    autocast, where the residual stream stays fp32 but attention runs in bf16/fp16)."""
    device_type = tokens.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tokens.dtype


_TRAJECTORY_TOKENS = {"specials": lambda n: n, "camera": lambda n: 1, "none": lambda n: 0}
