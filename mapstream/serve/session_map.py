"""A served session's global map (a session opened with ``"loop_closure": true``).

Each sequence of the session gets a `BackgroundMap` of the server's `MapConfig`: the session's
final predictions are handed to it as they are answered, on its own thread, so the session's
answers never wait for it. When it closes a loop the client gets a ``map`` message with every
keyframe's corrected camera; when the sequence ends (reset, close) the map is solved whole and
a last ``map`` message (``"final": true``, with the map's statistics) comes before the answer
to the reset or close. A map that fails tells the client in an ``error`` message (not fatal:
the session's answers go on without it).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import torch

from ..globalmap import BackgroundMap, GlobalMap, MapConfig

__all__ = ["SessionMap", "map_message"]

log = logging.getLogger(__name__)


def map_message(gmap: GlobalMap, sequence: int, *, final: bool) -> dict[str, Any]:
    """A ``map`` message: each keyframe's corrected camera-to-world (4x4) and the factor its
    depth scales by, the loop edges as (candidate, current) frame pairs; the final one also
    the map's statistics."""
    keyframes = []
    for index, T in sorted(gmap.keyframe_poses().items()):
        pose = np.eye(4)
        pose[:3] = T
        scale = gmap.correct_pose(index, gmap.keyframes[index].T_world_cam)[1]
        keyframes.append({"index": int(index), "T_world_cam": pose.tolist(), "scale": float(scale)})
    message = {"type": "map", "sequence": sequence, "final": final, "keyframes": keyframes,
               "loops": [[int(c.candidate), int(c.query)] for c in gmap.loops]}
    if final:
        message["stats"] = gmap.stats()
    return message


class SessionMap:
    """The map of the sequence a session is streaming. `post(text)` puts a message in the
    session's outbox; it is called from the map's thread through the event loop."""

    def __init__(self, model, config: MapConfig, loop: asyncio.AbstractEventLoop, post) -> None:
        self.model, self.config, self.loop, self.post = model, config, loop, post
        self.sequence = 0
        self._map = self._new()

    def _new(self) -> BackgroundMap:
        sequence = self.sequence

        def on_loop(_check, _poses) -> None:  # on the map's thread: the message is built there
            self.loop.call_soon_threadsafe(self.post, map_message(background.map, sequence, final=False))

        background = BackgroundMap(self.model, self.config, on_loop=on_loop)
        return background

    def take(self, pred, image: np.ndarray) -> None:
        """Hand one final prediction over with its frame as the model saw it ([H, W, 3] uint8)."""
        frame = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div(255)
        self._map.submit(pred, frame)

    def retire(self, *, another: bool):
        """End the sequence's map: returns a function that solves it whole and gives the final
        ``map`` message (it blocks: run it off the event loop). With `another`, a new map takes
        the session's next sequence at once."""
        done, sequence = self._map, self.sequence
        if another:
            self.sequence += 1
            self._map = self._new()
        return lambda: map_message(done.finish(), sequence, final=True)

    def close(self) -> None:
        """Stop the map's thread without solving (the connection went)."""
        self._map.close()
