"""The causal camera head: iterative pose refinement over one camera token per frame.

Each frame's camera token (token 0 of the last aggregator output, 2C wide) is refined in
`num_iterations` passes. Pass `it` embeds the running (pre-activation) pose estimate,
modulates the normalised token with it (adaLN: shift, scale, gate), runs the trunk blocks
with attention over the camera tokens of earlier stored frames, and adds a pose delta.

The trunk attention of pass `it`, block `j` reads and writes its own cache layer
(it * trunk_depth + j): the block inputs differ per pass, so their keys do too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend
from ..attention.choice import camera_backend
from ..cache import CacheSpec, PoolRegistry, StreamCacheManager, TokenLayout, attend_streams, open_steps
from ..cache import reference_cache, shared_pools
from ..config import DEFAULT_CAMERA_ITERATIONS, StreamConfig
from ..layers import Block, Mlp

__all__ = ["CameraCausalHead", "activate_pose"]

POSE_DIM = 9  # translation (3), quaternion xyzw (4), fov_h, fov_w


def activate_pose(raw: torch.Tensor) -> torch.Tensor:
    """Pose encoding from the raw accumulator: translation and quaternion linear, FoV ReLU."""
    return torch.cat((raw[..., :7], F.relu(raw[..., 7:9])), dim=-1)


class CameraCausalHead(nn.Module):
    def __init__(
        self,
        dim_in: int,
        *,
        trunk_depth: int = 4,
        num_heads: int = 16,
        num_iterations: int = DEFAULT_CAMERA_ITERATIONS,
    ) -> None:
        super().__init__()
        self.num_iterations = num_iterations
        self.num_heads = num_heads
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, POSE_DIM))
        self.trunk = nn.ModuleList(
            Block(dim_in, num_heads, mlp_ratio=4.0, norm_eps=1e-5, qk_norm=False, layer_scale_init=0.01)
            for _ in range(trunk_depth)
        )
        self.token_norm = nn.LayerNorm(dim_in)
        self.trunk_norm = nn.LayerNorm(dim_in)
        self.adaln_norm = nn.LayerNorm(dim_in, eps=1e-6, elementwise_affine=False)
        self.embed_pose = nn.Linear(POSE_DIM, dim_in)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim_in, 3 * dim_in))
        self.pose_branch = Mlp(dim_in, dim_in // 2, POSE_DIM)

    def attention_backend(self, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
        """The backend of the trunk's cache attention (`mapstream.attention.choice.camera_backend`)."""
        return camera_backend(device, dtype)

    def new_cache(self, spec: CacheSpec | None = None, pools: PoolRegistry | None = None) -> StreamCacheManager:
        """An empty cache for one sequence; `spec` must be the aggregator cache's (default: the
        default stream settings'), pages from `pools` (default: the shared pools)."""
        spec = spec if spec is not None else StreamConfig().cache_spec()
        return StreamCacheManager(spec, pools if pools is not None else shared_pools(), name="camera_head")

    # The reference's stateful protocol: its default cache is held by `mapstream.cache`'s
    # registry of reference caches, not by this module (`mapstream.compat`).
    def clean_kv_cache(self) -> None:
        """Forget every frame of the reference protocol's default cache."""
        self.kv_cache.reset()

    @property
    def kv_cache(self) -> StreamCacheManager:
        """The reference protocol's default cache (created on first use unless a `GCTStream`
        registered its own)."""
        return reference_cache(self, self.new_cache)

    def forward(
        self,
        camera_tokens: torch.Tensor,
        *,
        cache: StreamCacheManager,
        store: bool = True,
        trace=None,
    ) -> list[torch.Tensor]:
        """camera_tokens [B, S, 2C] (token 0 of every frame of the last aggregator output),
        refined with the sequence's camera cache `cache`.

        Returns the activated pose encoding [B, S, 9] after every iteration (last = final).
        """
        return self._refine(camera_tokens, [cache], [store], trace)

    def forward_streams(
        self, camera_tokens: torch.Tensor, *, caches: list[StreamCacheManager], stores: list[bool]
    ) -> list[torch.Tensor]:
        """One frame of N independent streams: camera_tokens [N, 1, 2C], row b refined with
        the cache `caches[b]` (see `AggregatorStream.forward_streams`)."""
        if camera_tokens.shape[:2] != (len(caches), 1):
            raise ValueError(f"camera tokens {list(camera_tokens.shape)} for {len(caches)} streams of one frame")
        return self._refine(camera_tokens, caches, stores, None)

    def cache_layout(self, dim: int) -> TokenLayout:
        """The camera cache's layout for camera tokens `dim` wide: one token a frame, one
        cache layer per (iteration, trunk block)."""
        return TokenLayout(
            num_layers=self.num_iterations * len(self.trunk),
            num_heads=self.num_heads,
            head_dim=dim // self.num_heads,
            tokens_per_frame=1,
            trajectory_tokens=1,
        )

    def _refine(self, camera_tokens: torch.Tensor, caches, stores, trace) -> list[torch.Tensor]:
        layout = self.cache_layout(camera_tokens.shape[-1])
        backend = self.attention_backend(camera_tokens.device, camera_tokens.dtype)
        with open_steps(
            caches, stores, num_frames=camera_tokens.shape[1], layout=lambda cache: layout,
            dtype=camera_tokens.dtype, device=camera_tokens.device,
        ) as steps:
            return self.refine(
                camera_tokens,
                lambda layer, q, k, v: attend_streams(steps, layer, q, k, v, backend.attend),
                trace,
            )

    def refine(self, camera_tokens: torch.Tensor, attend, trace=None) -> list[torch.Tensor]:
        """The refinement passes with the trunk's cache attention delegated to
        `attend(layer, q, k, v)` (the caller owns the cache steps: eager `Step`s here, a
        graph-safe `DeviceStep` in `mapstream.fast`). Returns the pose after every pass."""
        batch, num_frames, _ = camera_tokens.shape
        depth = len(self.trunk)
        base, normed = self.normalize(camera_tokens)
        if trace:
            trace("cam.pose_tokens_normed", base)
        raw = None
        poses = []
        for it in range(self.num_iterations):
            pose_in = self.empty_pose_tokens.expand(batch, num_frames, -1) if raw is None else raw
            x = self.modulate(base, normed, pose_in)
            for j, block in enumerate(self.trunk):
                q, k, v = block.attention_inputs(x)
                x = block.attention_output(x, attend(it * depth + j, q, k, v))
                if trace:
                    trace(f"cam.trunk.{j}.it{it}", x)
            delta, raw, pose = self.update_pose(x, raw)
            poses.append(pose)
            if trace:
                trace(f"cam.delta.it{it}", delta)
                trace(f"cam.pose_enc.it{it}", pose)
        return poses

    def compile_parts(self, compile) -> None:
        """Use compiled forms of the trunk blocks' halves and of the steps around the trunk
        (called once, when the network is built to be compiled)."""
        for block in self.trunk:
            block.compile_parts(compile, whole=False)
        for name in ("normalize", "modulate", "update_pose"):
            setattr(self, name, compile(getattr(self, name)))

    # The steps around the trunk, each a function of its own so that a compiled network fuses
    # each one's small kernels (on the camera head's chain they are ~20 launches a pass).
    def normalize(self, camera_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the normalized tokens, those again through the adaLN norm)."""
        base = self.token_norm(camera_tokens)
        return base, self.adaln_norm(base)

    def modulate(self, base: torch.Tensor, normed: torch.Tensor, pose_in: torch.Tensor) -> torch.Tensor:
        """The trunk's input for a pass: `normed` modulated by the pose so far (adaLN shift,
        scale and gate), plus `base`."""
        shift, scale, gate = self.poseLN_modulation(self.embed_pose(pose_in)).chunk(3, dim=-1)
        return gate * (normed * (1 + scale) + shift) + base

    def update_pose(self, x: torch.Tensor, raw: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the pass's pose delta, the raw pose with it added, that pose activated)."""
        delta = self.pose_branch(self.trunk_norm(x))
        raw = delta if raw is None else raw + delta
        return delta, raw, activate_pose(raw)
