"""A job's bookkeeping (`Tracker`), which its executors (`local`, `ray_backend`) report to."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..pipeline import RunOptions
from ..progress import progress_bar
from .inputs import JobInput
from .worker import InputResult

__all__ = ["Tracker"]

log = logging.getLogger(__name__)


class Tracker:
    """The job's bookkeeping, which executors report to: attempts, retries, results and the
    one progress bar (inputs done, frames, frames per second)."""

    def __init__(self, todo: Sequence[tuple[JobInput, RunOptions]], retries: int, total: int, initial: int,
                 progress: bool | None) -> None:
        self.todo = list(todo)
        self.retries = retries
        self.results: dict[str, InputResult] = {}
        self._started = time.perf_counter()
        self._frames = 0
        self._bar = progress_bar(total=total, desc="inputs", unit="input", initial=initial, progress=progress)

    def succeeded(self, result: InputResult) -> None:
        self.results[result.name] = result
        self._frames += result.new_frames
        log.info("%s: %d frames in %.1f s (attempt %d)", result.name, result.frames, result.seconds, result.attempts)
        self._advance()

    def failed(self, item: JobInput, attempt: int, error: str) -> bool:
        """Record a failed attempt; returns whether the input is tried again."""
        if attempt <= self.retries:
            log.warning("%s failed (attempt %d of %d), trying again: %s", item.name, attempt, self.retries + 1, error)
            return True
        log.error("%s failed after %d attempts: %s", item.name, attempt, error)
        self.results[item.name] = InputResult(item.name, item.input, str(item.out), "failed", attempts=attempt,
                                              error=error)
        self._advance()
        return False

    def _advance(self) -> None:
        elapsed = time.perf_counter() - self._started
        failed = sum(r.status == "failed" for r in self.results.values())
        self._bar.set_postfix_str(f"{self._frames} frames, {self._frames / max(elapsed, 1e-9):.2f} FPS, "
                                  f"{failed} failed")
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
