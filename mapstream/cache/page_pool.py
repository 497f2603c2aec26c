"""A pool of KV pages shared by the caches (sessions) of one storage geometry.

A page holds `page_tokens` tokens of K and V for every layer. Pages live in chunks, one
tensor per chunk laid out [layers, 2 (K, V), heads, chunk_tokens, head_dim]; a cache leases
a *contiguous run* of pages, so that every token range it shows to attention is a strided
view of one tensor (no gather). Freed runs go back to the pool and are handed out again;
chunks are only released by `trim()`. The pool knows nothing about frames.

A run whose holder is garbage-collected without freeing it (a session nobody closed) comes
back through `free_later`, which any thread may call at any time, the garbage collector's
finalizers included: it only queues the run, and the pool takes the queue back under its
lock at its next operation.
"""
from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field

import torch

from .spec import StorageKey

__all__ = ["PagePool", "PageRun", "PoolStats", "PoolRegistry"]

log = logging.getLogger(__name__)


@dataclass
class _Chunk:
    storage: torch.Tensor  # [L, 2, H, pages * page_tokens, D]
    pages: int
    free: list[tuple[int, int]]  # sorted, disjoint (first_page, n_pages) runs

    def take(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                if length == n:
                    del self.free[i]
                else:
                    self.free[i] = (start + n, length - n)
                return start
        return None

    def give(self, start: int, n: int) -> None:
        self.free.append((start, n))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for s, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.free = merged

    @property
    def used_pages(self) -> int:
        return self.pages - sum(length for _, length in self.free)


@dataclass(eq=False)
class PageRun:
    """A leased contiguous run of pages. `storage` is a view [L, 2, H, tokens, D]."""

    pool: "PagePool"
    chunk: int
    first_page: int
    num_pages: int
    storage: torch.Tensor = field(repr=False)

    @property
    def tokens(self) -> int:
        return self.num_pages * self.pool.key.page_tokens

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()


@dataclass(frozen=True)
class PoolStats:
    chunks: int
    pages_total: int
    pages_in_use: int
    pages_free: int
    bytes_total: int
    bytes_per_page: int


class PagePool:
    def __init__(self, key: StorageKey, *, min_chunk_pages: int = 1) -> None:
        self.key = key
        self.min_chunk_pages = min_chunk_pages
        self._chunks: list[_Chunk | None] = []
        self._lock = threading.Lock()
        self._freed_later: collections.deque[PageRun] = collections.deque()

    def __getstate__(self) -> dict:
        # A copy (copy.deepcopy of a model) gets its own lock; locks cannot be copied.
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def bytes_per_page(self) -> int:
        return self.key.bytes_per_page

    def allocate(self, num_pages: int) -> PageRun:
        """Lease `num_pages` contiguous pages (new storage is zero-filled)."""
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        with self._lock:
            self._take_back()
            for index, chunk in enumerate(self._chunks):
                if chunk is None:
                    continue
                start = chunk.take(num_pages)
                if start is not None:
                    return self._run(index, start, num_pages)
            pages = max(num_pages, self.min_chunk_pages)
            k = self.key
            with torch.no_grad():
                storage = torch.zeros(
                    (k.num_layers, 2, k.num_heads, pages * k.page_tokens, k.head_dim), dtype=k.dtype, device=k.device
                )
            chunk = _Chunk(storage=storage, pages=pages, free=[(0, pages)])
            self._chunks.append(chunk)
            log.debug("page pool %s: new chunk of %d pages (%.1f MiB)", k, pages, storage.nbytes / 2**20)
            start = chunk.take(num_pages)
            assert start == 0
            return self._run(len(self._chunks) - 1, start, num_pages)

    @torch.no_grad()
    def _run(self, chunk_index: int, start: int, n: int) -> PageRun:
        pt = self.key.page_tokens
        chunk = self._chunks[chunk_index]
        assert chunk is not None
        view = chunk.storage[:, :, :, start * pt : (start + n) * pt]
        return PageRun(self, chunk_index, start, n, view)

    def free(self, run: PageRun) -> None:
        if run.pool is not self:
            raise ValueError("this page run belongs to another pool")
        with self._lock:
            self._take_back()
            self._give(run)

    def free_later(self, run: PageRun) -> None:
        """Queue ``run`` to be freed at the pool's next operation. Safe from a finalizer that
        the garbage collector runs while this thread is inside the pool (an allocation under
        its lock), where `free` would wait on the lock forever."""
        self._freed_later.append(run)

    def _take_back(self) -> None:
        """Free the queued runs (`free_later`); the lock is held."""
        while self._freed_later:
            self._give(self._freed_later.popleft())

    def _give(self, run: PageRun) -> None:
        chunk = self._chunks[run.chunk]
        if chunk is None:
            raise RuntimeError("page run freed after its chunk was trimmed")
        chunk.give(run.first_page, run.num_pages)

    def trim(self) -> int:
        """Release the storage of chunks with no leased page. Returns bytes released."""
        released = 0
        with self._lock:
            self._take_back()
            for i, chunk in enumerate(self._chunks):
                if chunk is not None and chunk.used_pages == 0:
                    released += chunk.storage.nbytes
                    self._chunks[i] = None
            while self._chunks and self._chunks[-1] is None:
                self._chunks.pop()
        return released

    def stats(self) -> PoolStats:
        with self._lock:
            self._take_back()
            live = [c for c in self._chunks if c is not None]
            total = sum(c.pages for c in live)
            used = sum(c.used_pages for c in live)
            nbytes = sum(c.storage.nbytes for c in live)
        return PoolStats(len(live), total, used, total - used, nbytes, self.bytes_per_page)


class PoolRegistry:
    """One `PagePool` per storage geometry; caches of the same geometry share pages."""

    def __init__(self) -> None:
        self._pools: dict[StorageKey, PagePool] = {}
        self._lock = threading.Lock()

    __getstate__ = PagePool.__getstate__
    __setstate__ = PagePool.__setstate__

    def get(self, key: StorageKey) -> PagePool:
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = PagePool(key)
            return pool

    def pools(self) -> list[PagePool]:
        with self._lock:
            return list(self._pools.values())

    def trim(self) -> int:
        """Release every chunk no cache holds (e.g. before switching resolution)."""
        return sum(pool.trim() for pool in self.pools())
