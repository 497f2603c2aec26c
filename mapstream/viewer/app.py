"""The viser viewer of a :class:`Reconstruction`: :class:`ViewerApp`.

    app = ViewerApp(recon, ViewerOptions(conf_threshold=1.5), port=8080).start()
    print(app.url)          # open in a browser
    app.wait()              # until Ctrl-C (or app.stop() from another thread)
    app.stop()              # frees the port

Scene tree: ``/points/frame_000000`` (one point cloud per frame, so the scrubber only toggles
visibility), ``/cameras/frame_000000`` (frustums with the frame image, coloured along the
trajectory), ``/trajectory``. Which points are shown comes from :mod:`mapstream.viewer.scene`.
Needs ``pip install 'mapstream[viewer]'`` (viser); viser is imported only here.
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from mapstream.export import Reconstruction
from mapstream.viewer.scene import (
    DEFAULT_MAX_POINTS,
    FrameMode,
    build_point_pool,
    frustum_params,
    scene_framing,
    select_points,
    trajectory_colors,
    visible_frames,
)

logger = logging.getLogger(__name__)

__all__ = ["ViewerApp", "ViewerOptions"]

DOWNSAMPLE_CHOICES: tuple[str, ...] = ("1", "2", "4", "8", "16", "32")
"""Values of the "keep 1 point in" control."""


def _import_viser() -> Any:
    try:
        import viser
    except ImportError as err:
        raise RuntimeError("the viewer needs viser: pip install 'mapstream[viewer]'") from err
    return viser


@dataclass
class ViewerOptions:
    """Initial values of the viewer's controls and its fixed limits."""

    conf_threshold: float = 1.5
    """Show points whose confidence is strictly greater than this (confidence is > 1)."""
    max_points: int = DEFAULT_MAX_POINTS
    """Most points ever held and shown (seeded uniform subsample beyond)."""
    point_size: float | None = None
    """Point size in world units; None = the median pixel footprint (:class:`SceneFraming`)."""
    downsample: int = 1
    """Initially keep one point in this many (one of 1, 2, 4, ... 32)."""
    frame_mode: FrameMode = "up to t"
    """Initial scrubber mode: frames up to t, only frame t, or all frames."""
    hide_sky: bool = True
    """Initially hide points under the sky mask (when the run has one), as the reference's
    viewer does with sky masking on."""
    play_fps: float = 8.0
    """Frames per second of the "play" button."""
    thumbnail_size: int = 160
    """Longest side in pixels of the image shown in each camera frustum."""
    seed: int = 0
    """Seed of the subsample and of the downsample order."""


@dataclass
class ViewerHandles:
    """viser handles owned by a running :class:`ViewerApp` (GUI controls and scene nodes)."""

    frame: Any
    frame_mode: Any
    play: Any
    fps: Any
    conf_threshold: Any
    point_size: Any
    downsample: Any
    hide_sky: Any | None
    show_cameras: Any
    reset_view: Any
    status: Any
    step: Any = None
    camera_size: Any = None
    point_clouds: list[Any] = field(default_factory=list)
    frustums: list[Any] = field(default_factory=list)
    trajectory: Any | None = None


class ViewerApp:
    """Serve a reconstruction with viser: points, cameras, a frame scrubber and controls.

    The point pool and the scene framing are computed on construction (no server yet);
    :meth:`start` binds the port and builds the scene, :meth:`stop` frees it. Also a context
    manager (``with ViewerApp(recon).start() as app: ...``).
    """

    def __init__(
        self,
        recon: Reconstruction,
        options: ViewerOptions | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        title: str = "mapstream",
    ) -> None:
        self.recon = recon
        self.options = options or ViewerOptions()
        if str(self.options.downsample) not in DOWNSAMPLE_CHOICES:
            raise ValueError(f"downsample must be one of {', '.join(DOWNSAMPLE_CHOICES)}, got {self.options.downsample}")
        if self.options.frame_mode not in get_args(FrameMode):
            raise ValueError(f"frame_mode must be one of {get_args(FrameMode)}, got {self.options.frame_mode!r}")
        if not math.isfinite(self.options.conf_threshold):
            raise ValueError(f"conf_threshold must be a number (confidence is > 1), got {self.options.conf_threshold}")
        size = self.options.point_size
        if size is not None and not 0 < size < math.inf:
            raise ValueError(f"point_size must be > 0 (world units), or unset for the pixel footprint; got {size}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535 (0: any free port), got {port}")
        self.host, self.requested_port, self.title = host, port, title
        self.pool = build_point_pool(recon, self.options.max_points, self.options.seed)
        self.framing = scene_framing(recon, self.pool)
        self.server: Any | None = None
        self.handles: ViewerHandles | None = None
        self._lock = threading.RLock()
        self._stop_event = threading.Event()
        self._player: threading.Thread | None = None
        self._shown: list[np.ndarray] = [np.empty(0, np.int64) for _ in range(len(recon))]

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> ViewerApp:
        """Bind the server (viser takes the next free port if ``port`` is taken) and build the scene."""
        if self.server is not None:
            raise RuntimeError("ViewerApp is already started")
        viser = _import_viser()
        self.server = viser.ViserServer(host=self.host, port=self.requested_port, label=self.title, verbose=False)
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
        """Stop the play thread and the server; the port is free when this returns. Idempotent."""
        self._stop_event.set()
        if self._player is not None:
            self._player.join(timeout=5.0)
            self._player = None
        if self.server is not None:
            server, self.server = self.server, None
            self.handles = None
            server.stop()
            logger.info("viewer stopped")

    def wait(self) -> None:
        """Block until :meth:`stop` is called (from another thread) or Ctrl-C."""
        try:
            while not self._stop_event.wait(0.5):
                pass
        except KeyboardInterrupt:
            logger.info("viewer: interrupted")

    def __enter__(self) -> ViewerApp:
        return self if self.server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port actually bound (after :meth:`start`)."""
        if self.server is None:
            raise RuntimeError("ViewerApp is not started")
        return int(self.server.get_port())

    @property
    def url(self) -> str:
        """``http://host:port``; a wildcard host is shown as 127.0.0.1."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

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

        gui = server.gui
        status = gui.add_markdown("")
        with gui.add_folder("Frames"):
            frame = gui.add_slider("frame", min=0, max=max(n - 1, 1), step=1, initial_value=n - 1, disabled=n == 1)
            frame_mode = gui.add_dropdown("show", get_args(FrameMode), initial_value=options.frame_mode)
            step = gui.add_button_group("step", ("prev", "next"), disabled=n == 1)
            play = gui.add_checkbox("play", False, disabled=n == 1)
            fps = gui.add_slider("fps", min=1, max=30, step=1, initial_value=int(round(options.play_fps)))
        conf_max = float(np.percentile(self.pool.conf, 99)) if len(self.pool) else 2.0
        conf_max = max(conf_max, options.conf_threshold, 1.01)
        size = options.point_size or framing.point_size
        with gui.add_folder("Points"):
            conf_threshold = gui.add_slider(
                "confidence >", min=1.0, max=conf_max, step=(conf_max - 1.0) / 200,
                initial_value=max(options.conf_threshold, 1.0),
            )
            point_size = gui.add_slider(
                "point size", min=size / 10, max=size * 10, step=size / 20, initial_value=size
            )
            downsample = gui.add_dropdown("keep 1 in", DOWNSAMPLE_CHOICES, initial_value=str(options.downsample))
            hide_sky = gui.add_checkbox("hide sky", options.hide_sky) if self.pool.has_sky_mask else None
        with gui.add_folder("Cameras"):
            show_cameras = gui.add_checkbox("show cameras", True)
            camera_size = gui.add_slider("camera size", min=0.1, max=10.0, step=0.1, initial_value=1.0)
            reset_view = gui.add_button("reset view")
        handles = ViewerHandles(
            frame=frame, frame_mode=frame_mode, play=play, fps=fps, conf_threshold=conf_threshold,
            point_size=point_size, downsample=downsample, hide_sky=hide_sky, show_cameras=show_cameras,
            reset_view=reset_view, status=status, step=step, camera_size=camera_size,
        )

        colors = trajectory_colors(n)
        stride = max(1, -(-max(recon.image_hw) // max(options.thumbnail_size, 1)))
        for i in range(n):
            fov, aspect, wxyz, position = frustum_params(recon, i)
            handles.frustums.append(server.scene.add_camera_frustum(
                f"/cameras/frame_{i:06d}", fov=fov, aspect=aspect, scale=self._frustum_scale(),
                thickness=0.002 * framing.extent, color=tuple(int(c) for c in colors[i]),
                image=recon.images[i, ::stride, ::stride], wxyz=wxyz, position=position,
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

        for control in (conf_threshold, downsample) + ((hide_sky,) if hide_sky is not None else ()):
            control.on_update(lambda _event: self.refresh_points())
        for control in (frame, frame_mode, show_cameras):
            control.on_update(lambda _event: self.refresh_frames())
        point_size.on_update(lambda _event: self._set_point_size())
        reset_view.on_click(lambda _event: self.reset_view())
        step.on_click(lambda _event: self.step_frame(-1 if step.value == "prev" else 1))
        camera_size.on_update(lambda _event: self._set_camera_size())
        for i, frustum in enumerate(handles.frustums):
            frustum.on_click(lambda _event, i=i: self.show_frame(i))

    def _visible_frames(self) -> np.ndarray:
        assert self.handles is not None
        t = min(int(self.handles.frame.value), len(self.recon) - 1)
        return visible_frames(len(self.recon), t, self.handles.frame_mode.value)

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
            show_cameras = bool(handles.show_cameras.value)
            for on, cloud, frustum in zip(frames, handles.point_clouds, handles.frustums):
                cloud.visible = bool(on)
                frustum.visible = bool(on) and show_cameras
            if handles.trajectory is not None:
                handles.trajectory.visible = show_cameras
            self._update_status()

    def show_frame(self, i: int) -> None:
        """Move the scrubber to frame `i` (clamped); what a click on a camera does."""
        if self.handles is not None:
            self.handles.frame.value = min(max(int(i), 0), len(self.recon) - 1)

    def step_frame(self, delta: int) -> None:
        """Move the scrubber by `delta` frames, wrapping around ("prev" / "next")."""
        if self.handles is not None:
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
        t = int(self.handles.frame.value)
        self.handles.status.content = (
            f"**{len(self.recon)} frames**, frame {t}: `{self.recon.names[min(t, len(self.recon) - 1)]}`  \n"
            f"{self.shown_point_count:,} of {len(self.pool):,} points shown"
        )

    def reset_view(self) -> None:
        """Move every connected browser's camera back to the default viewpoint."""
        if self.server is None:
            return
        framing = self.framing
        for client in self.server.get_clients().values():
            with client.atomic():
                client.camera.up_direction = tuple(framing.up)
                client.camera.position = tuple(framing.camera_position)
                client.camera.look_at = tuple(framing.look_at)

    def _play_loop(self) -> None:
        """Advance the frame slider while "play" is checked, until :meth:`stop`."""
        while not self._stop_event.is_set():
            handles = self.handles
            if handles is None or not handles.play.value or len(self.recon) < 2:
                self._stop_event.wait(0.1)
                continue
            handles.frame.value = (int(handles.frame.value) + 1) % len(self.recon)
            self._stop_event.wait(1.0 / max(float(handles.fps.value), 1.0))
