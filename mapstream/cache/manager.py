"""The cache manager: which frames of one sequence are stored where, and what is visible.

One manager serves one cache of one sequence (the aggregator's or the camera head's). It
leases a contiguous run of pages (an *arena*) from a `PagePool` and lays it out as::

    arena tokens:  [ ....... trajectory ....... | slot 0 | slot 1 | ... | slot R-1 ]
                     grows downward  ->  lo  ring_start
    trajectory:    the first `trajectory_tokens` tokens (special tokens) of frames that
                   left the window, newest at the lowest address
    ring slots:    all tokens of one frame each: anchors first, then the window, then one
                   spare slot for the frame being attended without being stored

Used slots are always [0, n_used): a frame only leaves a slot when a newer frame takes it.
So everything visible to attention is ONE contiguous token range [lo, hi) of the arena:
attention reads a view, never a gather.

Per step (see `begin_step`):

* one frame, stored (keyframe): if the window is full, the oldest window frame's special
  tokens move to the trajectory and the new frame takes its slot; then attend to
  everything visible (the new frame included);
* one frame, not stored: it is written to the spare slot and attends to everything
  visible plus itself; afterwards the cache is exactly as before;
* several frames (a block, e.g. the scale frames): they attend to what was visible before
  the block plus all of the block (bidirectionally), then (if stored) they are stored in
  order with the same eviction rule.

The manager computes a `Step` (a list of copy operations and the visible range); the
attention layer executes it on its own layer's storage through `Step.attend`. Nothing
else mutates the storage.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .page_pool import PageRun, PoolRegistry
from .spec import CacheSpec, StorageKey, TokenLayout

__all__ = ["StreamCacheManager", "Step", "CacheStats", "CacheStateError", "thin_trajectory"]

log = logging.getLogger(__name__)

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(q [1, H, Nq, D], k [1, H, Nk, D], v [1, H, Nk, D]) -> out [1, H, Nq, D]"""

_UNBOUNDED_INITIAL_TRAJECTORY = 64


class CacheStateError(RuntimeError):
    """The cache cannot serve this step (misuse, or an earlier step failed part-way)."""


def thin_trajectory(frames: Sequence[int]) -> list[int]:
    """The trajectory-memory thinning rule: drop every second frame of the older half.

    Keeps the oldest frame, the newer half untouched, and halves the density of the older
    half, so repeated thinning leaves a memory that is dense near the present and sparse
    (geometrically) toward the start. Always drops at least one frame when len >= 2.
    """
    half = max(2, len(frames) // 2)
    older, newer = list(frames[:half]), list(frames[half:])
    return older[::2] + newer


@dataclass(frozen=True)
class _Keep:
    slot: int
    position: int  # trajectory position (0 = oldest)


@dataclass(frozen=True)
class _Compact:
    old_positions: tuple[int, ...]  # kept frames' old positions, oldest first (new position = index)


@dataclass(frozen=True)
class _Write:
    frame: int  # index of the frame within the step
    slot: int


_Op = _Keep | _Compact | _Write


@dataclass(frozen=True)
class CacheStats:
    frames_seen: int
    frames_stored: int
    anchor_frames: int
    window_frames: int
    trajectory_frames: int
    slots_in_use: int
    slots_free: int
    pages_in_use: int
    pages_free: int
    bytes_held: int
    bytes_per_layer: int
    num_layers: int


@dataclass
class Step:
    """One forward step's plan for one cache. Execute with `attend` once per layer."""

    manager: "StreamCacheManager"
    num_frames: int
    store: bool
    block: bool
    ops: tuple[_Op, ...]
    visible: tuple[int, int]  # token range; after the writes (single) or before them (block)
    storage: torch.Tensor = field(repr=False)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend_fn: AttendFn) -> torch.Tensor:
        """Store this step's K/V of `layer` where the plan says and attend.

        q, k, v: [1, H, num_frames * tokens_per_frame, D] (k after RoPE). Returns [1, H, Nq, D].
        """
        mgr = self.manager
        layout = mgr.layout
        assert layout is not None
        if k.shape[0] != 1:
            raise CacheStateError("a streaming cache serves one sequence (batch size 1); use one session per stream")
        expected = self.num_frames * layout.tokens_per_frame
        if k.shape[-2] != expected:
            raise CacheStateError(f"step expects {expected} tokens, got {k.shape[-2]}")
        kv = self.storage[layer]  # [2, H, T, D]
        lo, hi = self.visible
        if self.block:
            out = attend_fn(q, _cat(kv[0, :, lo:hi], k[0]), _cat(kv[1, :, lo:hi], v[0]))
            mgr._apply(kv, self.ops, k[0], v[0])
            return out
        mgr._apply(kv, self.ops, k[0], v[0])
        return attend_fn(q, kv[0, :, lo:hi].unsqueeze(0), kv[1, :, lo:hi].unsqueeze(0))


def _cat(cached: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    if cached.shape[-2] == 0:
        return current.unsqueeze(0)
    return torch.cat((cached, current.to(cached.dtype)), dim=-2).unsqueeze(0)


class StreamCacheManager:
    """Frame bookkeeping and storage of one streaming cache (see module docstring)."""

    def __init__(self, spec: CacheSpec, pools: PoolRegistry, *, name: str = "cache") -> None:
        self.spec = spec
        self.pools = pools
        self.name = name
        self.layout: TokenLayout | None = None
        self._key: StorageKey | None = None
        self._run: PageRun | None = None
        self._trajectory_capacity = 0  # frames the arena's trajectory region holds
        self._in_step = False
        self._broken = False
        self._clear()

    # ------------------------------------------------------------------ bookkeeping
    def _clear(self) -> None:
        self._slot_frame: list[int] = []  # frame id per used slot; len == n_used
        self._anchors = 0
        self._window: collections.deque[int] = collections.deque()  # slots, oldest first
        self._trajectory: list[int] = []  # frame ids, oldest first
        self.frames_stored = 0
        self.frames_seen = 0

    @property
    def window_capacity(self) -> int:
        return self.spec.window_frames

    def visible_frames(self) -> dict[str, list[int]]:
        """Stored frame ids by role (for tests and debugging)."""
        return {
            "anchors": self._slot_frame[: self._anchors],
            "window": [self._slot_frame[s] for s in self._window],
            "trajectory": list(self._trajectory),
        }

    # ------------------------------------------------------------------ lifecycle
    def reset(self, *, release: bool = False) -> None:
        """Forget every frame. Keeps the leased pages for the next sequence unless `release`."""
        self._clear()
        self._in_step = False
        self._broken = False
        if release:
            self.release()

    def release(self) -> None:
        """Return the arena to the pool (the manager stays usable; a step leases anew)."""
        if self._in_step:
            raise CacheStateError(f"{self.name}: cannot release the cache during a step")
        if self._run is not None:
            self._run.pool.free(self._run)
            self._run = None
        self._key = None
        self.layout = None
        self._clear()

    def stats(self) -> CacheStats:
        """Frames seen and stored, pages in use and free, bytes held (all layers and per layer)."""
        layout = self.layout
        if self._run is None or layout is None:
            return CacheStats(self.frames_seen, self.frames_stored, 0, 0, 0, 0, self.spec.ring_slots, 0, 0, 0, 0, 0)
        traj_tokens = len(self._trajectory) * layout.trajectory_tokens
        used = len(self._slot_frame) + -(-traj_tokens // layout.tokens_per_frame)
        return CacheStats(
            frames_seen=self.frames_seen,
            frames_stored=self.frames_stored,
            anchor_frames=self._anchors,
            window_frames=len(self._window),
            trajectory_frames=len(self._trajectory),
            slots_in_use=len(self._slot_frame),
            slots_free=self.spec.ring_slots - len(self._slot_frame),
            pages_in_use=used,
            pages_free=self._run.num_pages - used,
            bytes_held=self._run.nbytes,
            bytes_per_layer=self._run.nbytes // layout.num_layers,
            num_layers=layout.num_layers,
        )

    # ------------------------------------------------------------------ storage
    @staticmethod
    def _trajectory_pages(layout: TokenLayout, frames: int) -> int:
        return -(-frames * layout.trajectory_tokens // layout.tokens_per_frame)

    def _ring_start(self) -> int:
        assert self.layout is not None
        return self._trajectory_pages(self.layout, self._trajectory_capacity) * self.layout.tokens_per_frame

    def _lease(self, layout: TokenLayout, dtype: torch.dtype, device: torch.device) -> None:
        key = StorageKey(layout.num_layers, layout.num_heads, layout.head_dim, layout.tokens_per_frame, dtype, device)
        if self._key == key and self.layout == layout:
            return
        if self.frames_stored or self._slot_frame or self._trajectory:
            raise CacheStateError(
                f"{self.name}: frames of another shape ({layout.tokens_per_frame} tokens, {dtype}, {device}) "
                f"arrived in the middle of a sequence stored with {self.layout.tokens_per_frame if self.layout else '?'} "
                f"tokens per frame; reset the cache (clean_kv_cache() / session.reset()) before changing resolution"
            )
        self.release()
        cap = self.spec.trajectory_capacity
        self._trajectory_capacity = cap if cap is not None else _UNBOUNDED_INITIAL_TRAJECTORY
        pages = self._trajectory_pages(layout, self._trajectory_capacity) + self.spec.ring_slots
        self._run = self.pools.get(key).allocate(pages)
        self._key, self.layout = key, layout

    @torch.no_grad()
    def _grow_trajectory(self) -> None:
        """Unbounded trajectory only: move to an arena with twice the trajectory room."""
        assert self._run is not None and self.layout is not None and self._key is not None
        old_run, old_start = self._run, self._ring_start()
        self._trajectory_capacity *= 2
        pages = self._trajectory_pages(self.layout, self._trajectory_capacity) + self.spec.ring_slots
        new_run = self.pools.get(self._key).allocate(pages)
        shift = self._ring_start() - old_start
        new_run.storage[:, :, :, shift : shift + old_run.tokens].copy_(old_run.storage)
        old_run.pool.free(old_run)
        self._run = new_run
        log.debug("%s: trajectory memory grown to %d frames", self.name, self._trajectory_capacity)

    # ------------------------------------------------------------------ planning
    def begin_step(
        self,
        num_frames: int,
        *,
        store: bool,
        layout: TokenLayout,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Step:
        """Plan one forward step of `num_frames` frames (see module docstring)."""
        if self._broken:
            raise CacheStateError(
                f"{self.name}: an earlier step failed part-way and the cache may be inconsistent; reset it"
            )
        if self._in_step:
            raise CacheStateError(f"{self.name}: the previous step was not finished; reset the cache")
        if num_frames < 1:
            raise ValueError("a step needs at least one frame")
        self._lease(layout, dtype, device)
        block = num_frames > 1
        ops: list[_Op] = []
        traj_before, used_before = len(self._trajectory), len(self._slot_frame)
        if store:
            for i in range(num_frames):
                self._store_one(self.frames_stored + i, i, ops)
        elif not block:
            ops.append(_Write(0, used_before))  # the spare slot: used slots are [0, used_before)
        # Ranges are computed after planning: the arena may have moved (unbounded trajectory).
        ring_start, tpf, kt = self._ring_start(), layout.tokens_per_frame, layout.trajectory_tokens
        if block:
            visible = (ring_start - traj_before * kt, ring_start + used_before * tpf)
        else:
            used_after = len(self._slot_frame) if store else used_before + 1
            visible = (ring_start - len(self._trajectory) * kt, ring_start + used_after * tpf)
        assert self._run is not None
        self._in_step = True
        self.frames_seen += num_frames
        if store:
            self.frames_stored += num_frames
        return Step(self, num_frames, store, block, tuple(ops), visible, self._run.storage)

    def finish_step(self, step: Step) -> None:
        if step.manager is not self or not self._in_step:
            raise CacheStateError(f"{self.name}: finish_step without a matching begin_step")
        self._in_step = False

    def abort_step(self, step: Step) -> None:
        """Close a step that failed part-way. A failed unstored step leaves the cache as it
        was; a failed stored step may have written some layers, so the cache refuses further
        steps until `reset`."""
        if self._in_step and step.manager is self:
            self._in_step = False
            if step.store:
                self._broken = True
            else:
                self.frames_seen -= step.num_frames

    def _store_one(self, frame_id: int, index: int, ops: list[_Op]) -> None:
        spec = self.spec
        if self._anchors < spec.anchor_frames:
            slot = len(self._slot_frame)
            self._slot_frame.append(frame_id)
            self._anchors += 1
        elif len(self._window) < spec.window_frames:
            slot = len(self._slot_frame)
            self._slot_frame.append(frame_id)
            self._window.append(slot)
        else:
            slot = self._window.popleft()
            self._remember(self._slot_frame[slot], slot, ops)
            self._slot_frame[slot] = frame_id
            self._window.append(slot)
        ops.append(_Write(index, slot))

    def _remember(self, frame_id: int, slot: int, ops: list[_Op]) -> None:
        cap = self.spec.trajectory_capacity
        if len(self._trajectory) >= self._trajectory_capacity:
            if cap is None:
                self._grow_trajectory()
            else:
                kept = thin_trajectory(range(len(self._trajectory)))
                ops.append(_Compact(tuple(kept)))
                self._trajectory = [self._trajectory[p] for p in kept]
        self._trajectory.append(frame_id)
        ops.append(_Keep(slot, len(self._trajectory) - 1))

    # ------------------------------------------------------------------ execution
    @torch.no_grad()  # the cache is state, not part of any autograd graph
    def _apply(self, kv: torch.Tensor, ops: Sequence[_Op], k: torch.Tensor, v: torch.Tensor) -> None:
        """Run a step's copy operations on one layer's storage kv [2, H, T, D]."""
        layout = self.layout
        assert layout is not None
        tpf, kt = layout.tokens_per_frame, layout.trajectory_tokens
        ring_start = self._ring_start()

        def traj_range(position: int) -> slice:
            return slice(ring_start - (position + 1) * kt, ring_start - position * kt)

        for op in ops:
            if isinstance(op, _Write):
                dst = slice(ring_start + op.slot * tpf, ring_start + (op.slot + 1) * tpf)
                src = slice(op.frame * tpf, (op.frame + 1) * tpf)
                kv[0, :, dst] = k[:, src].detach()
                kv[1, :, dst] = v[:, src].detach()
            elif isinstance(op, _Keep):
                if kt:
                    start = ring_start + op.slot * tpf
                    kv[:, :, traj_range(op.position)] = kv[:, :, start : start + kt]
            elif isinstance(op, _Compact):
                if kt:
                    # Kept frame j (oldest first) moves from old position p_j to position j.
                    src = torch.cat([_arange(traj_range(p), kv.device) for p in op.old_positions])
                    dst = torch.cat([_arange(traj_range(j), kv.device) for j in range(len(op.old_positions))])
                    kv[:, :, dst] = kv[:, :, src].clone()


def _arange(s: slice, device: torch.device) -> torch.Tensor:
    return torch.arange(s.start, s.stop, device=device)
