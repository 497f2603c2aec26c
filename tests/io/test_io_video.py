"""Video decoding with PyAV: sampling, limits, preprocessing identity, errors."""
from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

av = pytest.importorskip("av")

from mapstream.io.images import preprocess_image  # noqa: E402
from mapstream.io.video import (  # noqa: E402
    iter_video_frames,
    iter_video_tensors,
    probe_video,
    sample_interval,
    upright,
)

N_FRAMES, SRC_FPS, W, H = 20, 20, 64, 48


def colour_bars(i: int) -> np.ndarray:
    """Frame ``i``: 8 colour bars shifted right by 3*i px (all 20 distinct), ``[H, W, 3]`` u8."""
    x = (np.arange(W) - 3 * i) % W // (W // 8)  # bar index 0..7 per column
    palette = np.array([[(b >> 2 & 1) * 255, (b >> 1 & 1) * 255, (b & 1) * 255] for b in range(8)])
    return np.broadcast_to(palette[x][None], (H, W, 3)).astype(np.uint8)


def write_video(
    path: Path, codec: str, pix_fmt: str, rate: int = SRC_FPS, rotation: int = 0
) -> Path:
    try:
        av.codec.Codec(codec, "w")
    except Exception:  # noqa: BLE001 - any lookup failure means "not in this FFmpeg build"
        pytest.skip(f"encoder {codec} not available in this PyAV build")
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = W, H, pix_fmt
        if rotation:
            stream.set_display_rotation(rotation)
        for i in range(N_FRAMES):
            frame = av.VideoFrame.from_ndarray(colour_bars(i), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path


@pytest.fixture(scope="module")
def lossless_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FFV1 in RGB: decoded frames equal the generated ones bit for bit."""
    return write_video(tmp_path_factory.mktemp("video") / "bars.mkv", "ffv1", "bgr0")


@pytest.fixture(scope="module")
def mpeg4_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "bars.mp4", "mpeg4", "yuv420p")


def test_sample_interval() -> None:
    assert sample_interval(20, 10) == 2
    assert sample_interval(29.97, 10) == 3
    assert sample_interval(20, 8) == 2  # 2.5 -> 2: Python round, ties to even
    assert sample_interval(30, 4) == 8  # 7.5 -> 8
    assert sample_interval(None, 10) == 3 and sample_interval(0, 10) == 3  # unknown -> 30 fps
    assert sample_interval(20, 100) == 1
    assert sample_interval(20, None) == 1
    with pytest.raises(ValueError, match="fps"):
        sample_interval(20, 0)


@pytest.mark.parametrize(
    ("fps", "stride", "first_k", "indices"),
    [
        (None, 1, None, list(range(20))),
        (10, 1, None, list(range(0, 20, 2))),
        (5, 1, None, [0, 4, 8, 12, 16]),
        (7, 1, None, [0, 3, 6, 9, 12, 15, 18]),  # round(20 / 7) = 3
        (8, 1, None, list(range(0, 20, 2))),  # round(2.5) = 2
        (10, 2, None, [0, 4, 8, 12, 16]),  # stride over the kept frames
        (10, 1, 3, [0, 2, 4]),
        (10, 2, 2, [0, 4]),
    ],
)
def test_frame_selection_is_exact(lossless_video: Path, fps, stride, first_k, indices) -> None:
    frames = list(iter_video_frames(lossless_video, fps=fps, stride=stride, first_k=first_k))
    assert [f.index for f in frames] == indices
    for f in frames:  # lossless codec: the decoded pixels are the frame we wrote at that index
        assert f.image.mode == "RGB" and f.image.size == (W, H)
        assert np.array_equal(np.asarray(f.image), colour_bars(f.index))
        assert f.time == pytest.approx(f.index / SRC_FPS)


def test_mpeg4_counts_and_content(mpeg4_video: Path) -> None:
    info = probe_video(mpeg4_video)
    assert (info.width, info.height, info.src_fps, info.codec) == (W, H, 20.0, "mpeg4")
    assert [f.index for f in iter_video_frames(mpeg4_video, fps=None)] == list(range(20))
    frames = list(iter_video_frames(mpeg4_video, fps=5))
    assert [f.index for f in frames] == [0, 4, 8, 12, 16]
    for f in frames:  # lossy: nearest generated frame must be the right one
        errors = [np.abs(np.asarray(f.image, np.int16) - colour_bars(i)).mean() for i in range(20)]
        assert int(np.argmin(errors)) == f.index


def test_tensor_equals_preprocess_of_decoded_frame(mpeg4_video: Path) -> None:
    tensors = iter_video_tensors(mpeg4_video, fps=10, image_size=56)
    frames = iter_video_frames(mpeg4_video, fps=10)
    assert isinstance(tensors, types.GeneratorType)  # lazy, one frame at a time
    count = 0
    for tensor, frame in zip(tensors, frames, strict=True):
        assert tensor.shape == (3, 42, 56)  # 64x48 -> W 56, H round(48 * 56/64 / 14) * 14
        assert torch.equal(tensor, preprocess_image(frame.image, "crop", 56, 14))
        count += 1
    assert count == 10


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.mp4"):
        next(iter_video_frames(tmp_path / "missing.mp4"))
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"definitely not a video" * 100)
    with pytest.raises(ValueError, match=r"junk\.mp4"):
        next(iter_video_frames(junk))
    with pytest.raises(ValueError, match=r"junk\.mp4"):
        probe_video(junk)
    with pytest.raises(ValueError, match="stride"):
        next(iter_video_frames(junk, stride=0))


def test_audio_only_file_rejected(tmp_path: Path) -> None:
    path = tmp_path / "tone.wav"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        silence = np.zeros((1, 800), np.int16)
        frame = av.AudioFrame.from_ndarray(silence, format="s16", layout="mono")
        frame.sample_rate = 8000
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    with pytest.raises(ValueError, match="no video stream"):
        next(iter_video_frames(path))


@pytest.mark.parametrize(
    ("rotation", "transpose"),
    [(90, Image.Transpose.ROTATE_90), (-90, Image.Transpose.ROTATE_270),
     (180, Image.Transpose.ROTATE_180)],
)
def test_display_rotation_applied(tmp_path: Path, rotation: int, transpose) -> None:
    """Phone videos store landscape pixels + a display matrix; frames come out upright."""
    path = write_video(tmp_path / "phone.mkv", "ffv1", "bgr0", rotation=rotation)
    frame = next(iter_video_frames(path, fps=None))
    assert frame.image.size == ((H, W) if rotation % 180 else (W, H))
    expected = Image.fromarray(colour_bars(0)).transpose(transpose)
    assert np.array_equal(np.asarray(frame.image), np.asarray(expected))
    raw = next(iter_video_frames(path, fps=None, autorotate=False))
    assert np.array_equal(np.asarray(raw.image), colour_bars(0))


def test_upright_quarter_turns() -> None:
    image = Image.fromarray(colour_bars(0))
    assert upright(image, 0) is image
    assert np.array_equal(np.asarray(upright(image, 270)), np.asarray(upright(image, -90)))
    assert upright(image, 90).size == (H, W)


def test_a_damaged_packet_costs_its_frames_not_the_video(tmp_path: Path, monkeypatch, caplog) -> None:
    """Packets the decoder refuses are skipped with one warning (and a count); the frames around
    them come through, in order, with their own pictures. Nothing decodable is an error that
    quotes the decoder."""
    import mapstream.io.video as video

    lossless_video = write_video(tmp_path / "bars.mov", "png", "rgb24")  # every packet a whole picture

    real_open = video._open

    class Damaged:
        def decode(self):
            raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input")

    class Container:
        """The real container, with the packets numbered in `bad` damaged."""

        def __init__(self, container, bad) -> None:
            self._container, self._bad = container, bad

        def demux(self, stream):
            for i, packet in enumerate(self._container.demux(stream)):
                yield Damaged() if i in self._bad else packet

        def __getattr__(self, name):
            return getattr(self._container, name)

        def __enter__(self):
            self._container.__enter__()
            return self

        def __exit__(self, *exc):
            return self._container.__exit__(*exc)

    def opening(bad):
        def open_(path):
            container, stream = real_open(path)
            return Container(container, bad), stream
        return open_

    monkeypatch.setattr(video, "_open", opening({5, 6}))
    with caplog.at_level("WARNING", logger="mapstream.io.video"):
        frames = list(iter_video_frames(lossless_video, fps=None))
    assert len(frames) == N_FRAMES - 2
    kept = [i for i in range(N_FRAMES) if i not in (5, 6)]
    for f, i in zip(frames, kept):
        np.testing.assert_array_equal(np.asarray(f.image), colour_bars(i))
    assert [f.index for f in frames] == list(range(N_FRAMES - 2))
    messages = [r.getMessage() for r in caplog.records]
    assert sum("a damaged packet after frame" in m and "was skipped" in m for m in messages) == 1
    assert any("2 damaged packets were skipped in all" in m for m in messages)

    monkeypatch.setattr(video, "_open", opening(set(range(1000))))
    with pytest.raises(ValueError, match=r"no frames could be decoded from .*bars\.mov \(the decoder: .*Invalid data"):
        list(iter_video_frames(lossless_video, fps=None))


@pytest.fixture
def served(mpeg4_video: Path):
    """The mpeg4 video's folder on a local HTTP server (a thread): yields the base URL."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # noqa: D401 - the test's output stays clean
            pass

    handler = functools.partial(Quiet, directory=str(mpeg4_video.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_video_url_is_read_as_the_file_would_be(mpeg4_video: Path, served: str) -> None:
    """An http(s) URL of a video file goes through PyAV, not OpenCV's capture: the same fps
    sampling, frames, names and presentation times as the file; a missing one is told."""
    from mapstream.io.sources import open_source
    from mapstream.io.video import is_video_url, video_stem

    url = f"{served}/{mpeg4_video.name}"
    assert is_video_url(url) and is_video_url("HTTPS://host/a%20b.MP4?x=1") and not is_video_url("rtsp://h/s.mp4")
    assert not is_video_url("http://host/live") and not is_video_url(mpeg4_video)
    assert video_stem("https://host/dir/a%20b.mp4?token=1") == "a b" and video_stem(mpeg4_video) == "bars"
    assert probe_video(url).src_fps == 20.0 and probe_video(url).path == url
    from_file = open_source(str(mpeg4_video), fps=5, image_size=56)
    from_url = open_source(url, fps=5, image_size=56)
    assert from_url.expected_length == from_file.expected_length == 5
    got = [(name, tensor) for name, tensor in from_url]
    want = [(name, tensor) for name, tensor in from_file]
    assert [n for n, _ in got] == [n for n, _ in want] == [f"bars_{i:06d}" for i in (0, 4, 8, 12, 16)]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want, strict=True))
    with pytest.raises((ValueError, FileNotFoundError), match="missing.mp4"):
        list(open_source(f"{served}/missing.mp4", fps=5, image_size=56))
