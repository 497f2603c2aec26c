"""The viser viewer of a :class:`Reconstruction`: :class:`ViewerApp`.

    app = ViewerApp(recon, ViewerOptions(conf_threshold=2.0), port=8080).start()
    print(app.url)          # open in a browser
    app.wait()              # until Ctrl-C (or app.stop() from another thread)
    app.stop()              # frees the port

Scene tree: ``/points/frame_000000`` (one point cloud per frame, so the scrubber only toggles
visibility), ``/cameras/frame_000000`` (frustums with the frame image, coloured along the
trajectory), ``/trajectory``. Which points, frustums and viewpoints are shown comes from
:mod:`mapstream.viewer.scene`; the options and the panel's layout are in
:mod:`mapstream.viewer.controls`, the "Export" and "Video" buttons in
:mod:`mapstream.viewer.page_exports` (with the GLB and PNG writers of
:mod:`mapstream.viewer.actions` and the recorder of :mod:`mapstream.viewer.recording`). Needs
``pip install 'mapstream[viewer]'`` (viser); viser is imported only when a server starts
(:mod:`mapstream.viewer.server`).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from mapstream.export import Reconstruction
from mapstream.pipeline.own_files import run_own_files
from mapstream.viewer.controls import LOOK_AT_CENTRE, VIEW_STEP_S, ViewerHandles, ViewerOptions, add_controls
from mapstream.viewer.export_folders import ExportFolders
from mapstream.viewer.page_exports import PageExports
from mapstream.viewer.recording import VideoRecorder
from mapstream.viewer.scene import (
    build_point_pool,
    downscale_image,
    frustum_params,
    scene_framing,
    select_points,
    trajectory_colors,
    view_preset,
    visible_cameras,
    visible_frames,
)
from mapstream.viewer.server import Served, check_port, move_cameras, start_server

logger = logging.getLogger(__name__)

__all__ = ["ViewerApp", "ViewerOptions"]


class ViewerApp(PageExports, Served):
    """Serve a reconstruction with viser: points, cameras, a frame scrubber and controls.

    The point pool and the scene framing are computed on construction (no server yet);
    :meth:`start` binds the port and builds the scene, :meth:`stop` frees it. Also a context
    manager (``with ViewerApp(recon).start() as app: ...``). ``output_dir`` (the run folder) is
    where the "Export" folder's files go by default; without it, the current directory. Paths
    typed into the page are written only inside that folder or one of ``export_dirs``, and never
    over the run's own inputs and outputs (:mod:`mapstream.viewer.export_folders`,
    :mod:`mapstream.pipeline.own_files`); paths given to the methods from code are the
    caller's own. The websocket talks to the viewer's own page and to pages of
    ``allowed_origins`` only (:mod:`mapstream.viewer.origin_guard`). ``notices`` (e.g. that the
    run did not finish, or that its weights were untrained) stand at the top of the panel.
    """

    def __init__(
        self,
        recon: Reconstruction,
        options: ViewerOptions | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        title: str = "mapstream",
        output_dir: str | os.PathLike[str] | None = None,
        export_dirs: Iterable[str | os.PathLike[str]] = (),
        allowed_origins: Iterable[str] = (),
        notices: Iterable[str] = (),
    ) -> None:
        self.recon = recon
        self.options = options or ViewerOptions()
        self.options.validate()
        self.host, self.requested_port, self.title = host, check_port(port), title
        self.output_dir = Path(output_dir) if output_dir is not None else None
        protected = run_own_files(self.output_dir).owns if self.output_dir is not None else None
        self.export_folders = ExportFolders([self.output_dir or Path.cwd(), *export_dirs], protected)
        self.allowed_origins = tuple(allowed_origins)
        self.notices = tuple(notices)
        self.pool = build_point_pool(recon, self.options.max_points, self.options.seed)
        self.framing = scene_framing(recon, self.pool)
        self.server: Any | None = None
        self.handles: ViewerHandles | None = None
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._player: threading.Thread | None = None
        self._shown: list[np.ndarray] = [np.empty(0, np.int64) for _ in range(len(recon))]
        self._image_frame = -1  # the frame in the "Frame image" panel
        self._message = ""  # the last export / screenshot outcome, under the status
        self._screenshot_thread: threading.Thread | None = None
        self._stopped = False
        self._recorder = VideoRecorder(self._lock, report=self._report, show_message=self._show_message)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> ViewerApp:
        """Bind the server (viser takes the next free port if ``port`` is taken) and build the scene."""
        if self.server is not None:
            raise RuntimeError("ViewerApp is already started")
        if self._stopped:
            # Its shown points, recorder and scene handles belonged to the stopped server.
            raise RuntimeError("a ViewerApp cannot start again once stopped; make a new one")
        self.server = start_server(self.host, self.requested_port, self.title, self.allowed_origins)
        try:
            self._build_scene()
        except BaseException:
            self.stop()
            raise
        self._stop_event.clear()
        self._player = threading.Thread(target=self._play_loop, name="mapstream-viewer-play", daemon=True)
        self._player.start()
        logger.info("viewer: %d frames, %d points at %s", len(self.recon), len(self.pool), self.url)
        return self

    def stop(self) -> None:
        """Stop the play thread, a recording and the server; the port is free when this returns.
        Idempotent."""
        self._stop_event.set()
        self._recorder.close()  # before the server stops: a recording ends at a frame boundary if it can
        if self._player is not None:
            self._player.join(timeout=5.0)
            self._player = None
        if self.server is not None:
            server, self.server = self.server, None
            self.handles = None
            self._stopped = True
            server.stop()  # a render still awaited from a browser now ends with an error
            logger.info("viewer stopped")
        for what, thread in (("a screenshot", self._screenshot_thread), ("a recording", self._recorder.thread)):
            if thread is not None:
                thread.join(timeout=5.0)
                if thread.is_alive():
                    logger.warning("viewer: %s was still waiting for its browser when the viewer stopped", what)
        self._screenshot_thread = None

    def wait(self) -> None:
        """Block until :meth:`stop` is called (from another thread) or Ctrl-C."""
        try:
            while not self._stop_event.wait(0.5):
                pass
        except KeyboardInterrupt:
            logger.info("viewer: interrupted")

    @property
    def shown_point_count(self) -> int:
        """Points currently shown (frames hidden by the scrubber excluded)."""
        if self.handles is None:
            return 0
        frames = self._visible_frames()
        return int(sum(len(idx) for idx, on in zip(self._shown, frames) if on))

    # -- scene --------------------------------------------------------------------------------
    def _build_scene(self) -> None:
        assert self.server is not None
        server, recon, options, framing = self.server, self.recon, self.options, self.framing
        n = len(recon)
        server.scene.set_up_direction(tuple(framing.up))
        server.initial_camera.position = tuple(framing.camera_position)
        server.initial_camera.look_at = tuple(framing.look_at)
        server.initial_camera.up = tuple(framing.up)
        conf_max = float(np.percentile(self.pool.conf, 99)) if len(self.pool) else 2.0
        size = options.point_size or framing.point_size
        handles = add_controls(
            server.gui, options, num_frames=n, conf_max=max(conf_max, options.conf_threshold, 1.01),
            point_size=size, has_sky_mask=self.pool.has_sky_mask, frame_image=self._frame_image(n - 1),
            glb_path=self._default_path("view.glb"), png_path=self._default_path("screenshot.png"),
            video_path=self._default_path("viewer.mp4"), notices=self.notices,
        )
        self._image_frame = n - 1

        colors = trajectory_colors(n)
        for i in range(n):
            fov, aspect, wxyz, position = frustum_params(recon, i)
            handles.frustums.append(server.scene.add_camera_frustum(
                f"/cameras/frame_{i:06d}", fov=fov, aspect=aspect, scale=self._frustum_scale(),
                thickness=0.002 * framing.extent, color=tuple(int(c) for c in colors[i]),
                image=downscale_image(recon.images[i], max(options.thumbnail_size, 1)),
                wxyz=wxyz, position=position,
            ))
            handles.point_clouds.append(server.scene.add_point_cloud(
                f"/points/frame_{i:06d}", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint8),
                point_size=size, precision="float32", point_shading="flat",
            ))
        if n > 1:
            positions = recon.T_world_cam[:, :, 3]
            segments = np.stack([positions[:-1], positions[1:]], axis=1)
            segment_colors = np.stack([colors[:-1], colors[1:]], axis=1)
            handles.trajectory = server.scene.add_line_segments(
                "/trajectory", segments, segment_colors, thickness=0.001 * framing.extent
            )
        self.handles = handles
        self.refresh_points()
        self.refresh_frames()

        h = handles
        for control in (h.conf_threshold, h.downsample) + ((h.hide_sky,) if h.hide_sky is not None else ()):
            control.on_update(lambda _event: self.refresh_points())
        for control in (h.frame, h.frame_mode, h.show_cameras, h.camera_every, h.show_frame_image):
            control.on_update(lambda _event: self.refresh_frames())
        h.point_size.on_update(lambda _event: self._set_point_size())
        h.reset_view.on_click(lambda _event: self.reset_view())
        h.look_from.on_click(lambda event: self.apply_view(event.target.value))
        h.go_to.on_click(lambda event: self.apply_view(event.target.value))
        h.export_glb.on_click(lambda _event: self.export_glb())
        h.screenshot.on_click(lambda _event: self.screenshot())
        h.record_video.on_click(lambda _event: self.toggle_recording())
        h.step.on_click(lambda event: self.step_frame(-1 if event.target.value == "prev" else 1))
        h.camera_size.on_update(lambda _event: self._set_camera_size())
        for i, frustum in enumerate(handles.frustums):
            frustum.on_click(lambda _event, i=i: self.show_frame(i))

    def _frame_t(self) -> int:
        assert self.handles is not None
        return min(int(self.handles.frame.value), len(self.recon) - 1)

    def _visible_frames(self) -> np.ndarray:
        assert self.handles is not None
        return visible_frames(len(self.recon), self._frame_t(), self.handles.frame_mode.value)

    def _visible_cameras(self, frames: np.ndarray) -> np.ndarray:
        """The frames whose frustum is drawn: scrubber, "show 1 camera in", "show cameras"."""
        assert self.handles is not None
        every = int(self.handles.camera_every.value)
        return visible_cameras(frames, self._frame_t(), every) & bool(self.handles.show_cameras.value)

    def _frame_image(self, t: int) -> np.ndarray:
        return downscale_image(self.recon.images[t], self.options.frame_image_size)

    def _input_image(self, t: int) -> np.ndarray:
        """Frame ``t`` as it went into the model ([H, W, 3] uint8), for the inputs' video."""
        return np.asarray(self.recon.images[t])

    def _default_path(self, name: str) -> str:
        return str(self.output_dir / name) if self.output_dir is not None else name

    def refresh_points(self) -> None:
        """Re-select the points from the current threshold / sky / downsample controls."""
        with self._lock:
            handles = self.handles
            if handles is None:
                return
            hide_sky = bool(handles.hide_sky.value) if handles.hide_sky is not None else False
            mask = select_points(
                self.pool, float(handles.conf_threshold.value), hide_sky=hide_sky,
                downsample=int(handles.downsample.value),
            )
            for i, cloud in enumerate(handles.point_clouds):
                part = self.pool.frame_slice(i)
                index = part.start + np.flatnonzero(mask[part])
                if np.array_equal(index, self._shown[i]):
                    continue
                self._shown[i] = index
                cloud.points = self.pool.xyz[index]
                cloud.colors = self.pool.rgb[index]
            self._update_status()

    def refresh_frames(self) -> None:
        """Show the point clouds and frustums of the frames selected by the scrubber."""
        with self._lock:
            handles = self.handles
            if handles is None:
                return
            frames = self._visible_frames()
            cameras = self._visible_cameras(frames)
            for on, camera, cloud, frustum in zip(frames, cameras, handles.point_clouds, handles.frustums):
                cloud.visible = bool(on)
                frustum.visible = bool(camera)
            if handles.trajectory is not None:
                handles.trajectory.visible = bool(handles.show_cameras.value)
            show_image = bool(handles.show_frame_image.value)
            handles.frame_image.visible = show_image
            t = self._frame_t()
            if show_image and t != self._image_frame:  # JPEG-encoded and sent on every change
                handles.frame_image.image = self._frame_image(t)
                self._image_frame = t
            self._update_status()

    def show_frame(self, i: int) -> None:
        """Move the scrubber to frame `i` (clamped); what a click on a camera does. Ignored while
        a recording runs (it moves the scrubber itself)."""
        if self.handles is not None and not self._recorder.running:
            self.handles.frame.value = min(max(int(i), 0), len(self.recon) - 1)

    def step_frame(self, delta: int) -> None:
        """Move the scrubber by `delta` frames, wrapping around ("prev" / "next"). Ignored while
        a recording runs."""
        if self.handles is not None and not self._recorder.running:
            self.handles.frame.value = (int(self.handles.frame.value) + delta) % len(self.recon)

    def _frustum_scale(self) -> float:
        """A frustum's size at "camera size" 1: a small share of the scene's extent."""
        return 0.03 * self.framing.extent

    def _set_camera_size(self) -> None:
        with self._lock:
            if self.handles is not None:
                scale = self._frustum_scale() * float(self.handles.camera_size.value)
                for frustum in self.handles.frustums:
                    frustum.scale = scale

    def _set_point_size(self) -> None:
        with self._lock:
            if self.handles is not None:
                for cloud in self.handles.point_clouds:
                    cloud.point_size = float(self.handles.point_size.value)

    def _update_status(self) -> None:
        assert self.handles is not None
        t = self._frame_t()
        self.handles.status.content = (
            f"**{len(self.recon)} frames**, frame {t}: `{self.recon.names[t]}`  \n"
            f"{self.shown_point_count:,} of {len(self.pool):,} points shown"
            + (f"  \n{self._message}" if self._message else "")
        )

    def _report(self, message: str, *, failed: bool = False) -> None:
        """Log ``message`` and show it under the status (export, screenshot and video outcomes)."""
        (logger.warning if failed else logger.info)("viewer: %s", message)
        self._show_message(message)

    def _show_message(self, message: str) -> None:
        """Show ``message`` under the status without logging it (a recording's progress)."""
        with self._lock:
            self._message = message
            if self.handles is not None:
                self._update_status()

    def reset_view(self) -> None:
        """Move every connected browser's camera back to the default viewpoint."""
        self.apply_view("overview")

    def apply_view(self, name: str) -> None:
        """Move every connected browser's camera to the viewpoint ``name``, one of
        :data:`mapstream.viewer.scene.VIEW_PRESETS` (see :func:`~mapstream.viewer.scene.view_preset`),
        or turn it where it stands to the scene centre (:data:`~mapstream.viewer.controls.LOOK_AT_CENTRE`)."""
        if self.server is None:
            return
        if name == LOOK_AT_CENTRE:
            view = (None, np.asarray(self.framing.center, np.float64), np.asarray(self.framing.up, np.float64))
        else:
            t = self._frame_t() if self.handles is not None else len(self.recon) - 1
            view = view_preset(self.recon, self.framing, name, t)
        move_cameras(self.server, *view, steps=self.options.view_steps, step_s=VIEW_STEP_S)

    def _play_loop(self) -> None:
        """Advance the frame slider while "play" is checked, until :meth:`stop`."""
        while not self._stop_event.is_set():
            pause = 0.1
            # Under the lock: once a recording has turned "play" off, no step of this loop that
            # saw it on can still move the scrubber under the recording.
            with self._lock:
                handles = self.handles
                if handles is not None and handles.play.value and len(self.recon) > 1 and not self._recorder.running:
                    handles.frame.value = (int(handles.frame.value) + 1) % len(self.recon)
                    pause = 1.0 / max(float(handles.fps.value), 1.0)
            self._stop_event.wait(pause)
