"""The worker that owns the model: it takes the head of every session's queue, steps the
frames through one batched forward (`mapstream.step_together`) in the one thread that runs
the model, and hands each session its answers in order.

Each round takes at most one item per session (a session's frames are sequential) and at
most ``max_batch`` frames, in turns: a round starts with the session after the last one
whose frame the round before took, so a session with a frame queued waits for at most one
frame of each other session, whoever sent first or more. The model thread is a single-thread executor: session creation, steps,
resets and `Session.close` all run there, one after another, so no two ever touch the
model or a cache at once, and the event loop never waits on the model.

A frame reaches the model only after the server checked it (its size and the sequence's);
an exception from a batched step is then the server's own failure, and every session of
that batch ends with an ``internal`` error, since its cache may hold half a step.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..multistream import step_together
from ..session import FramePrediction
from .metrics import Metrics
from .stream import Control, QueuedFrame, ServedStream

__all__ = ["Worker", "Outcome"]

log = logging.getLogger(__name__)

Outcome = tuple[ServedStream, Any, "list[FramePrediction] | BaseException"]


def _frame_tensor(image) -> torch.Tensor:
    """[H, W, 3] uint8 -> [3, H, W] float32 in [0, 1], as the run's loaders make it (uint8 / 255)."""
    return torch.from_numpy(image).permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class Worker:
    """Runs rounds while any session has work. ``streams``: the server's registry (id ->
    stream), read each round; ``deliver``: called on the event loop with each round's
    outcomes. A session's ``on_model`` counts its items in the round in progress; when the
    round ends, its ``last_active`` is then. Whoever makes a session's queue takeable again
    (a frame or control queued, its congestion eased) calls `wake`."""

    def __init__(self, streams: dict[str, ServedStream], max_batch: int, metrics: Metrics, deliver) -> None:
        self.streams, self.max_batch, self.metrics, self.deliver = streams, max_batch, metrics, deliver
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mapstream-model")
        self._wake = asyncio.Event()
        self._after: str | None = None  # the last session whose frame a round took: the next round starts after it
        self.rounds = 0

    def wake(self) -> None:
        self._wake.set()

    async def on_model_thread(self, fn, *args):
        """``fn(*args)`` on the model's thread, after whatever runs there now."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while taken := self._take():
                try:
                    outcomes = await self.on_model_thread(self._round, taken)
                    self.rounds += 1
                    self.deliver(outcomes)
                except Exception:  # noqa: BLE001 - the worker serves the other sessions on
                    log.exception("a round of %d sessions failed", len(taken))
                finally:
                    self._finished(taken)
                outcomes = taken = None  # a session that ends now is freed without waiting for the next round

    def _take(self) -> list[tuple[ServedStream, Any]]:
        """This round's items: the head of each session's queue, frames up to ``max_batch``,
        in turns (the module docstring)."""
        ids = list(self.streams)
        start = ids.index(self._after) + 1 if self._after in self.streams else 0
        taken, frames = [], 0
        for stream_id in ids[start:] + ids[:start]:
            stream = self.streams[stream_id]
            if stream.queue and isinstance(stream.queue[0], QueuedFrame) and frames >= self.max_batch:
                continue  # its frame waits for the next round; a control would still be taken
            item = stream.take()
            if item is None:
                continue
            stream.on_model += 1
            if isinstance(item, QueuedFrame):
                frames += 1
                stream.waiting[stream.next_index] = item
                stream.next_index += 1
                self._after = stream_id
            taken.append((stream, item))
        return taken

    @staticmethod
    def _finished(taken: list[tuple[ServedStream, Any]]) -> None:
        """The round of ``taken`` is over (a function: the coroutine keeps no session)."""
        done = time.monotonic()
        for stream, _ in taken:
            stream.on_model -= 1
            stream.last_active = done

    def _round(self, taken: list[tuple[ServedStream, Any]]) -> list[Outcome]:
        """On the model thread: the round's frames stepped together, its controls done."""
        outcomes: list[Outcome] = []
        stepped = [(s, item) for s, item in taken if isinstance(item, QueuedFrame)]
        if stepped:
            self.metrics.batch.observe(len(stepped))
            try:
                preds = step_together(
                    [s.session for s, _ in stepped], [_frame_tensor(item.image) for _, item in stepped],
                    keyframes=[item.keyframe for _, item in stepped],
                )
                outcomes += [(s, item, p) for (s, item), p in zip(stepped, preds)]
            except Exception as err:  # noqa: BLE001 - told to each session of the batch, which ends
                log.exception("a batched step of %d sessions failed", len(stepped))
                outcomes += [(s, item, err) for s, item in stepped]
        for stream, item in taken:
            if isinstance(item, Control):
                outcomes.append((stream, item, self._control(stream, item)))
        return outcomes

    @staticmethod
    def _control(stream: ServedStream, control: Control):
        """A reset or finish: the buffered scale frames predicted (a short sequence still gets
        its answers), then a new sequence for a reset."""
        try:
            preds = stream.session.flush()
            if control.kind == "reset":
                stream.session.reset()
            return preds
        except Exception as err:  # noqa: BLE001 - the session ends with it
            log.exception("session %s: %s failed", stream.id[:8], control.kind)
            return err

    async def close(self) -> None:
        """Wait for the model thread's last work, then stop it."""
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)

