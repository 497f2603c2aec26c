"""`VideoWriter`: RGB frames in, an H.264 (or MPEG-4) video out, written atomically.

Shared by the offline flythrough (:mod:`mapstream.render.flythrough`) and the viewer's
recordings. Encoding is PyAV's (libav); the file appears at its path only when the writer
closes without an error, so an interrupted render leaves any earlier video as it was and no
partial file.
"""
from __future__ import annotations

import contextlib
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from mapstream.export._optional import import_optional
from mapstream.io.atomic import atomic_path

__all__ = ["VIDEO_SUFFIXES", "VideoWriter", "check_video_path", "even_size"]

VIDEO_SUFFIXES: tuple[str, ...] = (".mp4", ".mkv", ".mov")
"""Containers we write (picked by the file's suffix)."""

MAX_FPS = 240.0


def check_video_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path when its suffix names a video container we write, else a ValueError
    saying which suffixes are (checked before any work, not when the encoder opens)."""
    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise ValueError(f"{path}: the video file must end in {', '.join(VIDEO_SUFFIXES)} (e.g. {path.stem or 'video'}.mp4)")
    return path


def even_size(image_hw: tuple[int, int], height: int) -> tuple[int, int]:
    """(height, width) of a video ``height`` tall with the aspect of ``image_hw``, both even
    (the 4:2:0 chroma of H.264 halves both sides)."""
    h, w = image_hw
    even = lambda x: max(2, int(round(x / 2)) * 2)  # noqa: E731
    return even(height), even(height * w / h)


class VideoWriter:
    """Write ``height`` x ``width`` RGB frames to ``path`` at ``fps``::

        with VideoWriter("out.mp4", height=720, width=1280, fps=10) as video:
            for image in images:          # [H, W, 3] uint8
                video.write(image)

    The video exists at ``path`` once the ``with`` block ends without an exception; on an
    exception the temp file is removed and an earlier file at ``path`` stays. Frames of
    another size are an error (resize them first): an encoder would silently rescale or fail
    deep inside libav.
    """

    def __init__(self, path: str | os.PathLike[str], *, height: int, width: int, fps: float) -> None:
        self.path = check_video_path(path)
        if height < 2 or width < 2 or height % 2 or width % 2:
            raise ValueError(f"video sides must be even and >= 2 (4:2:0 chroma), got {width}x{height}; see even_size()")
        if not 0 < fps <= MAX_FPS:
            raise ValueError(f"fps must be in (0, {MAX_FPS:g}], got {fps}")
        self.height, self.width, self.fps = height, width, fps
        self.frames = 0
        self._av = import_optional("av", "encoding videos")
        self._stack: contextlib.ExitStack | None = None
        self._container: Any = None
        self._stream: Any = None

    def __enter__(self) -> VideoWriter:
        stack = contextlib.ExitStack()
        try:
            tmp = stack.enter_context(atomic_path(self.path))
            self._container = stack.enter_context(self._av.open(str(tmp), mode="w"))
            self._stream = self._open_stream()
        except BaseException:
            # Exit the temp file's context *with* the error, so that it is removed rather than
            # renamed, empty, onto an earlier video.
            if not stack.__exit__(*sys.exc_info()):
                raise
        self._stack = stack
        return self

    def write(self, image: np.ndarray) -> None:
        """Append one frame: [height, width, 3] uint8 RGB."""
        if self._stream is None:
            raise RuntimeError("VideoWriter.write outside its `with` block")
        image = np.asarray(image)
        if image.shape != (self.height, self.width, 3) or image.dtype != np.uint8:
            raise ValueError(
                f"a video frame must be [{self.height}, {self.width}, 3] uint8 RGB, got {list(image.shape)} {image.dtype}"
            )
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self.frames += 1

    def __exit__(self, kind, error, tb) -> bool:
        stack, self._stack = self._stack, None
        stream, self._stream = self._stream, None
        assert stack is not None, "VideoWriter exited without being entered"
        if kind is not None:  # the container closes and the temp file goes; the error propagates
            return bool(stack.__exit__(kind, error, tb))
        with stack:  # the container closes, then the temp file takes the path (or goes, on an error here)
            for packet in stream.encode(None):  # the encoder's delayed frames
                self._container.mux(packet)
        return False

    def _open_stream(self) -> Any:
        """An H.264 stream (CRF 18) where the PyAV build has an encoder for it, else MPEG-4."""
        rate = Fraction(self.fps).limit_denominator(1001)
        for codec, options in (("libx264", {"crf": "18"}), ("mpeg4", {"qscale": "2"})):
            if codec in self._av.codecs_available:
                stream = self._container.add_stream(codec, rate=rate)
                stream.width, stream.height, stream.pix_fmt = self.width, self.height, "yuv420p"
                stream.options = options
                return stream
        raise RuntimeError("this PyAV build has neither an H.264 (libx264) nor an MPEG-4 encoder")
