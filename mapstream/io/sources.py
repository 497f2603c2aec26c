"""One interface for every input: ``FrameSource`` yields ``(name, tensor [3, H, W])`` pairs.

    source = open_source("frames/")            # folder of images
    source = open_source("clip.mp4", fps=10)   # video file (PyAV)
    source = open_source("https://host/clip.mp4", fps=10)  # a video file on a web server (PyAV)
    source = open_source("shots/*.jpg")        # glob
    source = open_source(0)                    # webcam 0 (OpenCV)
    source = open_source("rtsp://host/stream") # stream URL (OpenCV)
    for name, frame in source: ...

Frames are preprocessed one at a time with :func:`preprocess_image`. Image files whose frames
would come out with different heights (crop mode, mixed aspect ratios) are padded with white,
centred, to the tallest, as :func:`load_images` pads a batch (the reference's rule): their
sizes are read from the files' headers before the first frame. An image smaller than one
patch a side is refused (it holds no picture to reconstruct); one upscaled more than
:data:`MAX_UPSCALE` times is told in a warning, once a pass (its frame is mostly interpolated).
"""
from __future__ import annotations

import glob as globlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mapstream.config import DEFAULT_IMAGE_SIZE
from mapstream.io.images import (
    Mode,
    check_preprocess_args,
    check_selection,
    list_images,
    natural_sort_key,
    open_image,
    oriented_size,
    pad_white,
    preprocess_image,
    preprocess_pixel_map,
    preprocessed_height,
    resized_shape,
)
from mapstream.io.video import (
    VIDEO_EXTENSIONS, VideoInfo, is_video_url, iter_video_frames, probe_video, sample_interval, video_stem,
)

logger = logging.getLogger(__name__)

MAX_UPSCALE = 4.0
"""Preprocessing that enlarges a picture more than this many times is told in a warning."""

NamedImages = Callable[[], Iterator[tuple[str, Image.Image]] | Iterator[tuple[str, Image.Image, float | None]]]
"""Yields (name, image), or (name, image, time in seconds) where the input knows when a
frame was shown or captured."""


def _video_frames_kept(info: VideoInfo, fps: float | None, stride: int, first_k: int | None) -> int | None:
    """How many frames `iter_video_frames` will yield, from the container's frame count or
    duration (None when the header has neither): every `interval`-th decoded frame, then
    every `stride`-th, then at most `first_k`."""
    frames = info.estimated_frames
    if frames is None:
        return None
    kept = -(-frames // sample_interval(info.src_fps, fps))
    kept = -(-kept // stride)
    return kept if first_k is None else min(kept, first_k)


# Clockwise quarter turns as PIL transposes (PIL's ROTATE_* turn counter-clockwise).
_CLOCKWISE = {
    0: None, 90: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_90,
}


class FrameSource:
    """Iterable of ``(name, frame)``; ``frame`` is ``[3, H, W]`` float32 in [0, 1].

    ``length`` is the frame count when known in advance (files), else None (video, webcam);
    ``len()`` raises TypeError when it is None. ``expected_length`` is the best estimate
    before reading: the length, or for a video the count its header implies (the container
    may be wrong by a few frames), else None (live).  Iterating again restarts from the first
    frame (a webcam restarts capturing).
    """

    def __init__(
        self,
        frames: NamedImages,
        *,
        length: int | None,
        description: str,
        expected_length: int | None = None,
        mode: Mode = "crop",
        image_size: int = DEFAULT_IMAGE_SIZE,
        patch_size: int = 14,
        pad_height: int | None = None,
        rotate: int = 0,
    ) -> None:
        """pad_height: pad shorter frames with white (centred) to this height. rotate: turn
        every image clockwise by this many degrees (0, 90, 180, 270) before preprocessing,
        losslessly (the reference demo's --rotate_clockwise_90 is 90)."""
        check_preprocess_args(mode, image_size, patch_size)  # before any frame is read
        if rotate not in _CLOCKWISE:
            raise ValueError(f"rotate must be 0, 90, 180 or 270 (degrees clockwise), got {rotate!r}")
        self.rotate = rotate
        self._frames = frames
        self.length = length
        self.expected_length = length if length is not None else expected_length
        self.description = description
        self.mode, self.image_size, self.patch_size = mode, image_size, patch_size
        self.pad_height = pad_height
        self.frame_height: int | None = pad_height
        """The frames' height after preprocessing where it is known before reading (image
        files: their headers, the tallest; a video: its container); None for live input."""
        self.last_time: float | None = None
        """Seconds at which the frame yielded last was shown (video) or captured (live), or
        None when the input does not say (image files)."""
        self.last_pixel_map: np.ndarray | None = None
        """[3, 3]: the frame yielded last's pixel coordinates from those of its image as read
        (before `rotate`), pixel centres at +0.5 (`mapstream.io.intrinsics.frame_intrinsics`)."""
        self.last_picture_size: tuple[int, int] | None = None
        """(width, height) of the frame yielded last's image as read, before `rotate`."""

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        first: tuple[int, int] | None = None  # a stream's frame size, kept when it changes
        told = False  # of a size change, once a pass: a switched stream stays switched
        told_upscale = False
        for name, image, *when in self._frames():
            self.last_time = when[0] if when else None
            self.last_picture_size = image.size
            turn = _turn_map(*image.size, self.rotate)
            if self.rotate:
                image = image.transpose(_CLOCKWISE[self.rotate])
            scale = self._check_picture_size(name, image)
            if scale > MAX_UPSCALE and not told_upscale:
                told_upscale = True
                logger.warning(
                    "%s: frame %s is %dx%d, upscaled %.0f times to the model's %d-pixel frames: most of what the model "
                    "sees is interpolated, so its depth and pose are unreliable; give the images at their full size",
                    self.description, name, image.size[0], image.size[1], scale, self.image_size,
                )
            try:
                frame = preprocess_image(image, self.mode, self.image_size, self.patch_size)
            except ValueError as err:
                raise ValueError(f"frame {name} of {self.description}: {err}") from err
            pixel_map = preprocess_pixel_map(*image.size, self.mode, self.image_size, self.patch_size) @ turn
            height = frame.shape[1]
            if self.pad_height is not None and frame.shape[1] < self.pad_height:
                frame = pad_white(frame, self.pad_height, frame.shape[2])
            elif self.pad_height is None:
                if first is None:
                    first = tuple(frame.shape[1:])
                elif tuple(frame.shape[1:]) != first and frame.shape[2] == first[1]:
                    if not told:
                        told = True
                        logger.warning(
                            "%s: frame %s is %dx%d after preprocessing, the stream's first %dx%d; it and later frames "
                            "of another size are padded with white or centre-cropped to that size",
                            self.description, name, frame.shape[2], frame.shape[1], first[1], first[0],
                        )
                    frame = _to_height(frame, first[0])
            pixel_map[1, 2] += _centred_shift(height, frame.shape[1])
            self.last_pixel_map = pixel_map
            yield name, frame

    def _check_picture_size(self, name: str, image: Image.Image) -> float:
        """How many times ``image`` is upscaled by preprocessing; a ValueError for an image
        smaller than one patch a side, which holds less picture than one of the model's patches
        (every pixel of its frame would be invented)."""
        width, height = image.size
        if min(width, height) < self.patch_size:
            raise ValueError(
                f"frame {name} of {self.description} is {width}x{height} pixels, smaller than one {self.patch_size}-pixel "
                f"patch a side: upscaled to a {self.image_size}-pixel frame it holds no picture to reconstruct; "
                "leave it out or give the image at its full size"
            )
        new_w, new_h = resized_shape(width, height, self.mode, self.image_size, self.patch_size)
        return max(new_w / width, new_h / height)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(f"the length of {self.description} is not known in advance")
        return self.length

    def __repr__(self) -> str:
        return f"FrameSource({self.description}, length={self.length})"

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def from_paths(
        cls, paths: Sequence[str | os.PathLike], *, first_k: int | None = None, stride: int = 1,
        **preprocess: Any,
    ) -> FrameSource:
        """Image files in the given order (stride, then first_k)."""
        check_selection(stride, first_k)
        files = [Path(p) for p in paths][::stride][:first_k]
        if not files:
            raise ValueError("no image paths given")

        def frames() -> Iterator[tuple[str, Image.Image]]:
            for f in files:
                yield f.name, open_image(f)

        source = cls(frames, length=len(files), description=f"{len(files)} image files", **preprocess)
        heights = _file_heights(files, source.mode, source.image_size, source.patch_size, source.rotate)
        source.pad_height = _common_height(heights, source.image_size)
        source.frame_height = max(heights)
        return source

    @classmethod
    def from_folder(
        cls, folder: str | os.PathLike, *, first_k: int | None = None, stride: int = 1,
        **preprocess: Any,
    ) -> FrameSource:
        """The images of a folder, see :func:`list_images` (stride first, then first_k)."""
        source = cls.from_paths(list_images(folder, first_k=first_k, stride=stride), **preprocess)
        source.description = f"folder {folder}"
        return source

    @classmethod
    def from_glob(
        cls, pattern: str, *, first_k: int | None = None, stride: int = 1, **preprocess: Any
    ) -> FrameSource:
        """Files matching a glob pattern, natural-sorted by path (stride, then first_k)."""
        files = glob_files(pattern)
        if not files:
            raise FileNotFoundError(f"no files match {pattern!r}")
        source = cls.from_paths(files, first_k=first_k, stride=stride, **preprocess)
        source.description = f"glob {pattern}"
        return source

    @classmethod
    def from_video(
        cls, path: str | os.PathLike, *, fps: float | None = 10.0, stride: int = 1,
        first_k: int | None = None, **preprocess: Any,
    ) -> FrameSource:
        """Frames of a video file, see :func:`iter_video_frames`; names ``<stem>_<index>``,
        `last_time` the frame's presentation time."""
        if not is_video_url(path) and not Path(path).is_file():
            raise FileNotFoundError(f"video file not found: {path}")
        check_selection(stride, first_k)
        stem = video_stem(path)

        def frames() -> Iterator[tuple[str, Image.Image, float | None]]:
            for f in iter_video_frames(path, fps=fps, stride=stride, first_k=first_k):
                yield f"{stem}_{f.index:06d}", f.image, f.time

        info = probe_video(path)
        source = cls(
            frames, length=None, expected_length=_video_frames_kept(info, fps, stride, first_k),
            description=f"video {path}", **preprocess,
        )
        width, height = (info.height, info.width) if source.rotate in (90, 270) else (info.width, info.height)
        source.frame_height = preprocessed_height(width, height, source.mode, source.image_size, source.patch_size)
        return source

    @classmethod
    def from_capture(
        cls, device: int | str, *, first_k: int | None = None, stride: int = 1,
        **preprocess: Any,
    ) -> FrameSource:
        """A webcam index or a stream URL read with OpenCV; runs until the stream ends,
        or for ``first_k`` frames.  Names ``frame_<n>``; `last_time` the seconds since the
        first frame was read."""
        cv2 = _import_cv2()

        def frames() -> Iterator[tuple[str, Image.Image, float]]:
            cap = cv2.VideoCapture(device)
            if not cap.isOpened():
                raise ValueError(
                    f"cannot open capture device {device!r}: check the webcam index / URL and "
                    "that no other program is using it"
                )
            try:
                index = kept = 0
                first = None
                while first_k is None or kept < first_k:
                    ok, bgr = cap.read()
                    if not ok:
                        break
                    now = time.monotonic()
                    first = now if first is None else first
                    if index % stride == 0:
                        yield f"frame_{index:06d}", Image.fromarray(bgr[:, :, ::-1].copy()), now - first
                        kept += 1
                    index += 1
            finally:
                cap.release()

        return cls(frames, length=None, description=f"capture {device!r}", **preprocess)


def is_glob(text: str) -> bool:
    """Whether ``text`` is a glob pattern (has ``*``, ``?`` or ``[``)."""
    return any(c in text for c in "*?[")


def glob_files(pattern: str) -> list[str]:
    """The files a glob input reads: its matches (``**`` recursive) that are files,
    natural-sorted by path; links that lead to no file (a loop, a missing target) are skipped
    with a warning naming them."""
    matches = sorted(globlib.glob(pattern, recursive=True), key=natural_sort_key)
    dangling = [f for f in matches if os.path.islink(f) and not os.path.exists(f)]
    if dangling:
        shown = ", ".join(dangling[:3]) + (", ..." if len(dangling) > 3 else "")
        logger.warning("%s: skipped %d link%s that lead nowhere (a loop of links, or a missing target): %s",
                       pattern, len(dangling), "" if len(dangling) == 1 else "s", shown)
    return [f for f in matches if os.path.isfile(f)]


def _turn_map(width: int, height: int, rotate: int) -> np.ndarray:
    """[3, 3] map of continuous pixel coordinates of a ``width x height`` image to those of the
    image turned ``rotate`` degrees clockwise."""
    return {
        0: np.eye(3),
        90: np.array([[0.0, -1.0, height], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]),
        180: np.array([[-1.0, 0.0, width], [0.0, -1.0, height], [0.0, 0.0, 1.0]]),
        270: np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, width], [0.0, 0.0, 1.0]]),
    }[rotate]


def _centred_shift(before: int, after: int) -> int:
    """Where row 0 of a frame `before` rows tall lies once it is padded (white, centred) or its
    rows centre-cropped to `after` rows, as `pad_white` and `_to_height` do."""
    return (after - before) // 2 if after >= before else -((before - after) // 2)


def _to_height(frame: torch.Tensor, height: int) -> torch.Tensor:
    """A stream's frame whose picture changed size (a video's resolution switch) made ``height``
    tall, as one sequence needs: padded with white (the files' rule) or its rows centre-cropped.
    Crop preprocessing keeps the width; a frame whose width differs is left to the session,
    which says what is wrong."""
    if frame.shape[1] < height:
        return pad_white(frame, height, frame.shape[2])
    top = (frame.shape[1] - height) // 2
    return frame[:, top : top + height]


def _file_heights(files: Sequence[Path], mode: Mode, image_size: int, patch_size: int, rotate: int) -> list[int]:
    """Each file's frame height after preprocessing, from the files' headers (their sides
    swapped by a quarter turn)."""
    if mode != "crop":  # pad mode: every frame is image_size x image_size
        return [image_size] * len(files)
    sizes = [oriented_size(f) for f in files]
    if rotate in (90, 270):
        sizes = [(h, w) for w, h in sizes]
    per_file = [preprocessed_height(w, h, mode, image_size, patch_size) for w, h in sizes]
    for f, (w, h), height in zip(files, sizes, per_file):
        if height < patch_size:  # told now, from the headers, not after the frames before it ran
            raise ValueError(
                f"image {f} ({w}x{h}) would be {image_size} wide and less than one {patch_size}-pixel patch tall: "
                "its aspect ratio is too extreme for crop preprocessing; crop it first, or use preprocess 'pad'"
            )
    return per_file


def _common_height(heights: Sequence[int], image_size: int) -> int | None:
    """The height to pad frames of these heights to when they differ (else None)."""
    if len(set(heights)) < 2:
        return None
    tallest = max(heights)
    logger.warning(
        "the images' frames would have different heights %s; padding all with white to %dx%d",
        sorted(set(heights)), tallest, image_size,
    )
    return tallest


def _import_cv2() -> Any:
    try:
        import cv2
    except ImportError as exc:
        raise ImportError(
            "webcam / stream input needs OpenCV: pip install opencv-python-headless"
        ) from exc
    return cv2


def _is_int(text: str) -> bool:
    return text.strip().isdigit()


def open_source(
    spec: int | str | os.PathLike | Iterable[str | os.PathLike], **kwargs: Any
) -> FrameSource:
    """Pick the right :class:`FrameSource` for ``spec``.

    int or digit string (not an existing path) -> webcam; an http(s) URL of a video file ->
    that video, as a file (PyAV: fps sampling, presentation times); other ``scheme://`` ->
    stream URL (OpenCV);
    folder -> images; file with a video extension -> video; other file -> one image; text
    with ``* ? [`` -> glob; list -> those files.  ``kwargs`` go to the constructor
    (fps, stride, first_k, mode, image_size, patch_size); ``fps`` is used by video only.
    """
    fps = kwargs.pop("fps", 10.0)
    digits = isinstance(spec, str) and _is_int(spec) and not Path(spec).exists()
    if isinstance(spec, int) or digits:
        return FrameSource.from_capture(int(spec), **kwargs)
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if is_video_url(text):  # a video file on a web server: as the file would be read
            return FrameSource.from_video(text, fps=fps, **kwargs)
        if "://" in text:
            return FrameSource.from_capture(text, **kwargs)
        path = Path(text)
        if path.is_dir():
            return FrameSource.from_folder(path, **kwargs)
        if path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS:
            return FrameSource.from_video(path, fps=fps, **kwargs)
        if path.is_file():
            return FrameSource.from_paths([path], **kwargs)
        if is_glob(text):
            return FrameSource.from_glob(text, **kwargs)
        raise FileNotFoundError(f"input not found: {text} (expected a folder, file, glob, "
                                "webcam index or stream URL)")
    return FrameSource.from_paths(list(spec), **kwargs)
