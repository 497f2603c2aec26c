"""One connection's session on the server: its `Session`, its queue of frames and controls,
its rate limit and what it owes the client.

The queue is bounded. A frame that arrives while it is full drops the oldest queued frame
not marked as a keyframe (the client is told which); when every queued frame is marked, the
new frame is dropped instead. A live camera thus always gets its newest frames predicted,
and a client that keeps at most ``queue_size`` frames unanswered never loses one.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..session import Session
from ..windowed import WindowedSession
from .options import SessionOptions

__all__ = ["Control", "QueuedFrame", "RateLimit", "ServedStream"]


@dataclass
class QueuedFrame:
    frame_id: int
    image: np.ndarray  # [H, W, 3] uint8, as the model gets it (preprocessed)
    keyframe: bool | None
    name: str | None
    arrived: float  # monotonic seconds


@dataclass(frozen=True)
class Control:
    """A control in the queue, done in order with the frames: ``reset`` (the frames before it
    are finished and flushed, then a new sequence starts) or ``finish`` (the same, then the
    session ends; ``reason``: "close" when the client asked, "shutdown" when the server does)."""

    kind: str
    reason: str = "close"


class RateLimit:
    """A token bucket: ``rate`` frames a second, bursts of up to one second's worth."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.capacity, self.clock = rate, max(1.0, rate), clock
        self.tokens, self.stamp = self.capacity, clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class ServedStream:
    """A connection's session and bookkeeping (owned by the event loop; the model thread
    only touches ``session``)."""

    id: str
    session: Session | WindowedSession
    options: SessionOptions
    queue_size: int
    limit: RateLimit
    queue: deque = field(default_factory=deque)  # QueuedFrame | Control, in arrival order
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # what the sender writes, in order
    waiting: dict[int, QueuedFrame] = field(default_factory=dict)  # sequence index -> frame taken, unanswered
    sequence: int = 0  # resets done
    next_index: int = 0  # sequence index of the next frame taken
    last_frame_id: int | None = None
    frame_hw: tuple[int, int] | None = None  # the size of the current sequence's frames (arrival order)
    last_active: float = field(default_factory=time.monotonic)  # a message from the client, an answer sent, a step done
    on_model: int = 0  # items the worker took and has not finished (set by the worker)
    ending: str | None = None  # why no more frames are taken in: "close", "shutdown", "idle", or None
    gone: bool = False  # the connection ended: nothing more is done for it
    released: bool = False  # its session is closed, its cache freed
    connection: Any = None  # the WebSocket connection (closed by the server on shutdown)
    warnings: list[str] = field(default_factory=list)  # what the client is told of its own session when it opens
    map: Any = None  # its `SessionMap` when it was opened with loop_closure (None: none, or it ended)

    @property
    def windowed(self) -> bool:
        return isinstance(self.session, WindowedSession)

    @property
    def queued_frames(self) -> int:
        return sum(isinstance(item, QueuedFrame) for item in self.queue)

    def offer(self, frame: QueuedFrame) -> QueuedFrame | None:
        """Queue ``frame``; returns the frame dropped to make room (see the module docstring),
        None when none was."""
        if self.queued_frames < self.queue_size:
            self.queue.append(frame)
            return None
        for i, item in enumerate(self.queue):
            if isinstance(item, QueuedFrame) and item.keyframe is not True:
                del self.queue[i]
                self.queue.append(frame)
                return item
        return frame

    def congested(self) -> bool:
        """The client reads its answers slower than they come: the worker leaves its frames
        queued (where the drop policy bounds them) until the sender catches up."""
        return self.outbox.qsize() > 2 * self.queue_size + self.session.num_scale_frames

    @property
    def outbox_limit(self) -> int:
        """Answers waiting to be sent beyond which the client is taken to send without reading
        (refusals of its frames pile up too) and its connection ends: its memory stays bounded."""
        return 16 * self.queue_size + 256

    def take(self) -> Any | None:
        """The next queued item for the worker, or None (nothing queued, congested, gone)."""
        if self.gone or not self.queue or self.congested():
            return None
        return self.queue.popleft()
