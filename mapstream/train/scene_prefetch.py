"""Drawing the next rendering's scenes while the current one trains.

A procedural batch costs two things: drawing each clip's room, objects and camera path
(:func:`~mapstream.train.render.sample_clip`, Python and NumPy on the CPU) and ray casting
them (:func:`~mapstream.train.render.render_clips`, on the dataset's device). The drawing
holds the interpreter lock, so a thread would compete with the training loop's kernel
launches; `ScenePrefetch` draws the next rendering's clips in a process of its own instead.
What it returns for a rendering is exactly what drawing it in place returns (the draws are
pure functions of their seeds), so prefetching never changes a run.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Callable, Sequence

from .render import ClipSpec, sample_clip

__all__ = ["ScenePrefetch", "sample_clips"]

SpecArgs = tuple  # (seeds, num_frames, image_hw, path_kinds, objects, frame_step, synthetic_share)


def sample_clips(seeds: Sequence[int], num_frames: int, image_hw: tuple[int, int], path_kinds: Sequence[str],
                 objects: tuple[int, int], frame_step: int, synthetic_share: float = 0.0) -> list[ClipSpec]:
    """One rendering's clips, drawn from their seeds."""
    return [sample_clip(s, num_frames, image_hw, path_kinds, objects, frame_step, synthetic_share) for s in seeds]


class ScenePrefetch:
    """Returns a rendering's clips and starts drawing the following rendering's in a worker
    process (started on first use, "spawn": the training process may hold CUDA)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._ahead: tuple[int, Future] | None = None

    def __call__(self, rendering: int, args_of: Callable[[int], SpecArgs | None]) -> list[ClipSpec]:
        """The clips of ``rendering``; ``args_of(r)`` gives rendering r's arguments of
        :func:`sample_clips` (None past the dataset's end)."""
        if self._ahead is not None and self._ahead[0] == rendering:
            specs = self._ahead[1].result()
        else:  # the first rendering, or a step out of order: drawn here
            if self._ahead is not None:
                self._ahead[1].cancel()
            specs = sample_clips(*args_of(rendering))
        following = args_of(rendering + 1)
        self._ahead = None if following is None else (rendering + 1, self._executor().submit(sample_clips, *following))
        return specs

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def close(self) -> None:
        """Stop the worker and wait for it to exit (a draw not yet started is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)  # at most one draw to finish
            self._pool, self._ahead = None, None

    def __del__(self) -> None:
        self.close()
