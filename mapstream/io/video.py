"""Video files -> frames, decoded one at a time with PyAV (``pip install av``).

Sampling follows the reference demo (APP.md 2): ``interval = max(1, round(src_fps / fps))``
(``src_fps`` = 30 when the file does not say) and every decoded frame whose index is a
multiple of ``interval`` is kept.  Unlike the reference, frames are never written to disk and
never JPEG-compressed: a kept frame goes straight through :func:`preprocess_image`.
Nothing but the current frame is held in memory.  Frames are turned upright from the
container's display-matrix rotation (phone videos), as OpenCV does by default; flips in the
display matrix are ignored.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from mapstream.config import DEFAULT_IMAGE_SIZE
from mapstream.io.images import Mode, check_selection, preprocess_image

logger = logging.getLogger(__name__)

DEFAULT_SRC_FPS = 30.0
VIDEO_EXTENSIONS: tuple[str, ...] = (
    ".mp4", ".mov", ".avi", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts",
    ".mts", ".m2ts", ".3gp", ".3g2", ".ogv", ".mxf", ".vob", ".asf", ".f4v", ".divx", ".y4m",
)


class VideoFrame(NamedTuple):
    """One kept frame: decode ``index`` (0-based), presentation ``time`` in s (None if
    unknown) and the RGB ``image``."""

    index: int
    time: float | None
    image: Image.Image


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about its first video stream (``frames`` and ``duration``,
    in seconds, may be None)."""

    path: Path | str
    """The file, or the URL as given."""
    src_fps: float | None
    frames: int | None
    width: int
    height: int
    codec: str
    duration: float | None = None

    @property
    def estimated_frames(self) -> int | None:
        """The frame count, or the duration times the rate where the container stores no
        count (Matroska); None when neither is known."""
        if self.frames is not None:
            return self.frames
        if self.duration is not None and self.src_fps:
            return round(self.duration * self.src_fps)
        return None


def _import_av() -> Any:
    try:
        import av
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading video needs PyAV: pip install av  (or pip install 'mapstream[video]')"
        ) from exc
    return av


def is_video_url(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` is an http(s) URL of a video file (its path ends in a video suffix):
    read as the file would be, through FFmpeg, with the file's frame sampling and times."""
    from urllib.parse import urlsplit

    text = os.fspath(spec)
    if "://" not in text:
        return False
    url = urlsplit(text)
    return url.scheme.lower() in ("http", "https") and Path(url.path).suffix.lower() in VIDEO_EXTENSIONS


def video_stem(spec: str | os.PathLike) -> str:
    """The file name without its suffix, of a path or a video URL (frames are named after it)."""
    from urllib.parse import unquote, urlsplit

    text = os.fspath(spec)
    return Path(unquote(urlsplit(text).path) if is_video_url(text) else text).stem


_URL_TIMEOUT_S = 30.0
"""How long opening a video URL, or one read from it, may wait for the server."""


def _open(path: str | os.PathLike) -> tuple[Any, Any]:
    """Open ``path`` (a file, or a video URL) and return ``(container, first video stream)``
    with clear errors."""
    av = _import_av()
    url = is_video_url(path)
    p = os.fspath(path) if url else Path(path)
    if not url and not p.is_file():
        raise FileNotFoundError(f"video file not found: {p}")
    try:
        container = av.open(str(p), timeout=_URL_TIMEOUT_S) if url else av.open(str(p))
    except av.error.FFmpegError as exc:
        if url:
            raise ValueError(
                f"cannot read the video at {p}: {exc}. Check the URL and the network, or download the file "
                "and pass its path"
            ) from exc
        raise ValueError(
            f"cannot open video {p}: {exc}. It is not a video FFmpeg can read; convert it, "
            "e.g. ffmpeg -i INPUT -c:v libx264 out.mp4"
        ) from exc
    if not container.streams.video:
        container.close()
        raise ValueError(f"{p} has no video stream (audio-only or not a video file)")
    return container, container.streams.video[0]


def _stream_fps(stream: Any) -> float | None:
    rate = stream.guessed_rate or stream.average_rate
    return float(rate) if rate else None


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Read the header of ``path`` (no decoding)."""
    container, stream = _open(path)
    try:
        ctx = stream.codec_context
        return VideoInfo(
            path=path if is_video_url(path) else Path(path), src_fps=_stream_fps(stream), frames=stream.frames or None,
            width=ctx.width, height=ctx.height, codec=ctx.name,
            duration=container.duration / 1e6 if container.duration else None,  # microseconds
        )
    finally:
        container.close()


def upright(image: Image.Image, rotation: float) -> Image.Image:
    """Rotate ``image`` counter-clockwise by ``rotation`` degrees (rounded to a multiple of
    90), the display-matrix convention of :attr:`av.VideoFrame.rotation`; lossless."""
    quarter_turns = round(rotation / 90) % 4
    if quarter_turns == 0:
        return image
    ops = (None, Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270)
    return image.transpose(ops[quarter_turns])


def sample_interval(src_fps: float | None, fps: float | None) -> int:
    """Keep every n-th decoded frame: ``max(1, round(src_fps / fps))``; ``fps=None`` -> 1.

    ``src_fps`` None or 0 means unknown and counts as 30.
    """
    if fps is None:
        return 1
    if not fps > 0:  # NaN too
        raise ValueError(f"fps must be > 0 (or None for every frame), got {fps}")
    return max(1, round((src_fps or DEFAULT_SRC_FPS) / fps))


def iter_video_frames(
    path: str | os.PathLike,
    *,
    fps: float | None = 10.0,
    stride: int = 1,
    first_k: int | None = None,
    autorotate: bool = True,
) -> Iterator[VideoFrame]:
    """Decode ``path`` lazily and yield the sampled frames as RGB PIL images.

    Limits apply in this order: fps sampling (every ``interval``-th decoded frame), then
    ``stride`` over the kept frames, then ``first_k`` (stop after that many; decoding stops
    too).  ``fps=None`` keeps every frame.  ``autorotate`` applies the display rotation. A
    packet the decoder refuses is skipped with a warning: its frames are missing, and the
    indices count the frames decoded.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a decodable video, or a decoding error (names file and frame).
    """
    check_selection(stride, first_k)
    av = _import_av()
    container, stream = _open(path)
    with container:
        src_fps = _stream_fps(stream)
        if src_fps is None:
            logger.info("%s: frame rate unknown, assuming %g fps", path, DEFAULT_SRC_FPS)
        step = sample_interval(src_fps, fps) * stride
        logger.info("%s: %s fps source, keeping every %d-th frame", path, src_fps, step)
        stream.thread_type = "AUTO"
        kept = 0
        index = -1
        damaged: list[str] = []  # the decoder's complaints about packets it could not decode

        def decoded():
            # Packet by packet, so that one damaged packet costs its frames, not the video (as
            # ffmpeg's own tools conceal it); a damaged container still ends the decoding.
            for packet in container.demux(stream):
                try:
                    yield from packet.decode()
                except av.error.FFmpegError as exc:
                    if not damaged:
                        where = "before its first frame" if index < 0 else f"after frame {index}"
                        logger.warning("%s: a damaged packet %s was skipped (%s); its frames are missing from "
                                       "the sequence (frames keep their decode order numbers, so the names "
                                       "skip them)", path, where, exc)
                    damaged.append(str(exc))

        try:
            for frame in decoded():
                index += 1
                if index % step:
                    continue
                image = frame.to_image()
                if autorotate:
                    image = upright(image, getattr(frame, "rotation", 0))  # PyAV >= 14
                yield VideoFrame(index, frame.time, image)
                kept += 1
                if first_k is not None and kept >= first_k:
                    return
        except av.error.FFmpegError as exc:
            raise ValueError(
                f"error decoding {path} after frame {index}: {exc}. The file is damaged or "
                "uses an unsupported codec; re-encode it, e.g. ffmpeg -i INPUT -c:v libx264 out.mp4"
            ) from exc
        if len(damaged) > 1:
            logger.warning("%s: %d damaged packets were skipped in all", path, len(damaged))
    if kept == 0:
        because = f" (the decoder: {damaged[0]}; damaged, or an unsupported codec?)" if damaged else ""
        raise ValueError(f"no frames could be decoded from {path}{because}")


def iter_video_tensors(
    path: str | os.PathLike,
    *,
    fps: float | None = 10.0,
    stride: int = 1,
    first_k: int | None = None,
    mode: Mode = "crop",
    image_size: int = DEFAULT_IMAGE_SIZE,
    patch_size: int = 14,
    autorotate: bool = True,
) -> Iterator[torch.Tensor]:
    """As :func:`iter_video_frames`, each frame preprocessed to ``[3, H, W]`` float32."""
    frames = iter_video_frames(path, fps=fps, stride=stride, first_k=first_k, autorotate=autorotate)
    for frame in frames:
        yield preprocess_image(frame.image, mode, image_size, patch_size)
