"""The viewer's "Video" folder: a video of the frames as a browser draws them.

:func:`record_video` (no GUI) puts each frame on the page in turn (a ``show`` callback: the
viewer's own frame-change path), asks the browser for a render of its current view at one fixed
size and encodes the renders with :class:`mapstream.render.video.VideoWriter`. Like the exports
it writes atomically: a recording that fails or is stopped leaves any earlier file at the path
as it was and no temp file. It raises on failure. :class:`VideoRecorder` runs it for the
viewer's "record video" button on a background thread and turns the outcome into a status line
(:mod:`mapstream.viewer.app` wires it up).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mapstream.render.video import VideoWriter, check_video_path, even_size
from mapstream.viewer.actions import RENDER_TIMEOUT_S, canvas_size
from mapstream.viewer.controls import RECORD_LABEL, STOP_RECORDING_LABEL, VIDEO_HEIGHTS, ViewerHandles

logger = logging.getLogger(__name__)

__all__ = [
    "PAGE_BACKGROUND", "RecordingCancelled", "VideoRecorder", "fit_render", "originals_path", "record_video", "video_size",
]

PAGE_BACKGROUND = (255, 255, 255)
"""The page's background colour (white; what a JPEG render shows): a PNG render's transparent
pixels are put on it, so both transports give the same picture."""


class RecordingCancelled(Exception):
    """The recording was stopped before its video was complete; nothing was written."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"recording stopped after {done} of {total} frames")
        self.done, self.total = done, total


def video_size(client: Any, height: int) -> tuple[int, int]:
    """(height, width) of a video ``height`` tall (made even) with the aspect of ``client``'s
    canvas, so the recording looks like the page; both sides even for the encoder."""
    if height < 2:
        raise ValueError(f"the video height must be >= 2 pixels (e.g. 720 or 1080), got {height}")
    return even_size(canvas_size(client), height)


def fit_render(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """A browser's render as a video frame: [height, width, 3] uint8 RGB. An RGBA render (PNG
    transport: the background is transparent) is put on :data:`PAGE_BACKGROUND`, as dropping
    its alpha would turn the background black; a render of another size (the browser may answer
    at its own pixel ratio) is resized, as the video's frames must all have one size.

    Raises:
        ValueError: the render is not an [H, W, 3] or [H, W, 4] uint8 image.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(
            f"the browser's render is not an RGB or RGBA uint8 image: got {list(image.shape)} {image.dtype}"
        )
    rgb = _on_background(image) if image.shape[2] == 4 else np.ascontiguousarray(image)
    if rgb.shape[:2] == (height, width):
        return rgb
    from PIL import Image

    logger.debug("resizing a %dx%d render to %dx%d", rgb.shape[1], rgb.shape[0], width, height)
    return np.asarray(Image.fromarray(rgb).resize((width, height), Image.Resampling.BILINEAR))


def _on_background(rgba: np.ndarray) -> np.ndarray:
    """[H, W, 4] uint8 RGBA (straight alpha, as PNG stores it) over :data:`PAGE_BACKGROUND`."""
    alpha = rgba[..., 3:].astype(np.float32) / 255
    rgb = rgba[..., :3] * alpha + np.asarray(PAGE_BACKGROUND, np.float32) * (1 - alpha)
    return np.rint(rgb).astype(np.uint8)


def _check_not_cancelled(cancel: threading.Event | None, done: int, total: int) -> None:
    if cancel is not None and cancel.is_set():
        raise RecordingCancelled(done, total)


def originals_path(path: str | os.PathLike[str]) -> Path:
    """Where the input frames' video of a recording to ``path`` goes: ``NAME_original.SUFFIX``
    beside it (the reference viewer's name)."""
    path = Path(path)
    return path.with_name(f"{path.stem}_original{path.suffix}")


def record_video(
    client: Any,
    show: Callable[[int], None],
    frames: Iterable[int],
    path: str | os.PathLike[str],
    *,
    height: int = 1080,
    fps: float = 10.0,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    timeout: float = RENDER_TIMEOUT_S,
    transport_format: Literal["jpeg", "png"] = "jpeg",
    originals: Callable[[int], np.ndarray] | None = None,
) -> Path:
    """Record ``frames`` (frame indices, in this order) as ``client`` (a viser ClientHandle)
    sees them: for each, ``show(t)`` puts frame ``t`` on the page, then the browser renders its
    current view at :func:`video_size` and the render becomes one video frame (see
    :func:`fit_render`). ``progress(done, total)`` is called after each frame; ``cancel`` is
    checked before each frame and before the video is closed. JPEG renders (the default) keep
    each round trip small; the video is lossy anyway. ``originals(t)``, if given, is frame
    ``t``'s input image ([H, W, 3] uint8): they make a second video at :func:`originals_path`,
    frame for frame, at their own size (cut to even sides), written or not with the first.

    Returns:
        ``path``, once the whole video is there.

    Raises:
        ValueError: ``path`` does not end in a video suffix, ``frames`` is empty, or ``height`` or
            ``fps`` is out of range; all checked before the first render.
        RecordingCancelled: ``cancel`` was set; no file was written.
        TimeoutError: the browser sent no frame within ``timeout`` seconds; no file was written.
        OSError: the file cannot be written.
    """
    frames = [int(t) for t in frames]
    if not frames:
        raise ValueError("no frames to record: give at least one frame index")
    size = video_size(client, height)
    video = VideoWriter(path, height=size[0], width=size[1], fps=fps)  # checks the path, fps and PyAV before any render
    path = video.path
    inputs = None
    if originals is not None:
        first = np.asarray(originals(frames[0]))
        even_h, even_w = first.shape[0] // 2 * 2, first.shape[1] // 2 * 2
        inputs = VideoWriter(originals_path(path), height=even_h, width=even_w, fps=fps)
    total = len(frames)
    logger.info("recording %d frames at %dx%d, %g fps to %s", total, size[1], size[0], fps, path)
    # Both videos are committed only when the block ends cleanly (the inputs' first).
    with video, inputs if inputs is not None else contextlib.nullcontext():
        for done, t in enumerate(frames):
            _check_not_cancelled(cancel, done, total)
            show(t)
            image = client.get_render(size[0], size[1], transport_format=transport_format, timeout=timeout)
            video.write(fit_render(image, *size))
            if inputs is not None:
                inputs.write(np.asarray(originals(t))[: inputs.height, : inputs.width])
            if progress is not None:
                progress(done + 1, total)
        _check_not_cancelled(cancel, total, total)  # a stop during the last render still means "no video"
    logger.info("wrote %s: %d frames", path, total)
    return path


class VideoRecorder:
    """The "record video" button of a :class:`~mapstream.viewer.app.ViewerApp`: one recording
    at a time, each on a background thread (every frame is a round trip to the browser).

    While a recording runs it owns the scrubber: "play" is turned off, "play" and the scrubber
    are greyed out and the button reads "stop recording"; afterwards the scrubber is back on the
    frame it showed. Progress ("recording k/n") goes to ``show_message``, outcomes to ``report``
    (the app's status line and log). ``lock`` is the app's: GUI changes are made under it.
    """

    def __init__(
        self, lock: threading.RLock, *, report: Callable[..., None], show_message: Callable[[str], None]
    ) -> None:
        self._lock = lock
        self._report, self._show_message = report, show_message
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._closed = False

    @property
    def running(self) -> bool:
        """Whether a recording is under way."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        """The latest recording's thread (None before the first)."""
        return self._thread

    def start(
        self, handles: ViewerHandles, client: Any | None, path: Path | None, num_frames: int,
        originals: Callable[[int], np.ndarray] | None = None,
    ) -> threading.Thread | None:
        """Record frames ``0..num_frames - 1`` with ``client`` to ``path`` at the resolution and fps
        chosen in the "Video" folder of ``handles``, and the input frames (``originals``) beside
        it when its "also the input frames" box is ticked. Returns the thread, or None when
        refused (no path or not a video file, no browser, a recording under way; reported)."""
        with self._lock:
            refusal = self._refusal(path, client)
            if refusal is not None:
                self._report(f"record video: {refusal}", failed=True)
                return None
            assert path is not None
            height, fps = VIDEO_HEIGHTS[handles.video_height.value], float(handles.video_fps.value)
            inputs = originals if handles.video_originals.value else None
            self._cancel = cancel = threading.Event()  # a fresh one: a late "stop" cannot end the next recording
            start_frame = self._hold_playback(handles)
            self._show_message(f"recording 0/{num_frames}")
            thread = threading.Thread(
                target=self._run,
                args=(handles, client, path, range(num_frames), height, fps, cancel, start_frame, inputs),
                name="mapstream-viewer-record", daemon=True,
            )
            self._thread = thread
            thread.start()  # inside the lock: a second click sees this one alive
        return thread

    def stop(self) -> bool:
        """Stop the recording under way after the frame it is rendering: no video is written and
        an earlier file at its path stays. Returns whether a recording was under way."""
        with self._lock:
            if not self.running:
                return False
            self._cancel.set()
            return True

    def close(self) -> None:
        """The viewer is stopping: stop a recording under way and leave the controls alone (their
        server is going away). Join :attr:`thread` once the server has stopped."""
        with self._lock:
            self._closed = True
            self._cancel.set()

    def _refusal(self, path: Path | None, client: Any | None) -> str | None:
        """Why a recording cannot start now, or None."""
        if path is None:
            return "enter a file path first"
        try:
            check_video_path(path)
        except ValueError as err:
            return str(err)
        if client is None:
            return "no browser is connected; open the page first"
        return "a recording is under way; stop it first" if self.running else None

    def _hold_playback(self, handles: ViewerHandles) -> int:
        """Give the scrubber to a recording; returns the frame shown, to come back to."""
        handles.play.value = False
        handles.play.disabled = handles.frame.disabled = True
        handles.record_video.label = STOP_RECORDING_LABEL
        return int(handles.frame.value)

    def _release_playback(self, handles: ViewerHandles, frame: int, num_frames: int) -> None:
        """Undo :meth:`_hold_playback` and show ``frame`` again."""
        with self._lock:
            if self._closed:
                return
            handles.play.disabled = handles.frame.disabled = num_frames == 1  # as add_controls set them
            handles.record_video.label = RECORD_LABEL
            handles.frame.value = frame

    def _show_frame(self, handles: ViewerHandles, t: int) -> None:
        """Put frame ``t`` on the page as the scrubber does (its callback redraws the scene)."""
        with self._lock:
            if not self._closed:
                handles.frame.value = t

    def _run(
        self, handles: ViewerHandles, client: Any, path: Path, frames: range, height: int, fps: float,
        cancel: threading.Event, start_frame: int, originals: Callable[[int], np.ndarray] | None,
    ) -> None:
        try:
            record_video(
                client, lambda t: self._show_frame(handles, t), frames, path, height=height, fps=fps,
                cancel=cancel, progress=lambda done, total: self._show_message(f"recording {done}/{total}"),
                originals=originals,
            )
            also = f" and `{originals_path(path)}`" if originals is not None else ""
            outcome, failed = f"wrote `{path}`{also} ({len(frames)} frames)", False
        except RecordingCancelled as stop:
            outcome, failed = f"recording stopped after {stop.done} of {stop.total} frames; no video written", False
        except Exception as err:  # a closed tab, a timeout or a bad path: reported, never raised
            outcome, failed = f"recording to `{path}` failed: {err}", True
        finally:
            self._release_playback(handles, start_frame, len(frames))
        self._report(outcome, failed=failed)
