"""The "Export" and "Video" folders of a :class:`~mapstream.viewer.app.ViewerApp`: "export GLB",
"screenshot" and "record video", each writing to the path in its field or to a path given by
code.

A path typed into the page is written only inside the app's export folders, and never over
the run's own files (:mod:`mapstream.viewer.export_folders`): whoever reaches the page can type one. A path given to
these methods by a program is that program's own choice. Outcomes (written, refused, failed) go
to the log and the page's status line; nothing is raised to the server.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from mapstream.export import Reconstruction
from mapstream.viewer.actions import export_shown_glb, first_client, save_render
from mapstream.viewer.controls import SCREENSHOT_SIZES, ViewerHandles, glb_style
from mapstream.viewer.export_folders import ExportFolders, RefusedPath
from mapstream.viewer.recording import VideoRecorder, originals_path
from mapstream.viewer.scene import PointPool, SceneFraming

__all__ = ["PageExports"]


class PageExports:
    """The export actions of :class:`~mapstream.viewer.app.ViewerApp`, which sets the attributes
    below and provides the scene's current selection (``_visible_frames``, ``_visible_cameras``,
    ``_frustum_scale``, ``_input_image``) and the status line (``_report``)."""

    recon: Reconstruction
    pool: PointPool
    framing: SceneFraming
    server: Any | None
    handles: ViewerHandles | None
    export_folders: ExportFolders
    _lock: threading.RLock
    _shown: list[np.ndarray]
    _screenshot_thread: threading.Thread | None
    _recorder: VideoRecorder

    def _target(self, path: str | os.PathLike[str] | None, field: Any) -> Path | None:
        """The file to write: ``path`` from code as given, else the page's ``field`` inside the
        export folders; None when empty.

        Raises:
            RefusedPath: the field names a file outside the export folders, or one of the run's own.
        """
        if path is not None:
            text = str(path).strip()
            return Path(text).expanduser().absolute() if text else None
        text = str(field.value).strip()
        return self.export_folders.place(text) if text else None

    def export_glb(self, path: str | os.PathLike[str] | None = None) -> Path | None:
        """Write what the page shows to ``path`` (default: the "GLB path" field) as GLB: the shown
        points, the drawn frustums at their drawn size and, with "show cameras", the trajectory,
        in the folder's style (:func:`~mapstream.viewer.controls.glb_style`). The outcome goes to the log and
        the status; returns the path written, or None when it failed."""
        with self._lock:
            handles = self.handles
            if handles is None:
                return None
            try:
                target = self._target(path, handles.glb_path)
            except RefusedPath as refusal:
                self._report(f"export GLB: {refusal}; nothing was written", failed=True)
                return None
            frames = self._visible_frames()
            index = np.concatenate([self._shown[i] for i in np.flatnonzero(frames)])
            cameras = self._visible_cameras(frames)
            trajectory = bool(handles.show_cameras.value)
            # Frustums as deep as the page draws them ("camera size" included).
            depth = self._frustum_scale() * float(handles.camera_size.value)
        if target is None:
            self._report("export GLB: enter a file path first", failed=True)
            return None
        try:
            style = glb_style(handles, self.framing.extent)  # a value set from code may be out of range
            export_shown_glb(
                self.recon, self.pool, index, cameras, target, trajectory=trajectory, style=style, frustum_depth=depth
            )
        except Exception as err:  # any failure is the user's to see; the server keeps serving
            self._report(f"GLB export to `{target}` failed: {err}", failed=True)
            return None
        spheres = style.points == "spheres"
        drawn = f"{min(len(index), style.max_spheres):,} spheres" if spheres else f"{len(index):,} points"
        self._report(f"wrote `{target}`: {drawn}, {int(cameras.sum())} cameras")
        return target

    def screenshot(self, path: str | os.PathLike[str] | None = None) -> threading.Thread | None:
        """Save the first connected browser's view as PNG to ``path`` (default: the "PNG path"
        field) at the "screenshot size" chosen, on a background thread (a render takes a round
        trip to the browser). Returns the thread, or None when no browser is connected or a
        screenshot is under way (both reported in the status)."""
        with self._lock:
            if self.server is None or self.handles is None:
                return None
            try:
                target, outside = self._target(path, self.handles.png_path), None
            except RefusedPath as err:
                target, outside = None, f"{err}; nothing was written"
            client = first_client(self.server)
            busy = self._screenshot_thread is not None and self._screenshot_thread.is_alive()
            refusal = (
                outside if outside is not None
                else "enter a file path first" if target is None
                else "no browser is connected; open the page first" if client is None
                else "the previous one is not finished" if busy
                else None
            )
            if refusal is not None:
                self._report(f"screenshot: {refusal}", failed=True)
                return None
            height = SCREENSHOT_SIZES[self.handles.screenshot_size.value]
            thread = threading.Thread(
                target=self._take_screenshot, args=(client, target, height), name="mapstream-viewer-screenshot",
                daemon=True,
            )
            self._screenshot_thread = thread
            thread.start()  # inside the lock: a second click sees this one alive
        return thread

    def _take_screenshot(self, client: Any, target: Path, height: int | None) -> None:
        try:
            save_render(client, target, height=height)
        except Exception as err:  # a closed tab, a timeout or a bad path: reported, never raised
            self._report(f"screenshot to `{target}` failed: {err}", failed=True)
            return
        self._report(f"wrote `{target}`")

    def record_video(self, path: str | os.PathLike[str] | None = None) -> threading.Thread | None:
        """Record frames 0 to last, as the "show" mode draws them and the first connected browser
        sees them, to ``path`` (default: the "video path" field) at the "Video" folder's
        resolution and fps, on a background thread (see :class:`VideoRecorder`). Returns the
        thread, or None when refused (no path or not a video file, no browser connected, a
        recording under way; reported in the status)."""
        with self._lock:
            if self.server is None or self.handles is None:
                return None
            try:
                target = self._target(path, self.handles.video_path)
                if path is None and target is not None and self.handles.video_originals.value:
                    self.export_folders.place(str(originals_path(target)))  # written beside it
            except RefusedPath as refusal:
                self._report(f"record video: {refusal}; nothing was written", failed=True)
                return None
            return self._recorder.start(
                self.handles, first_client(self.server), target, len(self.recon), originals=self._input_image
            )

    def stop_recording(self) -> bool:
        """Stop the recording under way after the frame it is rendering; no video is written.
        Returns whether one was under way."""
        return self._recorder.stop()

    def toggle_recording(self) -> None:
        """The "record video" button: stop the recording under way, or start one."""
        if not self.stop_recording():
            self.record_video()
