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
from mapstream.viewer.recording import RecordingCancelled, record_video

av = pytest.importorskip("av")

COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 220), (10, 10, 10), (200, 200, 30)]
"""The flat colour of frame t's render (COLOURS[t])."""
CODEC_TOLERANCE = 6
"""Largest difference per channel between a flat colour and its decoded frame's mean (H.264 at
CRF 18, or MPEG-4 at qscale 2)."""


class FrameClient(RenderingClient):
    """A browser whose render is COLOURS[t] all over, t being the frame on the page when the
    render is asked for (``page_frame()``), at the size asked or at ``render_hw``; with
    ``channels`` 4 it has a half-transparent alpha channel, as a PNG render would."""

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
        self.image = np.full((h, w, self.channels), 128, np.uint8)
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
    client = FrameClient(lambda: shown[-1], canvas_hw=(50, 90))  # 45 x 81 at height 45: made even
    record_video(client, shown.append, [4], tmp_path / "v.mkv", height=45, fps=5, transport_format="png", timeout=2.5)
    assert client.calls[0][:3] == (46, 82, "png") and client.timeouts == [2.5]
    assert decode(tmp_path / "v.mkv")[0].shape == (46, 82, 3)
    client.camera.image_height = client.camera.image_width = 0  # no canvas size reported yet
    record_video(client, shown.append, [5], tmp_path / "w.mp4", height=36, fps=5)
    assert FALLBACK_RENDER_HW == (720, 1280) and client.calls[-1][:2] == (36, 64)
    assert_colours(decode(tmp_path / "w.mp4"), [COLOURS[5]])


def test_an_rgba_render_of_another_size_is_resized_and_its_alpha_dropped(tmp_path: Path) -> None:
    """The browser answers 30 x 40 (say, at another pixel ratio) for a 48 x 64 video, in RGBA
    with alpha 0: the frame is the whole render scaled up, its colours as they were."""
    render = np.zeros((30, 40, 4), np.uint8)
    render[:, :20, :3] = COLOURS[0]
    render[:, 20:, :3] = COLOURS[2]
    client = RenderingClient(render)  # canvas 30 x 40, so the video is 48 x 64
    record_video(client, lambda t: None, [0, 1], tmp_path / "v.mp4", height=48, fps=5)
    assert [call[:2] for call in client.calls] == [(48, 64)] * 2
    frames = decode(tmp_path / "v.mp4")
    assert len(frames) == 2 and frames[0].shape == (48, 64, 3)
    for frame in frames:  # left half the first colour, right half the second (away from the seam)
        assert_colours([frame[:, :24], frame[:, 40:]], [COLOURS[0], COLOURS[2]])

    shown: list[int] = []
    half_transparent = FrameClient(lambda: shown[-1], channels=4, render_hw=(15, 20))
    record_video(half_transparent, shown.append, [1, 3], tmp_path / "w.mp4", height=48, fps=5)
    assert_colours(decode(tmp_path / "w.mp4"), [COLOURS[1], COLOURS[3]])


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
