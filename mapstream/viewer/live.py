"""`LiveView`: a browser view that grows while a stream is reconstructed (`mapstream run --view`).

    with LiveView(LiveOptions(conf_threshold=2.0), port=8080) as view:
        print(view.url)
        for pred in session.step(frame):
            view.add(pred, frame)        # returns at once; a worker thread draws

Each finished frame adds its points (a seeded subsample of the pixels above the confidence
threshold), its camera frustum and a segment of the trajectory; the browser's camera can
follow the newest camera. The inference never waits for the view: frames queue for a worker
thread, and when the queue is full a frame's points are skipped (its camera still joins the
trajectory). On an endless stream only the newest ``max_frames`` point clouds and frustums
stay in the scene, so the server's and the browser's memory stay bounded; the trajectory is
kept whole (one line segment a frame, sent in chunks so that a frame re-sends at most one
chunk). ``mapstream view RUN_DIR`` shows a finished run with every control.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mapstream.export.points import DEFAULT_CONF_THRESHOLD, measured_pixels
from mapstream.viewer.scene import downscale_image, rotation_to_wxyz
from mapstream.viewer.server import Served, check_port, move_cameras, start_server

logger = logging.getLogger(__name__)

__all__ = ["LiveOptions", "LiveView", "follow_viewpoint", "frame_points"]

TRAJECTORY_CHUNK = 256
"""Trajectory segments per scene node: a new frame re-sends only the newest chunk."""


@dataclass
class LiveOptions:
    """What the live view shows and how much it keeps."""

    conf_threshold: float = DEFAULT_CONF_THRESHOLD
    """Points of pixels whose depth confidence is strictly above this (confidence is > 1)."""
    points_per_frame: int = 20_000
    """Most points a frame adds (seeded uniform subsample of its kept pixels)."""
    max_frames: int = 1_000
    """Point clouds and frustums kept in the scene; older ones leave (bounded memory)."""
    thumbnail_size: int = 96
    """Longest side in pixels of the frame image in each frustum (0: no image)."""
    follow: bool = True
    """Initially move the browser's camera behind each new camera."""
    queue_size: int = 32
    """Frames waiting to be drawn before further frames' points are skipped."""

    def __post_init__(self) -> None:
        if math.isnan(self.conf_threshold):
            raise ValueError(f"conf_threshold is NaN; give a number ({DEFAULT_CONF_THRESHOLD} by default)")
        for name in ("points_per_frame", "max_frames", "queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.thumbnail_size < 0:
            raise ValueError(f"thumbnail_size must be >= 0 (0: no image), got {self.thumbnail_size}")


def frame_points(
    depth: np.ndarray, depth_conf: np.ndarray, K: np.ndarray, T_world_cam: np.ndarray, image: np.ndarray, *,
    conf_threshold: float, max_points: int, seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A frame's world points and colours: measured pixels (`measured_pixels`: finite depth > 0,
    finite confidence) with confidence strictly above ``conf_threshold``, at most ``max_points`` of them (a uniform subsample drawn with
    ``seed``, kept in raster order). ``image`` is [H, W, 3] uint8. Returns ([M, 3] float32,
    [M, 3] uint8)."""
    from mapstream.geometry import unproject_depth

    keep = measured_pixels(depth, depth_conf) & (depth_conf > conf_threshold)
    index = np.flatnonzero(keep)
    if len(index) > max_points:
        index = np.sort(np.random.default_rng(seed).choice(index, max_points, replace=False))
    world = unproject_depth(
        torch.from_numpy(np.ascontiguousarray(depth, np.float64)), torch.from_numpy(K.astype(np.float64)),
        torch.from_numpy(T_world_cam.astype(np.float64)),
    ).reshape(-1, 3).numpy()
    return world[index].astype(np.float32), image.reshape(-1, 3)[index]


def follow_viewpoint(T_world_cam: np.ndarray, distance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eye, look-at point, up) of a viewer behind and above a camera (camera-to-world [R | t],
    OpenCV axes): ``distance`` behind it, a third of that above, looking at the point
    ``distance`` ahead of it."""
    R, t = T_world_cam[:3, :3].astype(np.float64), T_world_cam[:3, 3].astype(np.float64)
    forward, up = R[:, 2], -R[:, 1]
    return t - distance * forward + distance / 3 * up, t + distance * forward, up


def _as_image(frame: torch.Tensor | np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """A [3, H, W] frame in [0, 1] (the model's input) or an [H, W, 3] uint8 image, as
    [H, W, 3] uint8 of the prediction's size."""
    if isinstance(frame, torch.Tensor):
        frame = frame.detach().cpu()
        if frame.dtype.is_floating_point:
            frame = (frame.float().clamp(0, 1) * 255).round().to(torch.uint8)
        frame = frame.permute(1, 2, 0).numpy() if frame.shape[0] == 3 else frame.numpy()
    frame = np.asarray(frame)
    if frame.shape != (*hw, 3):
        raise ValueError(f"a frame image must be [3, {hw[0]}, {hw[1]}] or [{hw[0]}, {hw[1]}, 3], got {list(frame.shape)}")
    return frame.astype(np.uint8, copy=False)


@dataclass
class _Frame:
    index: int
    T_world_cam: np.ndarray  # [3, 4] float64
    K: np.ndarray
    depth: np.ndarray | None  # None: the points were skipped (queue full)
    depth_conf: np.ndarray | None
    image: np.ndarray | None


@dataclass
class _MapUpdate:
    """The global map's keyframes (corrected camera-to-world [3, 4] each) and loop edges."""

    poses: dict[int, np.ndarray]
    loops: list[tuple[int, int]]


class LiveView(Served):
    """A viser server whose scene grows with :meth:`add`; see the module docstring."""

    def __init__(
        self, options: LiveOptions | None = None, *, host: str = "127.0.0.1", port: int = 8080,
        title: str = "mapstream (live)", allowed_origins: Iterable[str] = (), notices: Iterable[str] = (),
    ) -> None:
        """allowed_origins: pages besides the server's own that may connect
        (:mod:`mapstream.viewer.origin_guard`); notices: lines shown in bold at the top of the
        panel (e.g. that the weights are untrained)."""
        self.options = options or LiveOptions()
        self.allowed_origins, self.notices = tuple(allowed_origins), tuple(notices)
        self.host, self.requested_port, self.title = host, check_port(port), title
        self.server: Any | None = None
        self.skipped = 0
        """Frames whose points were skipped because the view fell behind."""
        # Unbounded, but only `queue_size` of the queued frames carry their maps; the others are
        # a camera each (a few hundred bytes), so `add` never blocks.
        self._queue: queue.Queue[_Frame | None] = queue.Queue()
        self._queued_maps = 0
        self._count_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._nodes: OrderedDict[int, tuple[Any, Any]] = OrderedDict()  # frame -> (points, frustum)
        self._positions: list[np.ndarray] = []  # camera centres in arrival order
        self._slots: OrderedDict[int, int] = OrderedDict()  # recent frame -> its place in _positions
        self._chunks: list[Any] = []
        # The median depth of the first frame with valid depth sizes the scene's marks; a pixel's
        # width at that depth is the points' base size.
        self._scale: float | None = None
        self._pixel: float | None = None
        self._points = 0
        self._started_at = time.perf_counter()
        self._gui: dict[str, Any] = {}
        self._lock = threading.Lock()  # the scene's nodes: the worker adds, the GUI's thread resizes
        self._worker_done = False
        self._abandon = threading.Event()
        self._map_shown = (0, 0)
        self._map_nodes: dict[str, Any] = {}  # the global map's trajectory and loop segments

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> LiveView:
        """Bind the server (the next free port if ``port`` is taken) and start drawing."""
        if self.server is not None:
            raise RuntimeError("LiveView is already started")
        if self._worker_done:
            raise RuntimeError("a LiveView cannot start again once stopped (its scene went with its server); make a new one")
        self.server = start_server(self.host, self.requested_port, self.title, self.allowed_origins)
        try:
            gui = self.server.gui
            for notice in self.notices:
                gui.add_markdown(f"**{notice}**")
            self._gui = {
                "status": gui.add_markdown("waiting for the first frame"),
                "follow": gui.add_checkbox("follow the camera", self.options.follow),
                "point_size": gui.add_slider("point size", min=0.1, max=10.0, step=0.1, initial_value=1.0),
            }
            self._gui["point_size"].on_update(lambda _event: self._set_point_size())
            self._started_at = time.perf_counter()
            self._worker = threading.Thread(target=self._draw_loop, name="mapstream-live-view", daemon=True)
            self._worker.start()
        except BaseException:
            self.stop()
            raise
        logger.info("live view at %s", self.url)
        return self

    def stop(self, *, drain: bool = True) -> None:
        """Stop the worker and the server (the port is free when this returns); with ``drain``
        the frames already queued are drawn first (up to 30 s), else the worker stops after
        the frame it is drawing (an interrupted run). Idempotent."""
        if self._worker is not None:
            if not drain:
                self._abandon.set()
            self._queue.put(None)
            self._worker.join(timeout=30.0)
            self._worker = None
            self._worker_done = True
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()
            logger.info("live view stopped")

    def wait(self) -> None:
        """Block until Ctrl-C (the view keeps serving)."""
        try:
            while self.server is not None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            logger.info("live view: interrupted")

    def add_notice(self, notice: str) -> None:
        """Show ``notice`` in bold at the top of the panel too, above the status line: what the
        run learned after the view started (e.g. that it fell back to other weights). A notice
        already shown is not repeated."""
        if notice in self.notices:
            return
        self.notices += (notice,)
        if self.server is not None:
            # Between the notices shown before and the status line, in the order they come.
            order = self._gui["status"].order - 0.5 ** len(self.notices)
            self.server.gui.add_markdown(f"**{notice}**", order=order)

    @property
    def frames_shown(self) -> list[int]:
        """The frames whose point cloud and frustum are in the scene, oldest first."""
        with self._lock:
            return list(self._nodes)

    @property
    def point_count(self) -> int:
        """Points in the scene now."""
        with self._lock:
            return self._points

    # -- frames -------------------------------------------------------------------------------
    def add(self, pred: Any, frame: torch.Tensor | np.ndarray, index: int | None = None) -> None:
        """Queue a finished frame (a :class:`mapstream.session.FramePrediction` and its input
        frame, [3, H, W] in [0, 1] or [H, W, 3] uint8) and return at once. ``index`` names the
        frame (default ``pred.index``); a frame added again replaces its points. When
        ``queue_size`` frames already wait, this one's points are skipped; its camera still
        extends the trajectory."""
        if self._worker is None:
            raise RuntimeError("LiveView.add before start()")
        T, K = pred.T_world_cam.detach().cpu().double().numpy(), pred.K.detach().cpu().double().numpy()
        item = _Frame(int(pred.index if index is None else index), T, K, None, None, None)
        depth = pred.depth.detach().cpu().float().numpy()
        image = _as_image(frame, depth.shape)  # a frame refused here takes no slot of the queue
        with self._count_lock:
            keep_maps = self._queued_maps < self.options.queue_size
            self._queued_maps += keep_maps
        if keep_maps:
            item.depth, item.image = depth, image
            item.depth_conf = pred.depth_conf.detach().cpu().float().numpy()
        else:
            self.skipped += 1
        self._queue.put(item)

    def show_map(self, poses: dict[int, np.ndarray], loops: list[tuple[int, int]]) -> None:
        """Queue the global map's state (`mapstream.globalmap`): its corrected keyframe poses,
        drawn as a green trajectory, and its loop edges, drawn as red segments between the
        keyframes they join; each call replaces the last. Returns at once."""
        if self._worker is None:
            raise RuntimeError("LiveView.show_map before start()")
        self._queue.put(_MapUpdate({int(k): np.asarray(v, np.float64)[:3] for k, v in poses.items()},
                                   [(int(a), int(b)) for a, b in loops]))

    @property
    def map_shown(self) -> tuple[int, int]:
        """(keyframes, loop edges) of the global map drawn now."""
        with self._lock:
            return self._map_shown

    def _draw_map(self, update: _MapUpdate) -> None:
        server = self.server
        if server is None or not update.poses:
            return
        keys = sorted(update.poses)
        centres = np.stack([update.poses[k][:, 3] for k in keys])
        width = 0.004 * float(self._scale or 1.0)
        if len(centres) > 1:
            segments = np.stack([centres[:-1], centres[1:]], axis=1).astype(np.float32)
            self._map_nodes["trajectory"] = server.scene.add_line_segments(
                "/live/map/trajectory", segments, (40, 200, 80), thickness=width)
        joined = [(update.poses[a][:, 3], update.poses[b][:, 3]) for a, b in update.loops
                  if a in update.poses and b in update.poses]
        if joined:
            self._map_nodes["loops"] = server.scene.add_line_segments(
                "/live/map/loops", np.asarray(joined, np.float32), (230, 40, 40), thickness=width)
        self._map_shown = (len(keys), len(joined))
        self._gui["status"].content += f"; global map: {len(keys)} keyframes, {len(joined)} loops closed"

    def _draw_loop(self) -> None:
        while (item := self._queue.get()) is not None and not self._abandon.is_set():
            if isinstance(item, _MapUpdate):
                try:
                    with self._lock:
                        self._draw_map(item)
                except Exception:
                    logger.exception("live view: the global map could not be drawn")
                continue
            try:
                with self._lock:
                    self._draw(item)
            except Exception:  # a view must never take the run down with it
                logger.exception("live view: frame %d could not be drawn", item.index)
            finally:
                if item.depth is not None:
                    with self._count_lock:
                        self._queued_maps -= 1

    def _draw(self, item: _Frame) -> None:
        server, opts = self.server, self.options
        if server is None:
            return
        if self._scale is None:
            self._scale, self._pixel = self._frame_scale(item)  # None until a frame has valid depth
        scale = self._scale or 1.0
        name = f"frame_{item.index:06d}"
        if item.depth is not None:
            xyz, rgb = frame_points(
                item.depth, item.depth_conf, item.K, item.T_world_cam, item.image,
                conf_threshold=opts.conf_threshold, max_points=opts.points_per_frame, seed=item.index,
            )
            self._remove(item.index)  # a frame given again (a provisional scale frame) is replaced
            h, w = item.depth.shape
            fy = float(item.K[1, 1])
            cloud = server.scene.add_point_cloud(
                f"/live/points/{name}", xyz, rgb, point_size=self._point_size(), precision="float32",
                point_shading="flat",
            )
            frustum = server.scene.add_camera_frustum(
                f"/live/cameras/{name}", fov=2 * math.atan2(h / 2, fy), aspect=w / h, scale=0.05 * scale,
                thickness=0.002 * scale, color=(255, 140, 0), wxyz=rotation_to_wxyz(item.T_world_cam[:, :3]),
                position=item.T_world_cam[:, 3],
                image=downscale_image(item.image, opts.thumbnail_size) if opts.thumbnail_size else None,
            )
            self._nodes[item.index] = (cloud, frustum)
            self._points += len(xyz)
            while len(self._nodes) > opts.max_frames:
                self._remove(next(iter(self._nodes)))
        self._place_camera(item.index, item.T_world_cam[:, 3])
        if self._gui["follow"].value:
            move_cameras(server, *follow_viewpoint(item.T_world_cam, 0.5 * scale))
        elapsed = max(time.perf_counter() - self._started_at, 1e-9)
        frames = len(self._positions)  # one a frame: a frame given again moves its own
        self._gui["status"].content = (
            f"**{frames} frames** ({frames / elapsed:.1f}/s), {self._points:,} points shown"
            + (f", points of {self.skipped} frames skipped to keep up" if self.skipped else "")
        )

    def _frame_scale(self, item: _Frame) -> tuple[float | None, float | None]:
        """(the scene's scale: the frame's median valid depth, a pixel's width at that depth),
        (None, None) when the frame has no valid depth (a later frame sets it). The first frame
        drawn also sets the world's up: minus its camera's y axis."""
        assert self.server is not None
        if not self._slots:
            self.server.scene.set_up_direction(tuple(-item.T_world_cam[:, 1]))
        depth = item.depth[np.isfinite(item.depth) & (item.depth > 0)] if item.depth is not None else np.empty(0)
        if not len(depth):
            return None, None
        scale = float(np.median(depth))
        return scale, scale / float(item.K[0, 0])

    def _point_size(self) -> float:
        """Two pixels' width at the first frame's median depth, times the slider."""
        return 2.0 * float(self._pixel or 1e-3) * float(self._gui["point_size"].value)

    def _set_point_size(self) -> None:
        with self._lock:
            for cloud, _ in self._nodes.values():
                cloud.point_size = self._point_size()

    def _remove(self, index: int) -> None:
        nodes = self._nodes.pop(index, None)
        if nodes is not None:
            cloud, frustum = nodes
            self._points -= len(cloud.points)
            cloud.remove()
            frustum.remove()

    def _place_camera(self, index: int, position: np.ndarray) -> None:
        """Put frame ``index``'s camera centre on the trajectory: a new frame adds a segment
        (only the newest chunk node is sent again); a frame given again moves its point (and
        the chunks of its two segments are sent again)."""
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = len(self._positions)
            self._positions.append(np.asarray(position, np.float64))
            if len(self._slots) > self.options.max_frames:  # only recent frames come again
                self._slots.popitem(last=False)
        else:
            self._positions[slot] = np.asarray(position, np.float64)
        # Position p ends segment p - 1 and starts segment p (when there is one).
        for chunk in sorted({max(slot - 1, 0) // TRAJECTORY_CHUNK, slot // TRAJECTORY_CHUNK}):
            self._send_chunk(chunk)

    def _send_chunk(self, chunk: int) -> None:
        assert self.server is not None
        start = chunk * TRAJECTORY_CHUNK
        points = np.stack(self._positions[start : start + TRAJECTORY_CHUNK + 1])
        if len(points) < 2:
            return
        segments = np.stack([points[:-1], points[1:]], axis=1).astype(np.float32)
        node = self.server.scene.add_line_segments(
            f"/live/trajectory/chunk_{chunk:05d}", segments, (255, 140, 0), thickness=0.003 * float(self._scale or 1.0),
        )
        if chunk < len(self._chunks):
            self._chunks[chunk] = node
        else:
            self._chunks.append(node)
