"""The viewer server without a browser: lifecycle and port, controls, run loading, the CLI."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from viewer_synthetic import PLANE_Z, H, N, W, make_recon

from mapstream.cli.main import main as cli_main
from mapstream.viewer import load_run
from mapstream.viewer.scene import PRESET_DISTANCE

pytest.importorskip("viser")

from mapstream.viewer import ViewerApp, ViewerOptions  # noqa: E402


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``127.0.0.1:port`` now (SO_REUSEADDR, as servers do)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_start_serves_http_and_stop_frees_the_port(free_port: int) -> None:
    app = ViewerApp(make_recon(), port=free_port)
    with pytest.raises(RuntimeError, match="not started"):
        app.url
    app.start()
    try:
        assert app.port == free_port and app.url == f"http://127.0.0.1:{free_port}"
        assert not port_is_free(free_port)
        with urllib.request.urlopen(app.url, timeout=10) as response:
            assert response.status == 200
            assert "<html" in response.read().decode("utf-8", "replace").lower()
        with pytest.raises(RuntimeError, match="already started"):
            app.start()
    finally:
        app.stop()
    assert app.server is None and app.handles is None
    assert port_is_free(free_port)
    app.stop()  # idempotent
    with pytest.raises(RuntimeError, match="cannot start again"):  # its scene went with its server
        app.start()
    with ViewerApp(make_recon(), port=free_port) as again:  # the same port can be taken again
        assert again.port == free_port
    assert port_is_free(free_port)


def test_controls_drive_the_shown_points(free_port: int) -> None:
    recon = make_recon()
    with ViewerApp(recon, ViewerOptions(conf_threshold=3.0), port=free_port) as app:
        handles = app.handles
        assert handles is not None and handles.hide_sky is not None
        # A run with a sky mask opens with the sky hidden, as the reference's viewer shows it.
        assert handles.hide_sky.value is True
        assert app.shown_point_count == int(((app.pool.conf > 3.0) & ~app.pool.sky).sum())
        handles.hide_sky.value = False
        assert len(handles.point_clouds) == len(handles.frustums) == N
        assert handles.frame.value == N - 1 and handles.frame_mode.value == "up to t"
        expected = int((app.pool.conf > 3.0).sum())
        assert app.shown_point_count == expected
        assert sum(len(cloud.points) for cloud in handles.point_clouds) == expected
        cloud = handles.point_clouds[1]
        np.testing.assert_array_equal(cloud.colors, app.pool.rgb[(app.pool.frame == 1) & (app.pool.conf > 3.0)])

        handles.frame_mode.value = "only t"
        handles.frame.value = 0
        assert app.shown_point_count == int(((app.pool.conf > 3.0) & (app.pool.frame == 0)).sum())
        assert [c.visible for c in handles.point_clouds] == [True, False, False]
        handles.show_cameras.value = False
        assert not any(f.visible for f in handles.frustums)

        handles.frame_mode.value = "all"
        handles.conf_threshold.value = 1.0
        handles.hide_sky.value = True
        assert app.shown_point_count == int(((app.pool.conf > 1.0) & ~app.pool.sky).sum())
        handles.downsample.value = "4"
        assert app.shown_point_count == int(((app.pool.conf > 1.0) & ~app.pool.sky & (app.pool.rank % 4 == 0)).sum())
        handles.point_size.value = 0.02
        assert all(c.point_size == pytest.approx(0.02) for c in handles.point_clouds)
        app.reset_view()  # no client connected: nothing to move, no error


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="downsample"):
        ViewerApp(make_recon(), ViewerOptions(downsample=3))
    with pytest.raises(ValueError, match="frame_mode"):
        ViewerApp(make_recon(), ViewerOptions(frame_mode="later"))  # type: ignore[arg-type]
    # Each was a slider's error naming none of the options, or (the port) a hang.
    with pytest.raises(ValueError, match="conf_threshold must be a number"):
        ViewerApp(make_recon(), ViewerOptions(conf_threshold=float("nan")))
    for size in (-1.0, 0.0, float("inf")):
        with pytest.raises(ValueError, match="point_size must be > 0"):
            ViewerApp(make_recon(), ViewerOptions(point_size=size))
    for port in (-1, 99999):
        with pytest.raises(ValueError, match="port must be in 0..65535"):
            ViewerApp(make_recon(), port=port)


def test_load_run_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="predictions.npz not found: is .* the --out folder of `mapstream run`"):
        load_run(tmp_path)
    stopped = tmp_path / "stopped"  # a run that kept frames and stopped before its exports
    stopped.mkdir()
    (stopped / "progress.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="stopped before writing its outputs; run the same `mapstream run`"):
        load_run(stopped)
    # A finished run (run.json written last, without a state) that was not asked for npz.
    (stopped / "run.json").write_text(json.dumps({"outputs": {"ply": "p.ply", "tum": "t.txt"}}))
    with pytest.raises(FileNotFoundError, match=r"did not write it \(its outputs: ply, tum\); run it again with npz"):
        load_run(stopped)
    (stopped / "run.json").write_text(json.dumps({"outputs": {"ply": "p.ply"}, "state": "a later run did not finish"}))
    with pytest.raises(FileNotFoundError, match="stopped before writing its outputs"):
        load_run(stopped)
    (tmp_path / "predictions.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_run(tmp_path)
    good = make_recon().save_npz(tmp_path / "good.npz")
    data = good.read_bytes()
    (tmp_path / "predictions.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_run(tmp_path)
    np.savez(tmp_path / "predictions.npz", images=np.zeros((1, 2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match="missing keys"):
        load_run(tmp_path)
    assert len(load_run(good)) == N  # an .npz path works too


def test_cli_view(tmp_path: Path, free_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["view", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["view", str(tmp_path)]) == 2
    assert "predictions.npz not found" in capsys.readouterr().err
    make_recon().save_npz(tmp_path / "predictions.npz")
    assert cli_main(["view", str(tmp_path), "--no-block", "--port", str(free_port), "--conf-threshold", "1.0"]) == 0
    out = capsys.readouterr().out
    assert f"http://127.0.0.1:{free_port}" in out and f"{N} frames" in out
    assert port_is_free(free_port)


def test_import_mapstream_does_not_import_viser() -> None:
    code = "import sys, mapstream, mapstream.viewer, mapstream.cli.main; sys.exit('viser' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_play_advances_the_scrubber_and_single_frame_runs_work(free_port: int) -> None:
    import time

    with ViewerApp(make_recon(), port=free_port) as app:
        assert app.handles is not None
        app.handles.fps.value = 30
        app.handles.play.value = True
        deadline = time.monotonic() + 10
        while app.handles.frame.value == N - 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        app.handles.play.value = False
        assert app.handles.frame.value != N - 1, "play did not move the frame slider"
    with ViewerApp(make_recon(n=1, sky=False), port=free_port) as app:
        assert app.handles is not None and app.handles.hide_sky is None and app.handles.frame.disabled
        assert app.shown_point_count == int((app.pool.conf > 1.5).sum()) > 0


def test_frames_step_and_jump_and_cameras_resize(free_port: int) -> None:
    """"prev" / "next" step the scrubber (wrapping around), a click on a camera shows its
    frame (`show_frame`, clamped), and "camera size" scales every frustum."""
    with ViewerApp(make_recon(), port=free_port) as app:
        handles = app.handles
        assert handles is not None and handles.step is not None and handles.frame.value == N - 1
        app.step_frame(1)
        assert handles.frame.value == 0
        app.step_frame(-1)
        assert handles.frame.value == N - 1
        app.show_frame(1)
        assert handles.frame.value == 1
        assert [c.visible for c in handles.point_clouds] == [True, True] + [False] * (N - 2)
        app.show_frame(99)
        assert handles.frame.value == N - 1
        base = handles.frustums[0].scale
        handles.camera_size.value = 2.5
        assert all(f.scale == pytest.approx(2.5 * base) for f in handles.frustums)


class FakeCamera:
    """A browser's camera: keeps what the server sets, and notes assignments made outside
    ``client.atomic()`` (they would reach the browser as separate, jerky updates)."""

    def __init__(self, client: FakeClient) -> None:
        object.__setattr__(self, "client", client)

    def __setattr__(self, name: str, value: object) -> None:
        if not self.client.in_atomic:
            self.client.outside_atomic.append(name)
        object.__setattr__(self, name, np.asarray(value, np.float64))


class FakeClient:
    def __init__(self) -> None:
        self.in_atomic = False
        self.outside_atomic: list[str] = []
        self.camera = FakeCamera(self)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        self.in_atomic = True
        try:
            yield
        finally:
            self.in_atomic = False


def test_view_buttons_move_every_browser_camera(free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "look from" / "go to" buttons and "reset view" set each client's camera to the
    preset, inside one atomic update. Synthetic scene: forward = +z, up = -y, right = +x."""
    recon = make_recon()
    with ViewerApp(recon, port=free_port) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        clients = {1: FakeClient(), 4: FakeClient()}
        monkeypatch.setattr(app.server, "get_clients", lambda: clients)
        center, d = app.framing.center, PRESET_DISTANCE * app.framing.extent

        def assert_view(position: object, look_at: object, up: object) -> None:
            for client in clients.values():
                np.testing.assert_allclose(client.camera.position, position, atol=1e-6)
                np.testing.assert_allclose(client.camera.look_at, look_at, atol=1e-6)
                np.testing.assert_allclose(client.camera.up_direction, up, atol=1e-6)
                assert client.outside_atomic == []

        handles.look_from.value = "front"
        assert_view(center + [0, 0, -d], center, [0, -1, 0])
        handles.look_from.value = "left"
        assert_view(center + [-d, 0, 0], center, [0, -1, 0])
        handles.look_from.value = "top"
        assert_view(center + [0, -d, 0], center, [0, 0, 1])
        handles.frame.value = 1
        handles.go_to.value = "current camera"
        assert_view([0.1, 0, 0], [0.1, 0, PLANE_Z], [0, -1, 0])
        handles.go_to.value = "first camera"
        assert_view([0, 0, 0], [0, 0, PLANE_Z], [0, -1, 0])
        handles.reset_view.value = True  # a click
        assert_view(app.framing.camera_position, center, app.framing.up)
        handles.look_from.value = "back"
        handles.go_to.value = "overview"
        assert_view(app.framing.camera_position, center, app.framing.up)


def test_a_chosen_view_is_reached_in_a_smooth_glide(free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser whose camera the server knows glides to the view in `view_steps` atomic
    updates, eased in and out, ending exactly on it; one whose camera is not known yet (viser
    asserts on reading it) jumps; view_steps=1 jumps."""
    from mapstream.viewer.scene import glide, view_preset

    recon = make_recon()
    with ViewerApp(recon, ViewerOptions(view_steps=5), port=free_port) as app:
        assert app.server is not None
        known, fresh = FakeClient(), FakeClient()
        start = (np.array([0.0, 0.0, -5.0]), np.zeros(3), np.array([0.0, -1.0, 0.0]))
        known.camera.position, known.camera.look_at, known.camera.up_direction = start
        known.outside_atomic.clear()  # the browser's own camera, not the server's doing

        class Unknown:
            """viser before the browser's first camera message: reading asserts."""

            def __getattr__(self, name: str) -> object:
                raise AssertionError("no camera update yet")

        object.__setattr__(fresh.camera, "__class__", type("Fresh", (Unknown, FakeCamera), {}))
        seen: list[np.ndarray] = []
        original = FakeCamera.__setattr__

        def noting(self, name: str, value: object) -> None:
            original(self, name, value)
            if self.client is known and name == "position":
                seen.append(np.asarray(value, np.float64))

        monkeypatch.setattr(FakeCamera, "__setattr__", noting)
        monkeypatch.setattr(app.server, "get_clients", lambda: {1: known, 2: fresh})
        app.apply_view("top")
        want = view_preset(recon, app.framing, "top")
        assert len(seen) == 5
        np.testing.assert_allclose(seen, [p for p, _, _ in glide(start, want, 5)])
        np.testing.assert_allclose(seen[-1], want[0])
        steps = np.linalg.norm(np.diff(np.stack([start[0], *seen]), axis=0), axis=1)
        assert steps[2] > steps[0] and steps[2] > steps[-1]  # eased in and out
        for client in (known, fresh):
            np.testing.assert_allclose(client.camera.position, want[0])
            np.testing.assert_allclose(client.camera.look_at, want[1])
            assert client.outside_atomic == []
    with pytest.raises(ValueError, match="view_steps must be >= 1"):
        ViewerOptions(view_steps=0).validate()


def test_look_at_centre_turns_each_camera_where_it_stands(free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """"look at centre" keeps each browser's camera position and points it at the scene centre;
    a browser whose camera is not known yet is left alone."""
    from mapstream.viewer.controls import LOOK_AT_CENTRE

    with ViewerApp(make_recon(), ViewerOptions(view_steps=3), port=free_port) as app:
        assert app.server is not None and app.handles is not None
        a, b, fresh = FakeClient(), FakeClient(), FakeClient()
        for client, eye in ((a, [1.0, 2.0, -3.0]), (b, [-4.0, 0.5, 2.0])):
            client.camera.position, client.camera.look_at = np.array(eye), np.array(eye) + [0.0, 0.0, 1.0]
            client.camera.up_direction = np.array([0.0, -1.0, 0.0])
            client.outside_atomic.clear()
        monkeypatch.setattr(app.server, "get_clients", lambda: {1: a, 2: b, 3: fresh})
        app.handles.go_to.value = LOOK_AT_CENTRE
        for client, eye in ((a, [1.0, 2.0, -3.0]), (b, [-4.0, 0.5, 2.0])):
            np.testing.assert_allclose(client.camera.position, eye)
            np.testing.assert_allclose(client.camera.look_at, app.framing.center)
            np.testing.assert_allclose(client.camera.up_direction, app.framing.up)
            assert client.outside_atomic == []
        assert not hasattr(fresh.camera, "position")


def test_glide_ends_on_the_view_and_keeps_up_a_unit_vector() -> None:
    from mapstream.viewer.scene import glide

    start = (np.zeros(3), np.array([0.0, 0.0, 1.0]), np.array([0.0, -1.0, 0.0]))
    end = (np.array([2.0, 0.0, 0.0]), np.array([2.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0]))  # up turned over
    path = glide(start, end, 4)
    assert len(path) == 4 and all(np.allclose(a, b) for a, b in zip(path[-1], end))
    np.testing.assert_allclose([p[0][0] for p in path], [2 * w for w in (0.15625, 0.5, 0.84375, 1.0)])
    assert all(np.isclose(np.linalg.norm(up), 1.0) for _, _, up in path)
    assert len(glide(start, end, 1)) == 1


def test_frame_image_panel_shows_frame_t_downscaled(free_port: int) -> None:
    recon = make_recon()
    recon.images[:, 0, 0] = np.arange(N)[:, None]  # tell the frames apart
    # 42 x 28 pixels, at most 21 on a side: every second pixel.
    with ViewerApp(recon, ViewerOptions(frame_image_size=21), port=free_port) as app:
        handles = app.handles
        assert handles is not None and handles.show_frame_image.value is True
        assert handles.frame_image.image.shape == (H // 2, W // 2, 3)
        np.testing.assert_array_equal(handles.frame_image.image, recon.images[N - 1, ::2, ::2])
        handles.frame.value = 0
        np.testing.assert_array_equal(handles.frame_image.image, recon.images[0, ::2, ::2])
        handles.show_frame_image.value = False
        assert handles.frame_image.visible is False
        handles.frame.value = 1
        handles.show_frame_image.value = True
        assert handles.frame_image.visible is True
        np.testing.assert_array_equal(handles.frame_image.image, recon.images[1, ::2, ::2])
    with ViewerApp(recon, ViewerOptions(show_frame_image=False), port=free_port) as app:
        assert app.handles is not None and app.handles.frame_image.visible is False
        np.testing.assert_array_equal(app.handles.frame_image.image, recon.images[N - 1])  # fits in 320 px
    with pytest.raises(ValueError, match="frame_image_size"):
        ViewerApp(recon, ViewerOptions(frame_image_size=0))


def test_camera_subsampling_shows_every_kth_frustum_and_frame_t(free_port: int) -> None:
    with ViewerApp(make_recon(n=7), port=free_port) as app:
        handles = app.handles
        assert handles is not None and handles.camera_every.value == 1

        def shown() -> list[int]:
            return [i for i, frustum in enumerate(handles.frustums) if frustum.visible]

        handles.frame.value = 4  # "up to t"
        assert shown() == [0, 1, 2, 3, 4]
        points = app.shown_point_count
        handles.camera_every.value = 3
        assert shown() == [0, 3, 4]
        assert app.shown_point_count == points  # points are not subsampled
        assert all(cloud.visible for cloud in handles.point_clouds[:5])
        handles.frame.value = 5
        assert shown() == [0, 3, 5]
        handles.frame_mode.value = "all"
        assert shown() == [0, 3, 5, 6]
        handles.frame_mode.value = "only t"
        assert shown() == [5]
        handles.show_cameras.value = False
        assert shown() == []
        handles.show_cameras.value = True
        handles.frame_mode.value = "all"
        handles.camera_every.value = 1
        assert shown() == list(range(7))


def test_host_not_on_this_machine_fails_fast(
    tmp_path: Path, free_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """viser, asked to listen on an address this machine does not have, waited forever; the
    viewer now checks the address first. 192.0.2.1 is TEST-NET-1 (RFC 5737): never assigned."""
    make_recon().save_npz(tmp_path / "predictions.npz")
    result: dict[str, object] = {}

    def run(target: Callable[[], object]) -> None:
        def call() -> None:
            try:
                result["value"] = target()
            except Exception as err:  # noqa: BLE001 - handed to the test thread
                result["error"] = err

        result.clear()
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "still waiting for the server after 60 s"

    run(lambda: cli_main(["view", str(tmp_path), "--host", "192.0.2.1", "--port", str(free_port), "--no-block"]))
    assert result == {"value": 2}
    err = capsys.readouterr().err
    assert "error: cannot listen on 192.0.2.1: address not available on this machine" in err
    run(lambda: ViewerApp(make_recon(), host="no-such-host.invalid", port=free_port).start())
    assert isinstance(result["error"], OSError) and "cannot listen on no-such-host.invalid" in str(result["error"])
    with ViewerApp(make_recon(), host="localhost", port=free_port) as app:  # a name that resolves here works
        assert app.port == free_port
