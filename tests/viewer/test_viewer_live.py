"""The live view (`mapstream run --view`): the frames' points, cameras and trajectory arrive
while a run streams, in bounded memory, and the run never waits for the view."""
from __future__ import annotations

import math
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mapstream.viewer.live import LiveOptions, follow_viewpoint, frame_points

H, W = 6, 8
K = np.array([[4.0, 0, 4.0], [0, 4.0, 3.0], [0, 0, 1]])


def test_frame_points_unprojects_the_confident_finite_pixels_in_raster_order() -> None:
    depth = np.full((2, 3), 2.0)
    depth[0, 1] = np.nan  # never a point
    depth[1, 2] = -1.0  # behind the camera: never a point
    conf = np.array([[3.0, 3.0, 1.5], [3.0, 3.0, 3.0]])  # (0, 2) sits at the threshold: strictly above only
    T = np.hstack([np.eye(3), [[10.0], [0.0], [0.0]]])  # the camera 10 along world x
    K2 = np.array([[2.0, 0, 1.0], [0, 2.0, 1.0], [0, 0, 1]])
    image = np.arange(18, dtype=np.uint8).reshape(2, 3, 3)
    xyz, rgb = frame_points(depth, conf, K2, T, image, conf_threshold=1.5, max_points=10, seed=0)
    # pixels (0, 0), (1, 0), (1, 1): x = (u - 1) d / 2 + 10, y = (v - 1) d / 2, z = d
    np.testing.assert_allclose(xyz, [[9.0, -1.0, 2.0], [9.0, 0.0, 2.0], [10.0, 0.0, 2.0]])
    np.testing.assert_array_equal(rgb, image.reshape(-1, 3)[[0, 3, 4]])
    assert xyz.dtype == np.float32 and rgb.dtype == np.uint8


def test_frame_points_subsamples_reproducibly_and_keeps_raster_order() -> None:
    depth, conf = np.ones((20, 30)), np.full((20, 30), 2.0)
    image = np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    T = np.hstack([np.eye(3), np.zeros((3, 1))])
    a = frame_points(depth, conf, K, T, image, conf_threshold=1.0, max_points=50, seed=7)
    b = frame_points(depth, conf, K, T, image, conf_threshold=1.0, max_points=50, seed=7)
    c = frame_points(depth, conf, K, T, image, conf_threshold=1.0, max_points=50, seed=8)
    assert len(a[0]) == 50
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])
    # raster order: rows (y), then columns (x), non-decreasing
    order = a[0][:, 1] * 1000 + a[0][:, 0]
    assert np.all(np.diff(order) > 0)


def test_follow_viewpoint_is_behind_and_above_the_camera_looking_ahead() -> None:
    eye, target, up = follow_viewpoint(np.hstack([np.eye(3), [[1.0], [2.0], [3.0]]]), 3.0)
    np.testing.assert_allclose(eye, [1.0, 2.0 - 1.0, 0.0])  # 3 behind (-z), 1 above (-y)
    np.testing.assert_allclose(target, [1.0, 2.0, 6.0])
    np.testing.assert_allclose(up, [0.0, -1.0, 0.0])


def test_live_options_refuse_what_cannot_work() -> None:
    for bad, message in [({"points_per_frame": 0}, "points_per_frame"), ({"max_frames": 0}, "max_frames"),
                         ({"queue_size": 0}, "queue_size"), ({"thumbnail_size": -1}, "thumbnail_size"),
                         ({"conf_threshold": math.nan}, "NaN")]:
        with pytest.raises(ValueError, match=message):
            LiveOptions(**bad)


# -- the server ----------------------------------------------------------------------------------
viser = pytest.importorskip("viser")

from mapstream.viewer import live  # noqa: E402
from mapstream.viewer.live import LiveView  # noqa: E402


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def prediction(i: int, conf: float = 3.0) -> SimpleNamespace:
    """A FramePrediction's fields for a camera at x = i looking down +z at a plane 2 away."""
    T = torch.tensor(np.hstack([np.eye(3), [[float(i)], [0.0], [0.0]]]), dtype=torch.float32)
    return SimpleNamespace(
        index=i, T_world_cam=T, K=torch.tensor(K, dtype=torch.float32), depth=torch.full((H, W), 2.0),
        depth_conf=torch.full((H, W), conf),
    )


def frame() -> torch.Tensor:
    return torch.rand(3, H, W)


def test_frames_arrive_with_points_cameras_and_trajectory(free_port: int, monkeypatch) -> None:
    monkeypatch.setattr(live, "TRAJECTORY_CHUNK", 4)
    view = LiveView(LiveOptions(points_per_frame=30), port=free_port)
    with pytest.raises(RuntimeError, match="before start"):
        view.add(prediction(0), frame())
    with view:
        assert view.url == f"http://127.0.0.1:{free_port}"
        for i in range(10):
            view.add(prediction(i, conf=3.0 if i != 3 else 1.0), frame())  # frame 3: no confident pixel
        again = prediction(5)
        again.T_world_cam[0, 3] = 50.0
        view.add(again, frame())  # given again (a provisional frame): replaced, not doubled
        view.stop()  # draws what is queued first
        assert view.frames_shown == [0, 1, 2, 3, 4, 6, 7, 8, 9, 5]
        assert view.point_count == 9 * 30  # 48 pixels each, 30 kept; frame 3 none
        assert len(view._positions) == 10 and len(view._chunks) == 3  # 9 segments in chunks of 4; frame 5 moved in place
        np.testing.assert_allclose(view._chunks[0].points[:, 0, 0], [0, 1, 2, 3])  # segment starts along x
        np.testing.assert_allclose(view._chunks[1].points[:, :, 0], [[4, 50], [50, 6], [6, 7], [7, 8]])  # 5 moved
    assert view.server is None


def test_only_the_newest_frames_stay_and_memory_is_bounded(free_port: int) -> None:
    with LiveView(LiveOptions(max_frames=3, points_per_frame=10), port=free_port) as view:
        for i in range(8):
            view.add(prediction(i), frame())
        view.stop()
        assert view.frames_shown == [5, 6, 7]
        assert view.point_count == 30
        assert len(view._positions) == 8  # the trajectory is kept whole


def test_a_view_that_falls_behind_skips_points_and_never_blocks_the_run(free_port: int, monkeypatch) -> None:
    release = threading.Event()
    draw = LiveView._draw

    def slow_draw(self, item):
        release.wait(10)
        draw(self, item)

    monkeypatch.setattr(LiveView, "_draw", slow_draw)
    with LiveView(LiveOptions(queue_size=2, points_per_frame=5), port=free_port) as view:
        for i in range(5):  # the worker holds frame 0; frame 1 waits; frames 2-4 come as cameras only
            view.add(prediction(i), frame())
        assert view.skipped == 3
        release.set()
        view.stop()
        assert view.frames_shown == [0, 1]
        assert len(view._positions) == 5


def test_a_frame_that_cannot_be_drawn_does_not_stop_the_view(free_port: int, monkeypatch, caplog) -> None:
    real = live.frame_points

    def failing(*args, seed, **kwargs):
        if seed == 1:
            raise RuntimeError("broken frame")
        return real(*args, seed=seed, **kwargs)

    monkeypatch.setattr(live, "frame_points", failing)
    with LiveView(port=free_port) as view:
        for i in range(3):
            view.add(prediction(i), frame())
        view.stop()
        assert view.frames_shown == [0, 2]
    assert "frame 1 could not be drawn" in caplog.text


def test_a_frame_image_of_another_size_is_refused(free_port: int) -> None:
    with LiveView(port=free_port) as view, pytest.raises(ValueError, match=r"\[3, 6, 8\] or \[6, 8, 3\]"):
        view.add(prediction(0), torch.rand(3, 5, 8))


def test_mapstream_run_view_serves_while_the_run_streams(tmp_path, free_port: int, capsys, monkeypatch) -> None:
    from mapstream.cli.main import main

    shown = []
    add = LiveView.add

    def recording_add(self, pred, image, index=None):
        shown.append(index)
        add(self, pred, image, index)

    monkeypatch.setattr(LiveView, "add", recording_add)
    out = tmp_path / "run"
    assert main(["run", "--demo", "--out", str(out), "--quiet", "--formats", "npz", "--view", "--no-keep-view",
                 "--view-port", str(free_port)]) == 0
    printed = capsys.readouterr().out
    assert f"live view at http://127.0.0.1:{free_port}" in printed
    frames = int(re.search(r"^(\d+) frames? ", printed, re.MULTILINE).group(1))  # the summary line
    assert sorted(set(shown)) == list(range(frames))  # every frame went to the view


def test_stopping_without_drain_leaves_the_backlog_undrawn(free_port: int, monkeypatch) -> None:
    entered, release = threading.Event(), threading.Event()
    draw = LiveView._draw

    def slow_draw(self, item):
        entered.set()
        release.wait(10)
        draw(self, item)

    monkeypatch.setattr(LiveView, "_draw", slow_draw)
    view = LiveView(LiveOptions(points_per_frame=5), port=free_port).start()
    for i in range(4):
        view.add(prediction(i), frame())
    assert entered.wait(10)  # the worker is drawing frame 0
    stopper = threading.Thread(target=view.stop, kwargs={"drain": False})
    stopper.start()  # an interrupted run: the frame being drawn ends, the rest is dropped
    assert wait_until(view._abandon.is_set)  # the stop is asked before frame 0 is done
    release.set()
    stopper.join(10)
    assert view.frames_shown == [0] and view.server is None


def test_a_refused_frame_takes_no_place_in_the_queue(free_port: int) -> None:
    with LiveView(LiveOptions(queue_size=2, points_per_frame=5), port=free_port) as view:
        for _ in range(3):
            with pytest.raises(ValueError, match="frame image"):
                view.add(prediction(0), torch.rand(3, 5, 8))
        for i in range(2):
            view.add(prediction(i), frame())
        view.stop()
        assert view.skipped == 0 and view.frames_shown == [0, 1]


def test_the_scale_waits_for_a_frame_with_valid_depth(free_port: int) -> None:
    with LiveView(port=free_port) as view:
        empty = prediction(0)
        empty.depth = torch.full((H, W), float("nan"))
        view.add(empty, frame())
        view.add(prediction(1), frame())  # depth 2 everywhere
        view.stop()
        assert view._scale == 2.0 and view._pixel == 2.0 / K[0, 0]


def test_a_stopped_view_cannot_start_again(free_port: int) -> None:
    view = LiveView(port=free_port).start()
    view.stop()
    with pytest.raises(RuntimeError, match="cannot start again"):
        view.start()


def test_run_calls_the_view_with_each_frame_and_its_index(tmp_path, free_port: int) -> None:
    from mapstream.pipeline import RunOptions, run

    with LiveView(LiveOptions(points_per_frame=5), port=free_port) as view:
        summary = run(RunOptions(input=None, demo=True, out=tmp_path / "run", formats=("npz",)), progress=False, on_frame=view.add)
        view.stop()
        assert view.frames_shown == list(range(summary.frames))


def test_view_options_are_checked_before_any_server_starts(tmp_path, capsys) -> None:
    from mapstream.cli.main import main

    for flags, message in [(["--view-port", "70000"], "--view-port must be in 0..65535"),
                           (["--sliding-window", "0"], "--sliding-window must be >= 1")]:
        assert main(["run", "--demo", "--out", str(tmp_path / "run"), "--quiet", "--view", *flags]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "live view at" not in captured.out


def test_mapstream_run_view_says_the_weights_are_untrained_and_takes_allowed_origins(
    tmp_path, free_port: int, monkeypatch
) -> None:
    """The live view of a run on the tiny preset's weights shows the untrained notice at the top
    of its panel from the start, as `mapstream view` does; --view-allow-origin reaches its
    origin policy."""
    from mapstream.cli.main import main
    from mapstream.viewer import live
    from mapstream.viewer.run_notes import UNTRAINED_NOTE

    seen = {}
    start_server = live.start_server

    def recording_start(host, port, title, allowed_origins=()):
        server = start_server(host, port, title, allowed_origins)
        seen["origins"] = tuple(allowed_origins)
        markdown = server.gui.add_markdown
        seen["markdown"] = []
        server.gui.add_markdown = lambda content, *a, **k: seen["markdown"].append(content) or markdown(content, *a, **k)
        return server

    monkeypatch.setattr(live, "start_server", recording_start)
    assert main(["run", "--model", "tiny", "--demo", "--out", str(tmp_path / "run"), "--quiet", "--formats", "npz",
                 "--view", "--no-keep-view", "--view-port", str(free_port),
                 "--view-allow-origin", "http://localhost:9000"]) == 0
    assert seen["origins"] == ("http://localhost:9000",)
    assert seen["markdown"][0] == f"**{UNTRAINED_NOTE}**"  # first in the panel, before the status line


def test_the_global_map_is_drawn_and_each_update_replaces_the_last(free_port: int) -> None:
    with LiveView(LiveOptions(points_per_frame=5), port=free_port) as view:
        with pytest.raises(RuntimeError, match="before start"):
            LiveView(port=free_port).show_map({}, [])
        view.add(prediction(0), frame())
        poses = {k: np.hstack([np.eye(3), [[k], [0.0], [0.0]]]) for k in (0, 4, 8, 12)}
        view.show_map(poses, [(0, 12), (4, 99)])  # a loop on a keyframe the map no longer holds is left out
        moved = {k: np.hstack([np.eye(3), [[k], [1.0], [0.0]]]) for k in (0, 4, 8, 12, 16)}
        view.show_map(moved, [(0, 12), (4, 16)])
        view.stop()
        assert view.map_shown == (5, 2)
        trajectory, loops = view._map_nodes["trajectory"].points, view._map_nodes["loops"].points
        np.testing.assert_allclose(trajectory[:, :, 0], [[0, 4], [4, 8], [8, 12], [12, 16]])
        np.testing.assert_allclose(trajectory[:, :, 1], 1.0)  # the second update replaced the first
        np.testing.assert_allclose(loops[:, :, 0], [[0, 12], [4, 16]])
