"""Typed configuration: the architecture (`ModelConfig`), how a stream is run (`StreamConfig`)
and named presets.

The architecture fields describe what is in a checkpoint; the stream fields describe how a
stream is run and never change the state dict. `build_model(preset, **overrides)` accepts the
reference constructor's argument names as overrides (`kv_cache_sliding_window`,
`kv_cache_scale_frames`, `max_frame_num`, `camera_num_iterations`, `enable_3d_rope`,
`enable_point`, ...), so configurations written for LingBot-Map port unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from .attention.registry import BACKENDS
from .cache.spec import KV_DTYPES, CacheSpec
from .validation import check_count

__all__ = [
    "DEFAULT_CAMERA_ITERATIONS",
    "DEFAULT_IMAGE_SIZE",
    "ModelConfig",
    "StreamConfig",
    "PRESETS",
    "get_preset",
    "preset_names",
    "split_overrides",
]


def _check_counts(config: Any, least: dict[str, int]) -> None:
    """Each named field of ``config`` is an integer of at least its bound (else ValueError)."""
    for name, bound in least.items():
        check_count(name, getattr(config, name), bound)


DEFAULT_IMAGE_SIZE = 518
"""The official model's frame width in pixels: its ViT's positional-embedding grid
(`ModelConfig.img_size`) and the width frames are preprocessed to for weights that record no
other (`mapstream.checkpoint.model_image_size`)."""

DEFAULT_CAMERA_ITERATIONS = 4
"""The camera head's refinement passes (`ModelConfig.camera_num_iterations`): what the official
checkpoints are used with, and the default of every command that builds a model."""

# ModelConfig's integer fields with their least value.
_MODEL_COUNTS = {
    "img_size": 1, "patch_size": 1, "embed_dim": 1, "vit_depth": 1, "vit_num_heads": 1, "vit_num_registers": 0,
    "depth": 1, "num_heads": 1, "num_register_tokens": 0, "max_frame_num": 1, "camera_trunk_depth": 1,
    "camera_num_heads": 1, "camera_num_iterations": 1, "dpt_features": 1, "dpt_head_features_2": 1,
    "dpt_chunk_frames": 1,
}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a GCTStream network (what the state dict holds)."""

    # Input / patch embedding (DINOv2 ViT with registers).
    img_size: int = DEFAULT_IMAGE_SIZE
    """Only sets the ViT positional-embedding grid (img_size / patch_size squared)."""
    patch_size: int = 14
    embed_dim: int = 1024
    vit_depth: int = 24
    vit_num_heads: int = 16
    vit_num_registers: int = 4

    # Aggregator: alternating frame / global blocks.
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_register_tokens: int = 4
    """Aggregator register tokens per frame (besides one camera and one scale token)."""
    selected_layers: tuple[int, ...] = (4, 11, 17, 23)
    """Aggregator layers whose [frame, global] outputs feed the heads."""
    enable_3d_rope: bool = True
    """Video RoPE (time, height, width) in the global blocks instead of the 2D RoPE."""
    disable_global_rope: bool = False
    rope2d_frequency: float = 100.0
    rope3d_theta: float = 10000.0
    rope3d_dims: tuple[int, int, int] = (20, 22, 22)
    """Per-head channels for (time, height, width); must sum to the head dim."""
    max_frame_num: int = 1024
    """Rows of the reference's 3D-RoPE table. mapstream computes angles on demand, so this
    only bounds the height/width positions the reference could address (kept for parity
    of the error it raises for too small values)."""

    # Camera head.
    enable_camera: bool = True
    camera_trunk_depth: int = 4
    camera_num_heads: int = 16
    camera_num_iterations: int = DEFAULT_CAMERA_ITERATIONS

    # Dense heads.
    enable_depth: bool = True
    enable_point: bool = False
    dpt_features: int = 256
    dpt_out_channels: tuple[int, int, int, int] = (256, 512, 1024, 1024)
    dpt_head_features_2: int = 32
    dpt_chunk_frames: int = 8

    def __post_init__(self) -> None:
        _check_counts(self, _MODEL_COUNTS)
        if not self.mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {self.mlp_ratio!r}")
        if len(self.dpt_out_channels) != 4 or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in self.dpt_out_channels):
            raise ValueError(f"dpt_out_channels must be 4 positive integers, got {self.dpt_out_channels!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.embed_dim % self.vit_num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by vit_num_heads {self.vit_num_heads}")
        if sum(self.rope3d_dims) != self.head_dim:
            raise ValueError(
                f"rope3d_dims {self.rope3d_dims} must sum to the head dim {self.head_dim}"
            )
        if any(d % 2 for d in self.rope3d_dims) or self.head_dim % 4:
            raise ValueError("RoPE needs even channel counts per axis")
        if len(self.selected_layers) != 4 or not all(0 <= i < self.depth for i in self.selected_layers):
            raise ValueError(f"selected_layers must be 4 indices in [0, {self.depth}), got {self.selected_layers}")
        if (2 * self.embed_dim) % self.camera_num_heads:
            raise ValueError("camera head width 2*embed_dim must be divisible by camera_num_heads")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def num_special_tokens(self) -> int:
        """camera + registers + scale = 6 for the official model."""
        return 1 + self.num_register_tokens + 1


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
FAST_MODES = (False, True, "auto", "pieces", "whole")
SHARED_FROM = ("earlier", "later")
WINDOW_JOINS = ("shared", "anchor")


@dataclass(frozen=True)
class StreamConfig:
    """How one stream is run: its scale phase, what its cache keeps, which frames it stores,
    how it computes, and how windowed runs cut it into windows. None of it is in the
    checkpoint. `Session`, `WindowedSession`, the inference functions, `mapstream run` and
    its flags all read this one type; each setting has its default here and nowhere else.

    Per global layer a new frame attends to::

        [ trajectory memory: special tokens of frames that left the window ]
        [ scale (anchor) frames: all tokens, kept for the whole sequence     ]
        [ sliding window: all tokens of the last `sliding_window` stored frames ]
        [ the frame itself                                                    ]
    """

    num_scale_frames: int = 8
    """Frames that open a sequence together (attending to each other) and stay in every later
    frame's attention as its scale anchors."""
    cache_scale_frames: int | None = None
    """Stored frames the cache keeps forever (the reference's `kv_cache_scale_frames`); None:
    `num_scale_frames`. The reference lets the two differ, so they are two settings."""
    sliding_window: int = 64
    """Most recent stored frames kept after the scale frames (`kv_cache_sliding_window`);
    older ones leave, oldest first."""
    trajectory_capacity: int | None = 1024
    """Most evicted frames whose special tokens stay visible; when full the older half is
    thinned (every second frame dropped). None keeps all (memory grows with the stream, as in
    the reference). Outputs equal the reference's until this many frames were evicted."""
    cross_frame_special: bool = True
    """Keep the special tokens of frames evicted from the window (the trajectory memory)."""
    include_scale_frames: bool = True
    """Keep the scale frames' tokens once eviction starts (reference option); False makes them
    ordinary window members that leave first."""
    camera_only: bool = False
    """Keep only the camera token (not all special tokens) of evicted frames."""
    keyframe_interval: int | Literal["auto"] | None = None
    """Which frames after the scale phase are stored: an int k (every k-th, the reference's
    rule; 0 and 1 store all), "auto" (by predicted image motion), from Python also a
    `mapstream.keyframes.KeyframePolicy`, or None: every frame in a session, while
    `mapstream run` stores every ceil(N / 320)-th of N frames known in advance (the reference
    demo's rule) and chooses by motion on a live input."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """The trunk's arithmetic: "auto" (bf16 on CUDA GPUs that have it, fp16 on older ones,
    fp32 on the CPU), "fp32", "bf16" or "fp16". The heads stay in their weights' dtype."""
    kv_dtype: Literal["auto", "fp8"] = "auto"
    """How the aggregator's cache stores keys and values: "auto" (in the trunk's precision) or
    "fp8" (e4m3 with a scale per token and head: 0.53 of bf16's bytes, read back in the trunk's
    precision; `mapstream.cache.fp8`). The camera head's small cache keeps the trunk's precision."""
    backend: str = "auto"
    """Attention over the cache: "auto" (the first usable of triton, flashinfer, sdpa), or one
    of them by name (`mapstream info` lists what this machine can run)."""
    fast: bool | Literal["auto", "pieces", "whole"] = "auto"
    """Single-frame steps replayed from CUDA graphs: "auto" (on CUDA devices whose weights are
    cast to the compute dtype; eager elsewhere), True, False, "whole" (the whole step as one
    graph) or "pieces" (graphs between eager cache attentions). The same function either way."""
    provisional: bool = False
    """During the scale phase, also give a provisional prediction for each buffered frame
    right away; the final ones follow when the phase completes."""
    window_size: int = 64
    """Windowed runs: stored frames per window (scale frames + keyframes)."""
    overlap: int | None = 16
    """Windowed runs: frames two consecutive windows share, used to align them (None: the
    scale frames)."""
    overlap_keyframes: int | None = None
    """Windowed runs: the overlap in keyframes instead (k x the keyframe interval frames)."""
    shared_from: Literal["earlier", "later"] = "later"
    """Windowed runs: the window a frame shared by two windows is taken from: "later" (as the
    reference's offline stitch; such a frame waits for the next window) or "earlier" (given as
    soon as the earlier window predicts it)."""
    window_join: Literal["shared", "anchor"] = "shared"
    """Windowed runs: how a window's Sim(3) onto the one before is estimated from the frames
    they share and both stored: "shared" (rotation and centre from all of them) or "anchor"
    (the reference's: from the last one alone); the scale is their depths' median ratio either
    way (docs/WINDOWED.md)."""

    def __post_init__(self) -> None:
        check_count("num_scale_frames", self.num_scale_frames)
        if self.cache_scale_frames is not None:
            check_count("cache_scale_frames", self.cache_scale_frames, least=0)
        check_count("sliding_window", self.sliding_window)
        capacity = self.trajectory_capacity
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 2):
            raise ValueError(f"trajectory_capacity must be >= 2 or None (unbounded), got {capacity!r}")
        interval = self.keyframe_interval
        if isinstance(interval, str) and interval != "auto" or isinstance(interval, (bool, float)):
            raise ValueError(
                f"keyframe_interval must be an int k >= 0, 'auto', a KeyframePolicy or None, got {interval!r}"
            )
        if isinstance(interval, int) and interval < 0:
            raise ValueError(f"keyframe_interval must be >= 0, got {interval}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.backend not in ("auto", *BACKENDS):
            raise ValueError(f"backend must be one of auto, {', '.join(BACKENDS)}, got {self.backend!r}")
        if not any(self.fast is mode or (isinstance(mode, str) and self.fast == mode) for mode in FAST_MODES):
            raise ValueError(f"fast must be False, True, 'auto', 'pieces' or 'whole', got {self.fast!r}")
        check_count("window_size", self.window_size)
        if self.overlap is not None:
            check_count("overlap", self.overlap, least=0)
        if self.overlap_keyframes is not None:
            check_count("overlap_keyframes", self.overlap_keyframes, least=0)
        if self.shared_from not in SHARED_FROM:
            raise ValueError(f"shared_from must be one of {', '.join(SHARED_FROM)}, got {self.shared_from!r}")
        if self.window_join not in WINDOW_JOINS:
            raise ValueError(f"window_join must be one of {', '.join(WINDOW_JOINS)}, got {self.window_join!r}")

    @property
    def stored_interval(self):
        """`keyframe_interval` as a session applies it: None stores every frame (1)."""
        return 1 if self.keyframe_interval is None else self.keyframe_interval

    @property
    def anchor_frames(self) -> int:
        """Stored frames the cache keeps forever (`cache_scale_frames`, else the scale frames)."""
        return self.num_scale_frames if self.cache_scale_frames is None else self.cache_scale_frames

    def cache_spec(self) -> CacheSpec:
        """What the stream's caches keep (the aggregator's and, frame for frame, the camera
        head's)."""
        if self.include_scale_frames:
            anchors, window = self.anchor_frames, self.sliding_window
        else:
            # Scale frames are ordinary window members that age out first (see docs/ARCHITECTURE.md).
            anchors, window = 0, self.sliding_window + self.anchor_frames
        keep = "none" if not self.cross_frame_special else ("camera" if self.camera_only else "specials")
        return CacheSpec(
            anchor_frames=anchors,
            window_frames=window,
            trajectory_capacity=self.trajectory_capacity,
            trajectory_keep=keep,
        )

    def with_settings(self, **settings: Any) -> "StreamConfig":
        """A copy with `settings` (field names) changed; unknown names are refused."""
        unknown = sorted(set(settings) - _STREAM_FIELDS)
        if unknown:
            raise TypeError(
                f"unknown stream setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"StreamConfig has {', '.join(sorted(_STREAM_FIELDS))}"
            )
        return replace(self, **settings) if settings else self


_STREAM_FIELDS = {f.name for f in fields(StreamConfig)}


# Reference constructor arguments that map onto our configs.
_STREAM_ALIASES = {
    "kv_cache_scale_frames": "cache_scale_frames",
    "num_frame_for_scale": "num_scale_frames",
    "kv_cache_sliding_window": "sliding_window",
    "kv_cache_cross_frame_special": "cross_frame_special",
    "kv_cache_include_scale_frames": "include_scale_frames",
    "kv_cache_camera_only": "camera_only",
}
# Reference arguments that are accepted and have no effect at inference (training leftovers,
# the kernel choice, and the camera RoPE's base, which only matters with the camera RoPE on).
_INERT = {
    "use_sdpa", "sliding_window_size", "num_random_frames", "attend_to_special_tokens",
    "attend_to_scale_frames", "enable_stream_inference", "use_scale_token", "enable_track",
    "enable_normalize", "pretrained_path", "use_gradient_checkpoint", "camera_rope_theta",
}
# Reference arguments that change the network away from the official one with any other value:
# accepted at that value (inert), refused otherwise rather than silently building another model.
_OFFICIAL_ONLY = {
    "patch_embed": ("dinov2_vitl14_reg", "other DINOv2 sizes are set by embed_dim, vit_depth and vit_num_heads"),
    "enable_camera_3d_rope": (False, "the official checkpoints' camera head has no positional encoding"),
    "enable_local_point": (False, "the official checkpoints have no local point head"),
    "pred_normalization": (False, "the reference calls a method it does not define when it is on"),
}


@dataclass(frozen=True)
class Preset:
    name: str
    model: ModelConfig
    stream: StreamConfig
    description: str


PRESETS: dict[str, Preset] = {}


def _register(preset: Preset) -> None:
    PRESETS[preset.name] = preset


_register(
    Preset(
        name="lingbot-map",
        model=ModelConfig(),
        stream=StreamConfig(),
        description="Official LingBot-Map architecture with the settings its checkpoints are used with "
        "(3D RoPE, 8 scale frames, window 64, 4 camera iterations, no point head).",
    )
)
_register(
    Preset(
        name="tiny",
        model=ModelConfig(
            embed_dim=128,
            vit_depth=2,
            vit_num_heads=2,
            depth=5,
            num_heads=2,
            selected_layers=(0, 2, 3, 4),
            camera_trunk_depth=2,
            camera_num_heads=16,
            dpt_features=32,
            dpt_out_channels=(16, 32, 64, 64),
        ),
        stream=StreamConfig(),
        description="The tiny test model of the golden data (4.7 M parameters, untrained).",
    )
)
_register(
    Preset(
        name="small",
        model=ModelConfig(
            embed_dim=192,
            vit_depth=4,
            vit_num_heads=3,
            depth=6,
            num_heads=3,
            selected_layers=(1, 3, 4, 5),
            camera_trunk_depth=1,
            camera_num_heads=6,
            dpt_features=64,
            dpt_out_channels=(48, 96, 192, 192),
        ),
        stream=StreamConfig(),
        description="The base of mapstream's own model (11 M parameters, under 25 MB in half precision, a few "
        "seconds for the demo on two CPU cores), trained from scratch by the recipes and then deepened into "
        "small-deep; heads of dimension 64 as the official model's.",
    )
)


_register(
    Preset(
        name="small-deep",
        model=replace(
            PRESETS["small"].model, vit_depth=8, depth=12, camera_trunk_depth=2, selected_layers=(3, 7, 9, 11)
        ),
        stream=StreamConfig(),
        description="The small model at twice its depth (20 M parameters, under 25 MB in 8 bits): the "
        "architecture of mapstream's shipped model, grown from small's weights by `mapstream train --deepen "
        "small-deep`, every added block starting as the identity (its heads read the small model's selected "
        "layers where they moved).",
    )
)


def preset_names() -> list[str]:
    return sorted(PRESETS)


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"Unknown preset {name!r}. Valid presets: {', '.join(preset_names())}") from None


def split_overrides(
    model: ModelConfig, stream: StreamConfig, overrides: dict[str, Any]
) -> tuple[ModelConfig, StreamConfig, list[str]]:
    """Apply keyword overrides (our field names or the reference's) to both configs.

    Returns the new configs and the names of accepted-but-inert reference arguments.
    Unknown names raise a ValueError listing the valid ones. The reference's
    `kv_cache_scale_frames` alone sets the scale frames of both the scale phase and the cache
    (its `num_frame_for_scale` defaults to it); given with `num_frame_for_scale`, the cache
    keeps its own count.
    """
    model_fields = {f.name for f in fields(ModelConfig)}
    m_kw: dict[str, Any] = {}
    s_kw: dict[str, Any] = {}
    inert: list[str] = []
    for key, value in overrides.items():
        if key in _STREAM_ALIASES:
            if value is not None:
                s_kw[_STREAM_ALIASES[key]] = value
        elif key in _STREAM_FIELDS:
            s_kw[key] = value
        elif key in model_fields:
            if isinstance(getattr(model, key), tuple):
                value = tuple(value)
            m_kw[key] = value
        elif key in _INERT:
            inert.append(key)
        elif key in _OFFICIAL_ONLY:
            official, why = _OFFICIAL_ONLY[key]
            if value != official:
                raise ValueError(f"{key}={value!r} is not supported, only {official!r}: {why}")
            inert.append(key)
        else:
            valid = sorted(model_fields | _STREAM_FIELDS | set(_STREAM_ALIASES))
            raise ValueError(f"Unknown model argument {key!r}. Valid arguments: {', '.join(valid)}")
    if "cache_scale_frames" in s_kw and "num_scale_frames" not in s_kw:
        s_kw["num_scale_frames"] = s_kw.pop("cache_scale_frames")
    return replace(model, **m_kw), replace(stream, **s_kw), inert


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
