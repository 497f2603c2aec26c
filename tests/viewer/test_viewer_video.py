"""The viewer's "Video" folder: `record_video` with a fake browser whose render shows which
frame was on the page, and the "record video" button driving it through a running viewer."""
from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from viewer_fakes import RenderingClient, wait_for
from viewer_synthetic import make_recon

from mapstream.viewer.actions import FALLBACK_RENDER_HW, RENDER_TIMEOUT_S
from mapstream.viewer.app import ViewerApp, ViewerOptions
from mapstream.viewer.recording import PAGE_BACKGROUND, RecordingCancelled, fit_render, originals_path, record_video

av = pytest.importorskip("av")

COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 220), (10, 10, 10), (200, 200, 30)]
"""The flat colour of frame t's render (COLOURS[t])."""
CODEC_TOLERANCE = 6
"""Largest difference per channel between a flat colour and its decoded frame's mean (H.264 at
CRF 18, or MPEG-4 at qscale 2)."""


class FrameClient(RenderingClient):
    """A browser whose render is COLOURS[t] all over, t being the frame on the page when the
    render is asked for (``page_frame()``), at the size asked or at ``render_hw``; with
    ``channels`` 4 it is RGBA (opaque), as a PNG render is."""

    def __init__(
        self, page_frame: Callable[[], int], canvas_hw: tuple[int, int] = (60, 80), *,
        channels: int = 3, render_hw: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(np.zeros((*canvas_hw, channels), np.uint8))
        self.page_frame, self.channels, self.render_hw = page_frame, channels, render_hw
        self.rendered: list[int] = []
        self.timeouts: list[float | None] = []

    def get_render(
        self, height: int, width: int, *, transport_format: str = "jpeg", timeout: float | None = None
    ) -> np.ndarray:
        t = self.page_frame()
        self.rendered.append(t)
        self.timeouts.append(timeout)
        h, w = self.render_hw or (height, width)
        self.image = np.full((h, w, self.channels), 255, np.uint8)
        self.image[..., :3] = COLOURS[t]
        return super().get_render(height, width, transport_format=transport_format, timeout=timeout)


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def assert_colours(frames: list[np.ndarray], expected: list[tuple[int, int, int]]) -> None:
    """One decoded frame per expected colour, in order, each flat in its colour."""
    assert len(frames) == len(expected)
    for i, (frame, colour) in enumerate(zip(frames, expected)):
        error = np.abs(frame.reshape(-1, 3).mean(0) - colour).max()
        assert error < CODEC_TOLERANCE, f"frame {i}: mean {frame.reshape(-1, 3).mean(0)}, expected {colour}"


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- record_video, without a viewer ------------------------------------------------------------
def test_one_video_frame_per_recorded_frame_in_order(tmp_path: Path) -> None:
    shown: list[int] = []
    progress: list[tuple[int, int]] = []
    client = FrameClient(lambda: shown[-1])  # a 60 x 80 canvas
    path = record_video(
        client, shown.append, [2, 0, 3, 1], tmp_path / "v.mp4", height=48, fps=12.5,
        progress=lambda done, total: progress.append((done, total)),
    )
    assert path == tmp_path / "v.mp4" and files_in(tmp_path) == ["v.mp4"]
    assert shown == client.rendered == [2, 0, 3, 1]  # each render came after its frame was put up
    # 48 tall with the canvas's 3:4 aspect; JPEG renders, with the default time limit.
    assert [call[:3] for call in client.calls] == [(48, 64, "jpeg")] * 4
    assert client.timeouts == [RENDER_TIMEOUT_S] * 4
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    frames = decode(path)
    assert frames[0].shape == (48, 64, 3)
    assert_colours(frames, [COLOURS[t] for t in (2, 0, 3, 1)])
    with av.open(str(path)) as container:
        assert container.streams.video[0].average_rate == 12.5


def test_the_size_is_even_and_follows_the_canvas_aspect(tmp_path: Path) -> None:
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1], canvas_hw=(50, 90))  # 47 tall: 84.6 wide; both made even
    record_video(client, shown.append, [4], tmp_path / "v.mkv", height=47, fps=5, transport_format="png", timeout=2.5)
    assert client.calls[0][:3] == (48, 84, "png") and client.timeouts == [2.5]
    assert decode(tmp_path / "v.mkv")[0].shape == (48, 84, 3)
    client.camera.image_height = client.camera.image_width = 0  # no canvas size reported yet
    record_video(client, shown.append, [5], tmp_path / "w.mp4", height=36, fps=5)
    assert FALLBACK_RENDER_HW == (720, 1280) and client.calls[-1][:2] == (36, 64)
    assert_colours(decode(tmp_path / "w.mp4"), [COLOURS[5]])


def test_a_render_of_another_size_is_resized(tmp_path: Path) -> None:
    """The browser answers 30 x 40 (say, at another pixel ratio) for a 48 x 64 video: the frame
    is the whole render scaled up, neither cropped nor padded."""
    render = np.zeros((30, 40, 3), np.uint8)
    render[:, :20] = COLOURS[0]
    render[:, 20:] = COLOURS[2]
    client = RenderingClient(render)  # canvas 30 x 40, so the video is 48 x 64
    record_video(client, lambda t: None, [0, 1], tmp_path / "v.mp4", height=48, fps=5)
    assert [call[:2] for call in client.calls] == [(48, 64)] * 2
    frames = decode(tmp_path / "v.mp4")
    assert len(frames) == 2 and frames[0].shape == (48, 64, 3)
    for frame in frames:  # left half the first colour, right half the second (away from the seam)
        assert_colours([frame[:, :24], frame[:, 40:]], [COLOURS[0], COLOURS[2]])

    shown: list[int] = []
    small = FrameClient(lambda: shown[-1], render_hw=(15, 21))  # another aspect too: stretched to fit
    record_video(small, shown.append, [1, 3], tmp_path / "w.mp4", height=48, fps=5)
    assert_colours(decode(tmp_path / "w.mp4"), [COLOURS[1], COLOURS[3]])


def test_an_rgba_render_is_put_on_the_page_background() -> None:
    """A PNG render is RGBA with a transparent background: the frame shows it on white, as a
    JPEG render of the same view does (dropping the alpha would make the background black)."""
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., :3] = (200, 40, 0)
    rgba[..., 3] = [[255, 128], [51, 0]]
    # Straight alpha a over white: c * a / 255 + 255 * (1 - a / 255), rounded.
    expected = [[[200, 40, 0], [227, 147, 127]], [[244, 212, 204], [255, 255, 255]]]
    assert PAGE_BACKGROUND == (255, 255, 255)
    np.testing.assert_array_equal(fit_render(rgba, 2, 2), np.array(expected, np.uint8))
    rgb = np.arange(18, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(fit_render(rgb, 2, 3), rgb)  # an RGB render of the right size: as it is


def test_an_opaque_rgba_render_makes_the_same_video_as_rgb(tmp_path: Path) -> None:
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1], channels=4)
    record_video(client, shown.append, [1, 3], tmp_path / "v.mp4", height=48, fps=5, transport_format="png")
    assert_colours(decode(tmp_path / "v.mp4"), [COLOURS[1], COLOURS[3]])


def test_cancel_keeps_the_earlier_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(b"earlier")
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1])
    cancel = threading.Event()

    def progress(done: int, total: int) -> None:
        if done == 2:
            cancel.set()  # "stop recording" while frame 1 was being rendered

    with pytest.raises(RecordingCancelled, match="stopped after 2 of 4 frames") as stopped:
        record_video(client, shown.append, range(4), path, height=16, fps=5, cancel=cancel, progress=progress)
    assert (stopped.value.done, stopped.value.total) == (2, 4)
    assert client.rendered == [0, 1]  # no render after the stop
    assert path.read_bytes() == b"earlier" and files_in(tmp_path) == ["v.mp4"]

    # A stop during the last frame's render still means no video.
    def stop_at_the_end(done: int, total: int) -> None:
        cancel.set()

    cancel.clear()
    with pytest.raises(RecordingCancelled, match="stopped after 1 of 1 frames"):
        record_video(client, shown.append, [0], path, height=16, fps=5, cancel=cancel, progress=stop_at_the_end)
    assert path.read_bytes() == b"earlier" and files_in(tmp_path) == ["v.mp4"]


def test_the_input_frames_make_a_second_video_beside_the_first(tmp_path: Path) -> None:
    """originals: NAME_original.mp4, one input frame per recorded frame in the same order, at
    the inputs' own size cut to even sides; a stopped recording writes neither video."""
    inputs = [np.full((31, 45, 3), COLOURS[t], np.uint8) for t in range(4)]
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1])
    record_video(client, shown.append, [3, 1, 2], tmp_path / "v.mp4", height=16, fps=8,
                 originals=lambda t: inputs[t])
    assert files_in(tmp_path) == ["v.mp4", "v_original.mp4"]
    assert originals_path(tmp_path / "v.mp4") == tmp_path / "v_original.mp4"
    frames = decode(tmp_path / "v_original.mp4")
    assert frames[0].shape == (30, 44, 3)
    assert_colours(frames, [COLOURS[t] for t in (3, 1, 2)])
    assert_colours(decode(tmp_path / "v.mp4"), [COLOURS[t] for t in (3, 1, 2)])

    cancel = threading.Event()
    with pytest.raises(RecordingCancelled):
        record_video(client, shown.append, range(4), tmp_path / "w.mp4", height=16, fps=8, cancel=cancel,
                     progress=lambda done, total: cancel.set(), originals=lambda t: inputs[t])
    assert files_in(tmp_path) == ["v.mp4", "v_original.mp4"]


def test_a_browser_that_sends_no_frame_is_an_error_and_nothing_is_written(tmp_path: Path) -> None:
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1])

    def fail_the_next_render(done: int, total: int) -> None:
        client.error = TimeoutError("no frame from the browser within 30 s")

    with pytest.raises(TimeoutError, match="no frame from the browser"):
        record_video(client, shown.append, range(3), tmp_path / "v.mp4", height=16, fps=5,
                     progress=fail_the_next_render)
    assert client.rendered == [0, 1] and files_in(tmp_path) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"path": "v.gif"}, r"must end in \.mp4, \.mkv, \.mov \(e\.g\. v\.mp4\)"),
        ({"path": "v"}, r"must end in \.mp4"),
        ({"frames": []}, "no frames to record"),
        ({"height": 0}, "video height must be >= 2"),
        ({"fps": 0}, "fps must be in"),
    ],
)
def test_bad_arguments_are_refused_before_any_render(tmp_path: Path, change: dict, message: str) -> None:
    shown: list[int] = []
    client = FrameClient(lambda: shown[-1])
    arguments = {"path": "v.mp4", "frames": [0, 1], "height": 16, "fps": 5} | change
    with pytest.raises(ValueError, match=message):
        record_video(client, shown.append, arguments["frames"], tmp_path / arguments["path"],
                     height=arguments["height"], fps=arguments["fps"])
    assert shown == [] and client.calls == [] and files_in(tmp_path) == []


def test_a_render_that_is_not_an_image_is_refused(tmp_path: Path) -> None:
    client = RenderingClient(np.zeros((30, 40), np.uint8))  # grey, no channel axis
    with pytest.raises(ValueError, match=r"not an RGB or RGBA uint8 image: got \[30, 40\] uint8"):
        record_video(client, lambda t: None, [0], tmp_path / "v.mp4", height=16, fps=5)
    assert files_in(tmp_path) == []


# -- the "record video" button of a running viewer ---------------------------------------------
def test_the_button_records_every_frame_as_the_page_shows_it_and_puts_the_scrubber_back(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("viser")
    with ViewerApp(make_recon(n=4), ViewerOptions(play_fps=12), port=free_port, output_dir=tmp_path) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        assert handles.video_path.value == str(tmp_path / "viewer.mp4")
        assert (handles.video_height.value, handles.video_fps.value) == ("1080p", 12)  # fps: the play fps
        assert handles.record_video.label == "record video"
        assert app.record_video() is None
        assert "record video: no browser is connected" in handles.status.content

        seen: list[tuple[str, list[bool]]] = []  # at each render: the status line's end, the clouds shown

        def page_frame() -> int:
            seen.append((handles.status.content.rsplit("\n", 1)[-1], [c.visible for c in handles.point_clouds]))
            return int(handles.frame.value)

        client = FrameClient(page_frame)  # a 60 x 80 canvas
        monkeypatch.setattr(app.server, "get_clients", lambda: {3: client})
        handles.frame_mode.value = "only t"
        handles.frame.value = 1
        handles.video_height.value = "720p"
        handles.video_fps.value = 20
        handles.record_video.value = True  # a click
        wait_for(lambda: "wrote" in handles.status.content, "the recording")

        target = tmp_path / "viewer.mp4"
        assert handles.status.content.endswith(f"wrote `{target}` (4 frames)")
        assert client.rendered == [0, 1, 2, 3]
        assert [call[:3] for call in client.calls] == [(720, 960, "jpeg")] * 4
        assert all(call[3].name == "mapstream-viewer-record" for call in client.calls)  # not the server's thread
        # Each frame was put up through the scrubber ("only t": its own points alone), with the
        # progress under the status.
        assert seen == [(f"recording {t}/4", [i == t for i in range(4)]) for t in range(4)]
        # Afterwards the page is back on frame 1, the controls as they were.
        assert handles.frame.value == 1 and [c.visible for c in handles.point_clouds] == [False, True, False, False]
        assert handles.record_video.label == "record video"
        assert not handles.play.disabled and not handles.frame.disabled
        frames = decode(target)
        assert frames[0].shape == (720, 960, 3)
        assert_colours(frames, COLOURS[:4])
        with av.open(str(target)) as container:
            assert container.streams.video[0].average_rate == 20
        assert files_in(tmp_path) == ["viewer.mp4"]

        # Ticking "also the input frames" adds the inputs' video beside it.
        assert handles.video_originals.value is False
        handles.video_originals.value = True
        handles.record_video.value = True
        wait_for(lambda: "_original" in handles.status.content, "the second recording")
        original = tmp_path / "viewer_original.mp4"
        assert handles.status.content.endswith(f"wrote `{target}` and `{original}` (4 frames)")
        assert files_in(tmp_path) == ["viewer.mp4", "viewer_original.mp4"]
        recon = app.recon
        decoded = decode(original)
        assert len(decoded) == 4 and decoded[0].shape[:2] == (recon.images.shape[1] // 2 * 2, recon.images.shape[2] // 2 * 2)


def test_stop_recording_keeps_the_earlier_video_and_play_is_held_meanwhile(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("viser")
    target = tmp_path / "viewer.mp4"
    target.write_bytes(b"earlier")
    with ViewerApp(make_recon(n=4), ViewerOptions(video_height=720), port=free_port, output_dir=tmp_path) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        client = FrameClient(lambda: int(handles.frame.value))
        client.release.clear()  # the browser takes its time with the first frame
        monkeypatch.setattr(app.server, "get_clients", lambda: {1: client})
        handles.fps.value = 1
        handles.frame.value = 0
        handles.play.value = True
        wait_for(lambda: handles.frame.value == 1, "play to step")  # its next step is 1 s away
        thread = app.record_video()
        assert thread is not None
        # The recording owns the scrubber: play is off and greyed out, the button stops it.
        assert handles.play.value is False and handles.play.disabled and handles.frame.disabled
        assert handles.record_video.label == "stop recording"
        wait_for(lambda: len(client.calls) == 1, "the first render request")
        assert handles.status.content.endswith("recording 0/4") and client.rendered == [0]
        assert app.record_video() is None
        assert handles.status.content.endswith("record video: a recording is under way; stop it first")
        app.step_frame(1)  # "next" and a click on a camera wait for the recording
        app.show_frame(3)
        assert handles.frame.value == 0

        handles.record_video.value = True  # a click on "stop recording"
        client.release.set()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert handles.status.content.endswith("recording stopped after 1 of 4 frames; no video written")
        assert client.rendered == [0]
        assert target.read_bytes() == b"earlier" and files_in(tmp_path) == ["viewer.mp4"]
        assert handles.frame.value == 1 and handles.play.value is False  # back where it was, not playing
        assert not handles.play.disabled and handles.record_video.label == "record video"


def test_refusals_and_failures_are_reported_and_write_nothing(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("viser")
    with pytest.raises(ValueError, match="video_height must be one of 720, 1080, 2160 \\(pixels\\), got 500"):
        ViewerApp(make_recon(), ViewerOptions(video_height=500))
    with ViewerApp(make_recon(), ViewerOptions(video_height=2160), port=free_port, output_dir=tmp_path) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        assert handles.video_height.value == "4K"
        client = FrameClient(lambda: int(handles.frame.value))
        monkeypatch.setattr(app.server, "get_clients", lambda: {1: client})
        handles.video_path.value = str(tmp_path / "clip.gif")
        assert app.record_video() is None
        assert f"record video: {tmp_path / 'clip.gif'}: the video file must end in .mp4" in handles.status.content
        handles.video_path.value = " "
        assert app.record_video() is None and "record video: enter a file path first" in handles.status.content
        assert client.calls == [] and handles.record_video.label == "record video"

        handles.video_height.value = "720p"
        handles.frame.value = 1
        client.error = TimeoutError("no frame from the browser")
        thread = app.record_video(tmp_path / "clip.mp4")
        assert thread is not None
        thread.join(timeout=30)
        assert handles.status.content.endswith(f"recording to `{tmp_path / 'clip.mp4'}` failed: no frame from the browser")
        assert len(client.calls) == 1 and files_in(tmp_path) == []
        assert handles.frame.value == 1 and handles.record_video.label == "record video"


def test_stopping_the_viewer_stops_its_recording(tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("viser")
    app = ViewerApp(make_recon(), ViewerOptions(video_height=720), port=free_port, output_dir=tmp_path).start()
    try:
        assert app.server is not None
        client = FrameClient(lambda: 0)
        client.release.clear()
        monkeypatch.setattr(app.server, "get_clients", lambda: {1: client})
        thread = app.record_video()
        assert thread is not None
        wait_for(lambda: len(client.calls) == 1, "the first render request")
        threading.Timer(0.2, client.release.set).start()  # the frame arrives while the viewer stops
    finally:
        app.stop()
    assert not thread.is_alive() and client.rendered == [0]
    assert files_in(tmp_path) == []
