"""Graph-safe execution of single-frame cache steps.

`Step.attend` slices the storage with host integers: right for eager steps, but a captured
CUDA graph would freeze them. A `DeviceStep` executes the same plan with everything that
changes from frame to frame held in small device tensors that the graph reads:

- the token indices the frame's K/V are written to (its slot: the spare slot for an
  unstored frame, a window slot for a keyframe);
- the visible key range [lo, hi), handed to the backend's `attend_range`.

`prepare(step)` runs the plan's other copies (trajectory keep/compaction) eagerly on every
layer and refreshes those tensors; the graph then replays writes and attention. One graph
serves every step as long as the cache's storage stays where it was captured
(`storage_ptr`): a new lease (release, trajectory growth) needs a new capture.
"""
from __future__ import annotations

import torch

from ..attention.backend import AttentionBackend, KeyNormHint
from .frame_write import write_frame_kv
from .manager import CacheStateError, Step, readable

__all__ = ["DeviceStep"]


class DeviceStep:
    """Writes and attention of single-frame steps of one cache with device-side offsets."""

    def __init__(self, tokens_per_frame: int, device: torch.device) -> None:
        self.tokens_per_frame = tokens_per_frame
        self._offsets = torch.arange(tokens_per_frame, device=device)
        self.write_index = torch.zeros(tokens_per_frame, dtype=torch.long, device=device)
        self.kv_range = torch.zeros(2, dtype=torch.int32, device=device)
        self.storage: torch.Tensor | None = None

    @property
    def storage_ptr(self) -> int | None:
        return None if self.storage is None else self.storage.data_ptr()

    def prepare(self, step: Step) -> None:
        """Make the device tensors describe `step` and run its copies that do not involve
        the frame (eagerly, outside any graph)."""
        layout = step.manager.layout
        if step.num_frames != 1 or layout is None or layout.tokens_per_frame != self.tokens_per_frame:
            raise CacheStateError(
                f"a DeviceStep for {self.tokens_per_frame}-token frames cannot run this step "
                f"({step.num_frames} frames)"
            )
        step.apply_moves()
        start = step.write_slot() * self.tokens_per_frame
        # Kernel-side updates (no host-to-device copy whose source could change under it).
        torch.add(self._offsets, start, out=self.write_index)
        self.kv_range[0].fill_(step.visible[0])
        self.kv_range[1].fill_(step.visible[1])
        self.storage = step.storage

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: AttentionBackend,
        *, key_norm: KeyNormHint | None = None,
    ) -> torch.Tensor:
        """Write this frame's k, v [1, H, P, D] of `layer` and attend q [1, H, P, D] to the
        visible range (`key_norm`: the backend's hint). Only device tensors steer it: safe
        to capture."""
        if self.storage is None:
            raise CacheStateError("DeviceStep.attend before prepare()")
        kv = self.storage[layer]  # [2, H, T, D] (packed FP8 rows: [2, H, T, D + 4] uint8)
        write_frame_kv(kv, k[0].detach(), v[0].detach(), self.write_index)
        visible = self.kv_range if backend.device_range else None  # FP8 rows: only those the backend reads
        keys, values = readable(kv[0], k.dtype, visible), readable(kv[1], v.dtype, visible)
        return backend.attend_range(q, keys.unsqueeze(0), values.unsqueeze(0), self.kv_range, key_norm=key_norm)
