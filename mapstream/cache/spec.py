"""What a streaming KV cache holds: frozen descriptions, no storage and no logic.

Two caches follow the same rules: the aggregator's (one entry per global layer, every token
of a frame) and the camera head's (one entry per refinement iteration x trunk block, one
token per frame). `CacheSpec` describes the retention policy (shared), `TokenLayout` the
per-frame geometry of one cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CacheSpec", "KV_DTYPES", "TokenLayout", "StorageKey"]

KV_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class CacheSpec:
    """Which stored frames stay visible.

    Stored frames are split into::

        anchors      the first `anchor_frames` stored frames, kept for the whole sequence
        window       the last `window_frames` stored frames after the anchors (FIFO)
        trajectory   frames that left the window: only their first `trajectory_tokens`
                     tokens (the special tokens) are kept, at most `trajectory_capacity`
                     frames (None = unbounded); when full, the older half is thinned.
    """

    anchor_frames: int
    window_frames: int
    trajectory_capacity: int | None
    trajectory_keep: str = "specials"
    """What the aggregator keeps of a frame that left the window: "specials" (all special
    tokens), "camera" (the camera token only) or "none". The camera head's cache always
    keeps its single token."""
    kv_dtype: str = "auto"
    """How keys and values are stored: "auto" (in the step's compute dtype) or "fp8" (e4m3
    rows with a float32 scale each, `mapstream.cache.fp8`; read back in the compute dtype)."""

    def __post_init__(self) -> None:
        if self.anchor_frames < 0 or self.window_frames < 1:
            raise ValueError(
                f"anchor_frames must be >= 0 and window_frames >= 1, got {self.anchor_frames}, {self.window_frames}"
            )
        if self.trajectory_keep not in ("specials", "camera", "none"):
            raise ValueError(f"trajectory_keep must be specials, camera or none, got {self.trajectory_keep!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        if self.trajectory_capacity is not None and self.trajectory_capacity < 2:
            raise ValueError(f"trajectory_capacity must be >= 2 or None, got {self.trajectory_capacity}")

    @property
    def ring_slots(self) -> int:
        """Frame slots with all their tokens: anchors + window + 1 for the frame being attended."""
        return self.anchor_frames + self.window_frames + 1


@dataclass(frozen=True)
class TokenLayout:
    """Per-frame token geometry of one cache."""

    num_layers: int
    num_heads: int
    head_dim: int
    tokens_per_frame: int
    """All tokens of a frame (specials first, then patches)."""
    trajectory_tokens: int
    """Leading tokens of a frame kept after it leaves the window (0 = none)."""
    patch_grid: tuple[int, int] | None = None
    """The frame's patch rows and columns, where the tokens are an image's: a frame of
    another grid with as many tokens (portrait after landscape) changes the resolution too."""

    def __post_init__(self) -> None:
        if not 0 <= self.trajectory_tokens <= self.tokens_per_frame:
            raise ValueError("trajectory_tokens must lie in [0, tokens_per_frame]")


@dataclass(frozen=True)
class StorageKey:
    """Everything that must match for two caches to share pages."""

    num_layers: int
    num_heads: int
    head_dim: int
    """Elements of one stored row: the head dim, or the D + 4 bytes of a packed FP8 row."""
    page_tokens: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_page(self) -> int:
        """Keys and values of `page_tokens` tokens over every layer and head."""
        return self.num_layers * 2 * self.num_heads * self.page_tokens * self.head_dim * \
            torch.empty((), dtype=self.dtype).element_size()
