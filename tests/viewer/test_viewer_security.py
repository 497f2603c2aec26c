"""The viewer talks only to its own page and writes only where it was told: a websocket from a
foreign page is refused at the handshake (on a real loopback server), and a path typed into
the page outside the run's folder (or a folder named with --export-dir) writes nothing."""
from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from viewer_fakes import RenderingClient
from viewer_synthetic import make_recon

from mapstream.cli.main import main as cli_main
from mapstream.pipeline.own_files import run_own_files
from mapstream.viewer.export_folders import ExportFolders, OutsideExportFolders, RunOwnFile
from mapstream.viewer.origin_guard import OriginPolicy, check_origin_url

viser = pytest.importorskip("viser")
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from mapstream.viewer import ViewerApp  # noqa: E402


def handshake(port: int, origin: str | None) -> int:
    """The HTTP status of a websocket handshake with viser's client protocol and ``origin``."""
    try:
        with connect(
            f"ws://127.0.0.1:{port}", origin=origin, subprotocols=[f"viser-v{viser.__version__}"],  # type: ignore[list-item]
            proxy=None, open_timeout=10,
        ):
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


# -- the websocket's Origin -------------------------------------------------------------------
def test_a_foreign_page_cannot_open_the_websocket(free_port: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), ViewerApp(make_recon(), port=free_port) as app:
        port = app.port
        assert handshake(port, "http://evil.example") == 403
        assert handshake(port, f"http://evil.example:{port}") == 403  # a rebound name on our port
        assert handshake(port, "null") == 403  # a sandboxed page or a local file
        assert handshake(port, f"http://localhost:{port + 1}") == 403  # another local server's page
        for own in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"):
            assert handshake(port, own) == 101, own
        assert handshake(port, None) == 101  # a program, not a page: it could send any Origin
        assert app.server is not None and not app.server.get_clients()  # no refused page became a client
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len([r for r in refusals if "http://evil.example " in r + " "]) == 1  # once per origin
    null = [r for r in refusals if "origin null" in r]  # no flag lets a file's page in: none is advised
    assert len(null) == 1 and "--allow-origin" not in null[0] and "open the viewer at its own address" in null[0]
    assert all(f"--allow-origin {r.split('page of ')[1].split(',')[0]}" in r for r in refusals if r not in null)


def test_allowed_origins_and_the_listen_host_are_let_in(free_port: int) -> None:
    tunnel = "http://localhost:9000"
    with ViewerApp(make_recon(), port=free_port, allowed_origins=[tunnel + "/"]) as app:
        assert handshake(app.port, tunnel) == 101
        assert handshake(app.port, "http://localhost:9001") == 403
    with pytest.raises(ValueError, match="not a page's origin; give it as http://HOST:PORT"):
        ViewerApp(make_recon(), port=free_port, allowed_origins=["localhost:9000"]).start()


def test_guarding_closes_a_foreign_page_that_came_in_while_the_server_started(free_port: int) -> None:
    from websockets.exceptions import ConnectionClosed

    from mapstream.viewer.origin_guard import guard_origins

    server = viser.ViserServer(host="127.0.0.1", port=free_port, verbose=False)  # not guarded yet
    try:
        port = server.get_port()
        protocol = [f"viser-v{viser.__version__}"]
        with connect(f"ws://127.0.0.1:{port}", origin="http://evil.example", subprotocols=protocol,  # type: ignore[arg-type]
                     proxy=None) as foreign, connect(f"ws://127.0.0.1:{port}", origin=f"http://127.0.0.1:{port}",
                                                     subprotocols=protocol, proxy=None) as own:  # type: ignore[arg-type]
            guard_origins(server, OriginPolicy("127.0.0.1"))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    foreign.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            own.recv(timeout=10)  # still served
        assert handshake(port, "http://evil.example") == 403
    finally:
        server.stop()


def test_a_viewer_that_cannot_be_guarded_does_not_serve(free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    monkeypatch.setattr(gc, "get_objects", lambda: [])  # as if viser served without websockets' Server
    app = ViewerApp(make_recon(), port=free_port)
    with pytest.raises(RuntimeError, match="cannot check which web pages connect to the viewer"):
        app.start()
    assert app.server is None
    with pytest.raises(OSError):  # the server it started is gone: nothing listens there
        socket.create_connection(("127.0.0.1", free_port), timeout=2).close()


def test_origin_policy() -> None:
    policy = OriginPolicy("192.168.7.5")
    assert policy.allows("http://192.168.7.5:8080", "192.168.7.5", 8080)  # the --host the user gave
    assert policy.allows("https://127.0.0.2:8080", "192.168.7.5", 8080)  # loopback, any of 127/8
    assert not policy.allows("http://192.168.7.5:8081", "192.168.7.5", 8080)  # another port: another server
    assert not policy.allows("http://192.168.7.6:8080", "192.168.7.5", 8080)
    assert not policy.allows("file://", "192.168.7.5", 8080)
    wildcard = OriginPolicy("0.0.0.0")
    assert wildcard.allows("http://10.0.0.3:80", "::ffff:10.0.0.3", 80)  # the address it arrived on
    assert not wildcard.allows("http://10.0.0.4", "10.0.0.3", 80)
    assert check_origin_url("HTTP://LocalHost:9000/") == "http://localhost:9000"
    for bad in ("localhost:9000", "ftp://x", "http://x:port", "http://x/page", "null"):
        with pytest.raises(ValueError):
            check_origin_url(bad)


# -- paths typed into the page ----------------------------------------------------------------
@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(run folder, a folder outside it holding a victim file, a further export folder)."""
    run, outside, extra = tmp_path / "run", tmp_path / "outside", tmp_path / "extra"
    for folder in (run, outside, extra):
        folder.mkdir()
    (outside / "victim.glb").write_text("the user's file")
    (run / "link.glb").symlink_to(outside / "victim.glb")
    (run / "linked_dir").symlink_to(outside)
    return run, outside, extra


def escapes(run: Path, outside: Path) -> list[str]:
    return [
        f"{run}/../outside/victim.glb",  # climbs out
        f"/tmp/x/../..{outside}/victim.glb",
        str(outside / "victim.glb"),  # an absolute path elsewhere
        "../outside/victim.glb",  # relative to the run folder
        "link.glb",  # a link in the folder to a file outside
        "linked_dir/victim.glb",  # through a linked folder
        "~/mapstream-viewer-test-never-written.glb",
        str(run),  # the folder itself
    ]


def snapshot(*roots: Path) -> dict[str, bytes | str]:
    files: dict[str, bytes | str] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                files[str(path)] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return files


def assert_every_field_refuses(app: ViewerApp, typed: list[str], says: str) -> None:
    """Each path of ``typed``, in each of the page's path fields, is refused with ``says`` in
    the status line, and nothing is written."""
    handles = app.handles
    assert handles is not None
    for path in typed:
        for field, act, what in (
            (handles.glb_path, app.export_glb, "export GLB"),
            (handles.png_path, app.screenshot, "screenshot"),
            (handles.video_path, app.record_video, "record video"),
        ):
            field.value = path
            assert act() is None, (what, path)
            assert f"{what}: `" in handles.status.content and says in handles.status.content
            assert "nothing was written" in handles.status.content


def test_export_folders_place_only_inside(folders: tuple[Path, Path, Path]) -> None:
    run, outside, extra = folders
    places = ExportFolders([run, extra])
    for typed in escapes(run, outside):
        with pytest.raises(OutsideExportFolders, match=f"outside the folders this viewer writes to \\({run}, {extra}\\)"):
            places.place(typed)
    assert places.place("sub/a.glb") == run / "sub" / "a.glb"
    assert places.place(f"  {extra}/b.glb ") == extra / "b.glb"
    assert places.place(f"{run}/sub/../c.glb") == run / "c.glb"
    with pytest.raises(ValueError, match="is a file, not a folder"):
        ExportFolders([outside / "victim.glb"])


def test_the_page_cannot_write_outside_the_run_folder(
    folders: tuple[Path, Path, Path], free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, outside, extra = folders
    before = snapshot(run, outside, extra)
    with ViewerApp(make_recon(), port=free_port, output_dir=run) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        client = RenderingClient(np.zeros((4, 6, 4), np.uint8))
        monkeypatch.setattr(app.server, "get_clients", lambda: {0: client})
        assert_every_field_refuses(app, [*escapes(run, outside), str(extra / "x.glb")], "outside the folders")
        assert client.calls == []  # not even a render was asked for
        assert snapshot(run, outside, extra) == before
        assert not (Path.home() / "mapstream-viewer-test-never-written.glb").exists()

        # Inside the run folder (relative paths start there): written.
        handles.glb_path.value = "mine/view.glb"
        assert app.export_glb() == run / "mine" / "view.glb" and (run / "mine" / "view.glb").stat().st_size > 0
        # The video's input-frames twin goes beside it: a link there that leads out refuses it too.
        (run / "clip_original.mp4").symlink_to(outside / "victim.glb")
        handles.video_path.value, handles.video_originals.value = "clip.mp4", True
        assert app.record_video() is None and "clip_original.mp4` is outside" in handles.status.content
    assert (outside / "victim.glb").read_text() == "the user's file"


def a_run_with_its_input(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """(run folder, a further export folder holding photos, the paths typed) for a run folder
    whose run.json names an input folder of photos inside the run folder, and a glob of the
    further folder's photos as another run's input would: the run's outputs and inputs."""
    run, extra = tmp_path / "run", tmp_path / "extra"
    (run / "photos").mkdir(parents=True)
    (run / "images").mkdir()
    extra.mkdir()
    for name in ("predictions.npz", "scene.glb", "points.ply", "summary.png", "run.json", "trajectory_tum.txt"):
        (run / name).write_bytes(b"output " + name.encode())
    (run / "images" / "000000.png").write_bytes(b"a preprocessed frame")
    (run / "photos" / "000000.png").write_bytes(b"a photo")
    (run / "run.json").write_text(json.dumps({"config": {"input": str(run / "photos")}}))
    typed = ["predictions.npz", "scene.glb", "points.ply", "summary.png", "run.json", "trajectory_tum.txt",
             "images/000000.png", "images/new.png", "depth/000000.png", ".frames/x", "photos/000000.png",
             str(run / "photos" / "000000.png")]
    return run, extra, typed


def test_export_folders_refuse_the_runs_own_files(tmp_path: Path) -> None:
    run, extra, typed = a_run_with_its_input(tmp_path)
    places = ExportFolders([run, extra], run_own_files(run).owns)
    for path in typed:
        with pytest.raises(RunOwnFile, match="one of the run's own inputs or outputs.*type a new file name"):
            places.place(path)
    assert places.place("view.glb") == run / "view.glb"
    assert places.place("photos/new.glb") == run / "photos" / "new.glb"  # not a file the run read
    (run / "photos_link").symlink_to(run / "photos")
    with pytest.raises(RunOwnFile):
        places.place("photos_link/000000.png")  # links followed


def test_the_page_never_writes_over_the_runs_inputs_and_outputs(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, extra, typed = a_run_with_its_input(tmp_path)
    before = snapshot(run, extra)
    with ViewerApp(make_recon(), port=free_port, output_dir=run, export_dirs=[extra]) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        client = RenderingClient(np.zeros((4, 6, 4), np.uint8))
        monkeypatch.setattr(app.server, "get_clients", lambda: {0: client})
        assert_every_field_refuses(app, typed, "the run's own inputs or outputs")
        assert client.calls == []
        assert snapshot(run, extra) == before
        handles.glb_path.value = "view.glb"
        assert app.export_glb() == run / "view.glb" and (run / "view.glb").stat().st_size > 0


def test_a_folder_named_with_export_dirs_is_written(
    folders: tuple[Path, Path, Path], free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, outside, extra = folders
    with ViewerApp(make_recon(), port=free_port, output_dir=run, export_dirs=[extra]) as app:
        assert app.handles is not None and app.server is not None
        client = RenderingClient(np.zeros((4, 6, 4), np.uint8))
        monkeypatch.setattr(app.server, "get_clients", lambda: {0: client})
        app.handles.png_path.value = str(extra / "shot.png")
        thread = app.screenshot()
        assert thread is not None
        thread.join(timeout=30)
        assert (extra / "shot.png").is_file()
        app.handles.glb_path.value = str(outside / "victim.glb")
        assert app.export_glb() is None
        assert f"outside the folders this viewer writes to ({run}, {extra})" in app.handles.status.content
    assert (outside / "victim.glb").read_text() == "the user's file"


def test_paths_from_code_are_the_callers(tmp_path: Path, free_port: int) -> None:
    """A program calling the methods chooses its own paths: only the page's fields are bounded."""
    with ViewerApp(make_recon(), port=free_port, output_dir=tmp_path / "run") as app:
        assert app.export_glb(tmp_path / "elsewhere" / "v.glb") == tmp_path / "elsewhere" / "v.glb"
    assert (tmp_path / "elsewhere" / "v.glb").is_file()


def test_cli_view_passes_export_dirs_and_origins(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_recon().save_npz(tmp_path / "predictions.npz")
    seen: list[tuple[object, ...]] = []
    start = ViewerApp.start

    def recording_start(self: ViewerApp) -> ViewerApp:
        seen.append((self.export_folders.folders, self.allowed_origins))
        return start(self)

    monkeypatch.setattr(ViewerApp, "start", recording_start)
    args = ["view", str(tmp_path), "--no-block", "--port", str(free_port)]
    assert cli_main([*args, "--export-dir", str(tmp_path / "a"), "--allow-origin", "http://localhost:9000"]) == 0
    assert seen == [((tmp_path, tmp_path / "a"), ("http://localhost:9000",))]
    assert cli_main([*args, "--allow-origin", "localhost:9000"]) == 2
    assert "give it as http://HOST:PORT" in capsys.readouterr().err
