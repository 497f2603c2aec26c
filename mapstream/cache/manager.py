"""The cache manager: which frames of one sequence are stored where, and what is visible.

One manager serves one cache of one sequence (the aggregator's or the camera head's). It
leases a contiguous run of pages (an *arena*) from a `PagePool` and lays it out in frame
slots of P tokens (all tokens of one frame), followed by the trajectory memory::

    arena:  [ spare | slot 1 | slot 2 | ... | slot R-1 | trajectory -> ...... ]
              0       P                                  R*P
    slot 0 (spare)   the frame being attended without being stored (non-keyframe)
    slots 1..R-1     stored frames: anchors first, then the sliding window
    trajectory       the first `trajectory_tokens` tokens (the special tokens) of every
                     frame that left the window, oldest first, growing upward

Stored frames always occupy slots [1, 1 + n_used): a frame only leaves its slot when a
newer frame takes it, and the trajectory only grows once every slot is used. So what a
step attends to is ONE contiguous token range whose start never moves:

    keyframe:      [P, end)     non-keyframe: [0, end)     end = P (1 + n_used) + kt * n_traj

Attention therefore reads a view (no gather), and a captured CUDA graph only needs the
range's length, never a new pointer.

Per step (see `begin_step`):

* one frame, stored (keyframe): if the window is full, the oldest window frame's special
  tokens move to the trajectory and the new frame takes its slot; then it attends to
  everything visible (itself included);
* one frame, not stored: it is written to the spare slot and attends to everything
  visible plus itself; the cache is unchanged afterwards;
* several frames (a block, e.g. the scale frames): they attend to what was visible before
  plus the whole block (bidirectionally), then (if stored) they are stored in order.

The manager computes a `Step` (copy operations and the visible range); the attention layer
executes it on its own layer's storage through `Step.attend`. Nothing else writes the
storage.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from .fp8 import packed_width, unpack_rows
from .frame_write import write_frame_kv
from .page_pool import PageRun, PoolRegistry
from .spec import CacheSpec, StorageKey, TokenLayout

__all__ = ["StreamCacheManager", "Step", "CacheStats", "CacheStateError", "readable", "thin_trajectory"]

log = logging.getLogger(__name__)

AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(q [1, H, Nq, D], k [1, H, Nk, D], v [1, H, Nk, D]) -> out [1, H, Nq, D]"""

_UNBOUNDED_INITIAL_TRAJECTORY = 64
_SPARE = 0


class CacheStateError(RuntimeError):
    """The cache cannot serve this step (misuse, or an earlier step failed part-way)."""


def thin_trajectory(frames: Sequence[int]) -> list[int]:
    """The trajectory-memory thinning rule: drop every second frame of the older half.

    Keeps the oldest frame, leaves the newer half untouched and halves the density of the
    older half, so repeated thinning leaves a memory that is dense near the present and
    geometrically sparser toward the start. Drops at least one frame when len >= 2.
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
class _Move:
    src_slot: int
    dst_slot: int


@dataclass(frozen=True)
class _Write:
    frame: int  # index of the frame within the step
    slot: int


_Op = _Keep | _Compact | _Move | _Write


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
    visible: tuple[int, int]  # token range; after the writes (single frame) or before them (block)
    storage: torch.Tensor = field(repr=False)

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend_fn: AttendFn,
        *, moves_done: bool = False,
    ) -> torch.Tensor:
        """Store this step's K/V of `layer` where the plan says and attend.

        q, k, v: [1, H, num_frames * tokens_per_frame, D] (k after RoPE). Returns [1, H, Nq, D].
        moves_done: the caller ran `apply_moves()` for every layer already, so only the
        frame's writes remain (single-frame steps; one copy for all layers instead of one a
        layer).
        """
        mgr = self.manager
        layout = mgr.layout
        assert layout is not None
        if k.shape[0] != 1:
            raise CacheStateError("a streaming cache serves one sequence (batch size 1); use one session per stream")
        expected = self.num_frames * layout.tokens_per_frame
        if k.shape[-2] != expected:
            raise CacheStateError(f"step expects {expected} tokens, got {k.shape[-2]}")
        kv = self.storage[layer]  # [2, H, T, D] (packed FP8 rows: [2, H, T, D + 4] uint8)
        lo, hi = self.visible
        if self.block:
            if moves_done:
                raise CacheStateError("moves_done is for single-frame steps (a block writes after attending)")
            out = attend_fn(q, _cat(readable(kv[0, :, lo:hi], k.dtype), k[0]),
                            _cat(readable(kv[1, :, lo:hi], v.dtype), v[0]))
            mgr._apply(kv, self.ops, k[0], v[0])
            return out
        mgr._apply(kv, self._writes() if moves_done else self.ops, k[0], v[0])
        return attend_fn(q, readable(kv[0, :, lo:hi], k.dtype).unsqueeze(0),
                         readable(kv[1, :, lo:hi], v.dtype).unsqueeze(0))

    # ---- the split used by graph-safe execution (`DeviceStep`)
    def write_slot(self) -> int:
        """The slot the frame of a single-frame step is written to (0 = the spare slot)."""
        writes = self._writes()
        if self.block or len(writes) != 1:
            raise CacheStateError("write_slot() is defined for single-frame steps only")
        return writes[0].slot

    def apply_moves(self) -> None:
        """Run, on every layer at once, the copies that do not involve this step's frame
        (trajectory keep/compaction, moves). They precede the frame's write in the plan, so
        running them first and writing afterwards gives the same cache."""
        moves = tuple(op for op in self.ops if not isinstance(op, _Write))
        if moves:
            self.manager._apply(self.storage, moves, None, None)

    def _writes(self) -> tuple[_Write, ...]:
        """The plan's writes of this step's frames (what `apply_moves` leaves)."""
        return tuple(op for op in self.ops if isinstance(op, _Write))


def attend_streams(
    steps: Sequence[Step], layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend_fn: AttendFn
) -> torch.Tensor:
    """Cache attention for a batch of independent streams: row b of q, k, v [B, H, N, D]
    belongs to the stream of `steps[b]` and attends only to that stream's cache."""
    if len(steps) != q.shape[0]:
        raise CacheStateError(f"{len(steps)} cache steps for a batch of {q.shape[0]} streams")
    if len(steps) == 1:
        return steps[0].attend(layer, q, k, v, attend_fn)
    rows = [
        step.attend(layer, q[b : b + 1], k[b : b + 1], v[b : b + 1], attend_fn) for b, step in enumerate(steps)
    ]
    return torch.cat(rows, dim=0)


@contextlib.contextmanager
def open_steps(
    caches: Sequence["StreamCacheManager"],
    stores: Sequence[bool],
    *,
    num_frames: int,
    layout: Callable[["StreamCacheManager"], TokenLayout],
    dtype: torch.dtype,
    device: torch.device,
) -> Iterator[list[Step]]:
    """Begin one step per cache (`layout(cache)` gives its token layout) and finish them all
    when the block exits; if it raises, every step begun is aborted (see `abort_step`)."""
    steps: list[Step] = []
    try:
        for cache, store in zip(caches, stores, strict=True):
            steps.append(cache.begin_step(num_frames, store=store, layout=layout(cache), dtype=dtype, device=device))
        yield steps
    except BaseException:
        for cache, step in zip(caches, steps):
            cache.abort_step(step)
        raise
    for cache, step in zip(caches, steps):
        cache.finish_step(step)


def readable(stored: torch.Tensor, dtype: torch.dtype, kv_range: torch.Tensor | None = None) -> torch.Tensor:
    """Stored keys or values as attention reads them: FP8 rows (uint8) unpacked to `dtype`,
    any other storage as it is (a view). On CUDA the rows are unpacked by one Triton pass:
    only those in `kv_range` (int32 [2] on the device, read by the kernel: graph-safe) when
    it is given, the others then zero; every row otherwise."""
    if stored.dtype != torch.uint8:
        return stored
    if stored.is_cuda:
        from .fp8_kernel import supports, unpack_range  # one Triton pass, no float32 intermediate

        if supports(stored):
            return unpack_range(stored, (0, stored.shape[1]) if kv_range is None else kv_range, dtype)
    return unpack_rows(stored, dtype)


def _cat(cached: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Cached keys and the current block's, in the storage dtype: [1, H, n + N, D]."""
    current = current.to(cached.dtype)
    if cached.shape[-2] == 0:
        return current.unsqueeze(0)
    return torch.cat((cached, current), dim=-2).unsqueeze(0)


class StreamCacheManager:
    """Frame bookkeeping and storage of one streaming cache (see module docstring)."""

    def __init__(self, spec: CacheSpec, pools: PoolRegistry, *, name: str = "cache") -> None:
        self.spec = spec
        self.pools = pools
        self.name = name
        self.layout: TokenLayout | None = None
        self._key: StorageKey | None = None
        self._run: PageRun | None = None
        self._on_drop: weakref.finalize | None = None  # gives `_run` back if this manager is dropped
        self._trajectory_capacity = 0  # frames the arena's trajectory region holds
        self._in_step = False
        self._broken = False
        self._spare_valid = False  # the spare slot holds the last, unstored frame
        self._clear()

    # ------------------------------------------------------------------ bookkeeping
    def _clear(self) -> None:
        self._slot_frame: dict[int, int] = {}  # arena slot (1..R-1) -> frame id
        self._anchors: list[int] = []  # slots, in storage order
        self._window: collections.deque[int] = collections.deque()  # slots, oldest first
        self._trajectory: list[int] = []  # frame ids, oldest first
        self.frames_stored = 0
        self.frames_seen = 0
        self._spare_valid = False

    @property
    def num_frames(self) -> int:
        """Frames stored (the reference manager's name for `frames_stored`)."""
        return self.frames_stored

    @property
    def pool(self):
        """The `PagePool` this cache's arena is leased from (None before the first step)."""
        return self._run.pool if self._run is not None else None

    @property
    def slots_in_use(self) -> int:
        return len(self._slot_frame)

    def visible_frames(self) -> dict[str, list[int]]:
        """Stored frame ids by role: anchors, window (oldest first), trajectory (oldest first)."""
        return {
            "anchors": [self._slot_frame[s] for s in self._anchors],
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
            self._hold(None)
        self._key = None
        self.layout = None
        self._clear()

    def stats(self) -> CacheStats:
        """Frames seen and stored, pages in use and free, bytes held (all layers and per layer)."""
        layout = self.layout
        if self._run is None or layout is None:
            return CacheStats(self.frames_seen, self.frames_stored, 0, 0, 0, 0, self.spec.ring_slots, 0, 0, 0, 0, 0)
        traj_tokens = len(self._trajectory) * layout.trajectory_tokens
        used = self.slots_in_use + -(-traj_tokens // layout.tokens_per_frame)
        return CacheStats(
            frames_seen=self.frames_seen,
            frames_stored=self.frames_stored,
            anchor_frames=len(self._anchors),
            window_frames=len(self._window),
            trajectory_frames=len(self._trajectory),
            slots_in_use=self.slots_in_use,
            slots_free=self.spec.ring_slots - self.slots_in_use,
            pages_in_use=used,
            pages_free=self._run.num_pages - used,
            bytes_held=self._run.nbytes,
            bytes_per_layer=self._run.nbytes // layout.num_layers,
            num_layers=layout.num_layers,
        )

    # ------------------------------------------------------------------ storage
    def _pages(self, layout: TokenLayout, trajectory_frames: int) -> int:
        traj_tokens = trajectory_frames * layout.trajectory_tokens
        return self.spec.ring_slots + -(-traj_tokens // layout.tokens_per_frame)

    def _hold(self, run: PageRun | None) -> None:
        """Make ``run`` the leased arena (None: none). While held, the manager's collection
        gives it back to its pool, so that a session dropped without `close()` (or a state
        nobody released) does not keep its pages leased for the life of the model."""
        if self._on_drop is not None:
            self._on_drop.detach()
        self._run = run
        self._on_drop = None if run is None else weakref.finalize(self, run.pool.free_later, run)

    def __getstate__(self) -> dict:
        # A copy (copy.deepcopy of a model) arms its own give-back in __setstate__.
        return {k: v for k, v in self.__dict__.items() if k != "_on_drop"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._on_drop = None
        self._hold(self._run)

    def _storage_key(self, layout: TokenLayout, dtype: torch.dtype, device: torch.device) -> StorageKey:
        if self.spec.kv_dtype == "fp8":  # packed rows: the values' bytes and their scale's
            dtype, width = torch.uint8, packed_width(layout.head_dim)
        else:
            width = layout.head_dim
        return StorageKey(layout.num_layers, layout.num_heads, width, layout.tokens_per_frame, dtype, device)

    def lease_bytes(self, layout: TokenLayout, dtype: torch.dtype) -> int:
        """The bytes this cache leases for a sequence of frames laid out as `layout` with keys
        and values computed in `dtype` (its arena: the anchors, the window and the trajectory
        memory at its capacity, or at its first size when unbounded), without leasing them."""
        capacity = self.spec.trajectory_capacity
        pages = self._pages(layout, capacity if capacity is not None else _UNBOUNDED_INITIAL_TRAJECTORY)
        return pages * self._storage_key(layout, dtype, torch.device("meta")).bytes_per_page

    def _lease(self, layout: TokenLayout, dtype: torch.dtype, device: torch.device) -> None:
        key = self._storage_key(layout, dtype, device)
        if self._key == key and self.layout == layout:
            return
        if self.frames_stored or self._slot_frame or self._trajectory:
            raise CacheStateError(
                f"{self.name}: frames of another shape ({_frame_shape(layout)}, {dtype}, {device}) arrived in "
                f"the middle of a sequence stored with {_frame_shape(self.layout)}; reset the cache "
                "(clean_kv_cache() / session.reset()) before changing resolution"
            )
        self.release()
        cap = self.spec.trajectory_capacity
        self._trajectory_capacity = cap if cap is not None else _UNBOUNDED_INITIAL_TRAJECTORY
        self._hold(self.pools.get(key).allocate(self._pages(layout, self._trajectory_capacity)))
        self._key, self.layout = key, layout

    @torch.no_grad()
    def _grow_trajectory(self) -> None:
        """Unbounded trajectory only: move to an arena with twice the trajectory room."""
        assert self._run is not None and self.layout is not None and self._key is not None
        old = self._run
        self._trajectory_capacity *= 2
        new = self.pools.get(self._key).allocate(self._pages(self.layout, self._trajectory_capacity))
        new.storage[:, :, :, : old.tokens].copy_(old.storage)
        old.pool.free(old)
        self._hold(new)
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
        self._spare_valid = False
        block = num_frames > 1
        tpf, kt = layout.tokens_per_frame, layout.trajectory_tokens
        visible_before = (tpf, self._visible_end(tpf, kt))
        ops: list[_Op] = []
        if store:
            for i in range(num_frames):
                self._store_one(self.frames_stored + i, i, ops)
        elif not block:
            ops.append(_Write(0, _SPARE))
        if block:
            visible = visible_before
        else:
            visible = (tpf if store else 0, self._visible_end(tpf, kt))
        assert self._run is not None
        self._in_step = True
        self.frames_seen += num_frames
        if store:
            self.frames_stored += num_frames
        return Step(self, num_frames, store, block, tuple(ops), visible, self._run.storage)

    def _visible_end(self, tpf: int, kt: int) -> int:
        return tpf * (1 + self.slots_in_use) + kt * len(self._trajectory)

    def finish_step(self, step: Step) -> None:
        if step.manager is not self or not self._in_step:
            raise CacheStateError(f"{self.name}: finish_step without a matching begin_step")
        self._in_step = False
        self._spare_valid = not step.store and not step.block

    @torch.no_grad()
    def store_last(self) -> None:
        """Store the frame of the last step, which ran unstored (decide-after-seeing keyframes).

        The frame attended as a non-keyframe (window + 1 frames visible); it now joins the
        cache exactly as if it had been stored then: the oldest window frame moves to the
        trajectory if the window is full, and the frame takes its slot.
        """
        if not self._spare_valid or self._in_step:
            raise CacheStateError(
                f"{self.name}: store_last() needs the previous step to be a single unstored frame"
            )
        assert self._run is not None and self.layout is not None
        ops: list[_Op] = []
        self._store_one(self.frames_stored, 0, ops)
        ops = [_Move(_SPARE, op.slot) if isinstance(op, _Write) else op for op in ops]
        self._apply(self._run.storage, ops, None, None)
        self.frames_stored += 1
        self._spare_valid = False

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

    def step_failed(self, *, stored: bool) -> None:
        """A step that this cache took part in failed, here or in a cache that moves with it
        (`StreamState.step`): after a stored one the caches may disagree, so this one refuses
        further steps until `reset`; after an unstored one it stays valid, but the failed
        frame is not promoted by `store_last`."""
        self._spare_valid = False
        if stored:
            self._broken = True

    def _store_one(self, frame_id: int, index: int, ops: list[_Op]) -> None:
        spec = self.spec
        if len(self._anchors) < spec.anchor_frames:
            slot = 1 + self.slots_in_use
            self._anchors.append(slot)
        elif len(self._window) < spec.window_frames:
            slot = 1 + self.slots_in_use
            self._window.append(slot)
        else:
            slot = self._window.popleft()
            self._remember(self._slot_frame[slot], slot, ops)
            self._window.append(slot)
        self._slot_frame[slot] = frame_id
        ops.append(_Write(index, slot))

    def _remember(self, frame_id: int, slot: int, ops: list[_Op]) -> None:
        if len(self._trajectory) >= self._trajectory_capacity:
            if self.spec.trajectory_capacity is None:
                self._grow_trajectory()
            else:
                kept = thin_trajectory(range(len(self._trajectory)))
                ops.append(_Compact(tuple(kept)))
                self._trajectory = [self._trajectory[p] for p in kept]
        self._trajectory.append(frame_id)
        ops.append(_Keep(slot, len(self._trajectory) - 1))

    # ------------------------------------------------------------------ execution
    @torch.no_grad()  # the cache is state, not part of any autograd graph
    def _apply(self, kv: torch.Tensor, ops: Sequence[_Op], k: torch.Tensor | None, v: torch.Tensor | None) -> None:
        """Run copy operations on storage kv [..., 2, H, T, D] (one layer, or all layers for
        operations that do not involve the current frames' k, v [H, N, D])."""
        layout = self.layout
        assert layout is not None
        tpf, kt = layout.tokens_per_frame, layout.trajectory_tokens
        traj_start = self.spec.ring_slots * tpf

        def traj_range(position: int) -> slice:
            return slice(traj_start + position * kt, traj_start + (position + 1) * kt)

        for op in ops:
            if isinstance(op, _Write):
                assert k is not None and v is not None
                src = slice(op.frame * tpf, (op.frame + 1) * tpf)
                write_frame_kv(kv, k[:, src].detach(), v[:, src].detach(), op.slot * tpf)
            elif isinstance(op, _Move):
                src_start = op.src_slot * tpf
                kv[..., op.dst_slot * tpf : (op.dst_slot + 1) * tpf, :] = kv[..., src_start : src_start + tpf, :]
            elif isinstance(op, _Keep):
                if kt:
                    kv[..., traj_range(op.position), :] = kv[..., op.slot * tpf : op.slot * tpf + kt, :]
            elif isinstance(op, _Compact):
                if kt:
                    # Kept frame j (oldest first) moves from its old position p_j down to position j.
                    src = torch.cat([_arange(traj_range(p), kv.device) for p in op.old_positions])
                    count = len(op.old_positions)
                    kv[..., traj_start : traj_start + count * kt, :] = kv[..., src, :].clone()


def _arange(s: slice, device: torch.device) -> torch.Tensor:
    return torch.arange(s.start, s.stop, device=device)


FlashInferKVCacheManager = StreamCacheManager
"""The reference's name for its cache manager (`reset()`, `num_frames`), kept for code written
against it. Here one manager serves every attention backend: the backends read what it makes
visible."""


def _frame_shape(layout: TokenLayout | None) -> str:
    """A layout's frame in words for errors: "12 tokens per frame (2 x 5 patches)"."""
    if layout is None:
        return "? tokens per frame"
    grid = f" ({layout.patch_grid[0]} x {layout.patch_grid[1]} patches)" if layout.patch_grid else ""
    return f"{layout.tokens_per_frame} tokens per frame{grid}"
