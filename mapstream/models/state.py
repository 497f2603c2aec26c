"""The state of one stream: its aggregator and camera-head caches, which hold the same frames."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from ..cache import StreamCacheManager

__all__ = ["StreamState"]


@dataclass
class StreamState:
    """The caches of one sequence (aggregator and camera head), reset together. A network's
    `forward` reads and extends the state it is given; the state's owner (a session, or the
    reference protocol's default state) decides when it is reset or released."""

    aggregator: StreamCacheManager
    camera: StreamCacheManager | None

    def reset(self, *, release: bool = False) -> None:
        self.aggregator.reset(release=release)
        if self.camera is not None:
            self.camera.reset(release=release)

    def release(self) -> None:
        self.aggregator.release()
        if self.camera is not None:
            self.camera.release()

    @contextlib.contextmanager
    def step(self, store: bool) -> Iterator[None]:
        """The scope of one step over both caches, which must hold the same frames. Each cache
        commits its own part when it is done, so a step that raises after the aggregator's
        part (in the camera head, a dense head, the copy of the outputs) would leave a stored
        frame in one cache only, or in both for a call that returned nothing. Then both refuse
        further steps until `reset`; a failed unstored step leaves them valid, but its frame
        can no longer be promoted with `store_last`."""
        try:
            yield
        except BaseException:
            for cache in (self.aggregator, self.camera):
                if cache is not None:
                    cache.step_failed(stored=store)
            raise

    @property
    def frames_stored(self) -> int:
        return self.aggregator.frames_stored
