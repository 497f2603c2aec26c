"""`BackgroundMap`: a `GlobalMap` on a thread of its own, so the stream never waits for it.

The stream thread hands each finished frame over (`submit`: a queue put; frames that will
not become keyframes are reduced to their pose first). The map thread registers keyframes
and searches and verifies loops. When it falls more than `backlog` keyframes behind, it
registers keyframes without searching for loops until it has caught up: the stream's rate is
kept, loop checks are what give way while it runs. `finish` waits for the queue to drain,
searches the keyframes that were added without a search (the stream has ended: nothing waits
for the map any more), then solves the whole graph; a failure on the map thread is raised
there (and the thread stops taking work).
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from dataclasses import dataclass

import torch

from ..fast import outside_captures, shared_stream
from .config import MapConfig
from .loops import LoopCheck
from .map import GlobalMap

__all__ = ["BackgroundMap"]

log = logging.getLogger(__name__)

_STOP = object()


@dataclass
class _PoseOnly:
    """A frame that will not be a keyframe: what the map reads of it."""

    index: int
    T_world_cam: torch.Tensor
    scale_frame: bool


class BackgroundMap:
    """See the module docstring. `on_loop(check, keyframe_poses)` is called on the map thread
    after each accepted loop, with the corrected keyframe poses (e.g. to redraw a live view)."""

    def __init__(self, model, config: MapConfig | None = None, *, backlog: int = 8, on_loop=None) -> None:
        self.map = GlobalMap(model, config)
        self.backlog = backlog
        self.on_loop = on_loop
        self._queue: queue.Queue = queue.Queue()
        self._pending_keyframes = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self.skipped_searches = 0
        self._thread = threading.Thread(target=self._work, name="mapstream-globalmap", daemon=True)
        self._thread.start()

    def submit(self, pred, frame: torch.Tensor) -> None:
        """Hand one finished frame over (returns at once)."""
        if self._error is not None:
            raise RuntimeError(f"the global map stopped: {self._error}") from self._error
        if pred.index % self.map.config.keyframe_every:
            self._queue.put((_PoseOnly(pred.index, pred.T_world_cam.detach().cpu(), bool(pred.scale_frame)), None))
            return
        with self._lock:
            self._pending_keyframes += 1
        self._queue.put((pred, frame.detach().cpu()))

    def _work(self) -> None:
        device = next(self.map.model.parameters()).device
        side = shared_stream(device, "background") if device.type == "cuda" else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            self._loop()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            pred, frame = item
            try:
                if self._error is None:
                    self._take(pred, frame)
            except BaseException as err:  # told by `submit` / `finish` on the stream's thread
                log.error("the global map stopped: %s", err)
                self._error = err

    def _take(self, pred, frame) -> None:
        if frame is None:
            self.map.add(pred, frame)
            return
        with self._lock:
            self._pending_keyframes -= 1
            behind = self._pending_keyframes
        search = behind <= self.backlog
        if not search:
            self.skipped_searches += 1
        with outside_captures():
            closed = self.map.add(pred, frame, search=search)
        if closed is not None and self.on_loop is not None:
            self.on_loop(closed, self.map.keyframe_poses())

    def finish(self) -> GlobalMap:
        """Wait for every submitted frame, solve the whole graph, stop the thread; returns the map."""
        self._queue.put(_STOP)
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"the global map stopped: {self._error}") from self._error
        if self.skipped_searches:
            log.info("the global map fell behind the stream: searching the %d keyframes it added without a loop "
                     "search", self.skipped_searches)
            with torch.no_grad():
                self.map.search_skipped()
        self.map.finish()
        return self.map

    def close(self) -> None:
        """Stop the thread without solving (an interrupted stream)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    @property
    def loops(self) -> list[LoopCheck]:
        return list(self.map.loops)
