"""Stand-ins for a connected browser, shared by the viewer's export and video tests."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until true, or fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


class RenderingClient:
    """A connected browser as far as a screenshot goes: its canvas size and ``get_render``.

    Each call is noted (size, format, thread); ``release`` cleared holds the render back, as a
    slow browser would, and ``error`` makes it fail."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self.camera = SimpleNamespace(image_height=image.shape[0], image_width=image.shape[1])
        self.calls: list[tuple[int, int, str, threading.Thread]] = []
        self.error: Exception | None = None
        self.release = threading.Event()
        self.release.set()

    def get_render(
        self, height: int, width: int, *, transport_format: str = "jpeg", timeout: float | None = None
    ) -> np.ndarray:
        self.calls.append((height, width, transport_format, threading.current_thread()))
        assert self.release.wait(timeout=30)
        if self.error is not None:
            raise self.error
        return self.image
