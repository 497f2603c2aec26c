"""FrameSource: every input kind yields the same (name, tensor) pairs as the direct loaders."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mapstream.io import FrameSource, load_images, open_source, preprocess_image


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for i in (1, 2, 10):
        pixels = np.random.default_rng(i).integers(0, 256, (56, 70, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / f"{i}.png")
    return tmp_path


def test_folder_source_matches_load_images(folder: Path) -> None:
    source = open_source(folder, image_size=140)
    assert len(source) == 3
    names, frames = zip(*source)
    assert names == ("1.png", "2.png", "10.png")
    expected = load_images([folder / n for n in names], image_size=140)
    assert torch.equal(torch.stack(frames), expected)
    assert [n for n, _ in source] == list(names)  # iterating again restarts


@pytest.mark.parametrize("mode", ["crop", "pad"])
def test_images_of_mixed_shapes_come_out_padded_to_one_frame_shape_like_load_images(tmp_path: Path, mode) -> None:
    """Landscape 4:3 and 16:9 and a portrait photo rotated by its EXIF tag: in crop mode their
    frames would differ in height, so every frame is padded with white to the tallest, exactly
    as `load_images` pads the batch (sizes read from the headers before the first frame);
    a single session can then take them all."""
    rng = np.random.default_rng(4)
    Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(rng.integers(0, 256, (45, 80, 3), dtype=np.uint8)).save(tmp_path / "b.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown portrait
    Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(tmp_path / "c.jpg", exif=exif)
    from mapstream.io.images import open_image, oriented_size

    assert oriented_size(tmp_path / "c.jpg") == open_image(tmp_path / "c.jpg").size == (60, 80)
    source = open_source(tmp_path, image_size=56, mode=mode)
    names, frames = zip(*source)
    assert {tuple(f.shape) for f in frames} == {(3, 56, 56)}
    expected = load_images([tmp_path / n for n in names], image_size=56, mode=mode)
    assert torch.equal(torch.stack(frames), expected)
    if mode == "crop":  # the 16:9 frame (28 rows) padded by 14 white rows above and below
        b = frames[names.index("b.png")]
        assert torch.all(b[:, :14] == 1) and torch.all(b[:, -14:] == 1)


def test_folder_limits_and_glob(folder: Path) -> None:
    assert [n for n, _ in open_source(folder, stride=2)] == ["1.png", "10.png"]
    assert [n for n, _ in open_source(folder, first_k=1)] == ["1.png"]
    files = open_source(folder, first_k=1)
    list(files)
    assert files.last_time is None  # image files carry no time
    globbed = open_source(str(folder / "*.png"), stride=2, image_size=56)
    assert [n for n, _ in globbed] == ["1.png", "10.png"] and len(globbed) == 2
    listed = open_source([folder / "10.png", folder / "1.png"], image_size=56)
    assert [n for n, _ in listed] == ["10.png", "1.png"]
    single = open_source(folder / "2.png", image_size=56)
    (name, frame), = list(single)
    assert name == "2.png"
    assert torch.equal(frame, preprocess_image(Image.open(folder / "2.png"), "crop", 56))


def lossless_video(path: Path, frames: list[np.ndarray], rate: int) -> Path:
    """An FFV1 Matroska video of RGB ``frames`` (decoded back exactly)."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "bgr0"
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return path


def test_video_source(tmp_path: Path) -> None:
    frames = [np.full((28, 32, 3), 40 * i, dtype=np.uint8) for i in range(6)]
    path = lossless_video(tmp_path / "clip.mkv", frames, rate=10)
    source = open_source(path, fps=5, image_size=28)
    with pytest.raises(TypeError, match="not known"):
        len(source)
    assert source.last_time is None  # nothing yielded yet
    items, times = [], []
    for item in source:
        items.append(item)
        times.append(source.last_time)
    assert [n for n, _ in items] == ["clip_000000", "clip_000002", "clip_000004"]
    assert times == pytest.approx([0.0, 0.2, 0.4])  # presentation times of frames 0, 2, 4 at 10 fps
    for (_, frame), value in zip(items, (0, 80, 160)):
        assert frame.shape == (3, 28, 28)
        assert torch.equal(frame, torch.full((3, 28, 28), value / 255))


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="input not found"):
        open_source(tmp_path / "nothing_here")
    with pytest.raises(FileNotFoundError, match="no files match"):
        open_source(str(tmp_path / "*.png"))
    with pytest.raises(FileNotFoundError, match="video file not found"):
        FrameSource.from_video(tmp_path / "missing.mp4")
    with pytest.raises(ValueError, match="no image paths"):
        open_source([])


def test_a_bad_frame_size_or_mode_fails_when_the_source_opens(folder: Path, monkeypatch) -> None:
    """Before any frame is read (it used to fail at the first frame, a progress bar later)."""
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("a frame was read"))
    with pytest.raises(ValueError, match=r"image_size \(10\) must be a positive multiple of patch_size \(14\)"):
        open_source(folder, image_size=10)
    with pytest.raises(ValueError, match="mode must be 'crop' or 'pad'"):
        open_source(folder, mode="stretch")


def test_webcam_without_opencv_says_what_to_install(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cv2", None)  # what an environment without OpenCV sees
    with pytest.raises(ImportError, match="pip install opencv-python-headless"):
        open_source(0)
    with pytest.raises(ImportError, match="opencv"):
        open_source("rtsp://camera.local/stream")


class _FakeCapture:
    """cv2.VideoCapture over a list of BGR frames (a webcam without a webcam)."""

    frames: list = []
    opened = True

    def __init__(self, device) -> None:
        self.device, self.at, self.released = device, 0, False

    def isOpened(self) -> bool:  # noqa: N802 - OpenCV's name
        return self.opened

    def read(self):
        if self.at >= len(self.frames):
            return False, None
        self.at += 1
        return True, self.frames[self.at - 1]

    def release(self) -> None:
        self.released = True


def test_capture_source_reads_a_webcam_with_stride_first_k_and_capture_times(monkeypatch) -> None:
    """A webcam index opens OpenCV's capture: BGR frames become RGB, --stride and --first-k
    apply, names count the frames read, `last_time` is the seconds since the first frame was
    read; a device that does not open says what to check."""
    import sys
    import types

    bgr = [np.zeros((28, 28, 3), np.uint8) for _ in range(7)]
    for i, frame in enumerate(bgr):
        frame[..., 0] = 10 * i  # blue in OpenCV's order
    monkeypatch.setattr(_FakeCapture, "frames", bgr)
    monkeypatch.setitem(sys.modules, "cv2", types.SimpleNamespace(VideoCapture=_FakeCapture))
    source = open_source(0, stride=2, first_k=3, image_size=28)
    items, times = [], []
    for item in source:
        items.append(item)
        times.append(source.last_time)
    assert [n for n, _ in items] == ["frame_000000", "frame_000002", "frame_000004"]
    for (_, frame), i in zip(items, (0, 2, 4)):
        assert torch.equal(frame[2], torch.full((28, 28), 10 * i / 255))  # blue is the last RGB channel
        assert frame[:2].abs().max() == 0
    assert times[0] == 0.0 and times == sorted(times)
    monkeypatch.setattr(_FakeCapture, "opened", False)
    with pytest.raises(ValueError, match="cannot open capture device 'rtsp://cam/1'"):
        list(open_source("rtsp://cam/1", image_size=28))


def test_a_stream_is_read_through_opencv_frame_for_frame_as_the_file_decoder_reads_it(tmp_path: Path) -> None:
    """OpenCV's capture (what a webcam or an rtsp:// URL goes through) on a lossless local
    video: the same frames, in order and in RGB, as PyAV's reading of the file."""
    pytest.importorskip("cv2")
    from mapstream.io.sources import FrameSource

    frames = []
    for i in range(9):
        rgb = np.zeros((28, 42, 3), np.uint8)
        rgb[..., 0], rgb[..., 1], rgb[:, : 3 * i + 1, 2] = 20 * i, 255 - 20 * i, 200
        frames.append(rgb)
    path = lossless_video(tmp_path / "clip.mkv", frames, rate=30)
    captured = list(FrameSource.from_capture(str(path), image_size=42, stride=2))
    decoded = list(open_source(path, fps=None, stride=2, image_size=42))
    assert [n for n, _ in captured] == [f"frame_{i:06d}" for i in range(0, 9, 2)]
    assert len(captured) == len(decoded) == 5
    for (_, a), (_, b) in zip(captured, decoded):
        assert torch.equal(a, b)


@pytest.mark.parametrize("container, codec, pix_fmt", [("clip.mp4", "mpeg4", "yuv420p"), ("clip.mkv", "ffv1", "bgr0")])
@pytest.mark.parametrize("fps, stride, first_k", [(None, 1, None), (10, 1, None), (7, 2, None), (10, 3, 4), (None, 5, 100)])
def test_a_videos_expected_length_is_what_it_yields(tmp_path: Path, container, codec, pix_fmt, fps, stride, first_k) -> None:
    """A video's length is not known for sure before decoding, but its header gives the
    frame count (MP4) or the duration (Matroska, which stores no count): the estimate the
    run's keyframe rule and progress bar use. 47 frames at 30 fps."""
    av = pytest.importorskip("av")
    path = tmp_path / container
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = 32, 28, pix_fmt
        for i in range(47):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((28, 32, 3), i, np.uint8), format="rgb24")))
        out.mux(stream.encode())
    source = open_source(path, fps=fps, stride=stride, first_k=first_k, image_size=28)
    assert source.length is None
    assert source.expected_length == sum(1 for _ in source)


def test_frames_can_be_turned_clockwise_before_preprocessing(tmp_path: Path) -> None:
    """`rotate` turns every image clockwise, losslessly, before it is preprocessed (the
    reference demo's --rotate_clockwise_90); the padding height of mixed sizes is computed
    from the turned sides. Anything but a quarter turn is refused when the source opens."""
    from mapstream.io.sources import _CLOCKWISE

    marker = Image.new("RGB", (3, 2))
    marker.putpixel((0, 0), (255, 0, 0))
    turned = marker.transpose(_CLOCKWISE[90])
    assert turned.size == (2, 3) and turned.getpixel((1, 0)) == (255, 0, 0)  # top-left goes top-right

    rng = np.random.default_rng(0)
    wide, tall = tmp_path / "a_wide.png", tmp_path / "b_tall.png"
    Image.fromarray(rng.integers(0, 255, (30, 60, 3), dtype=np.uint8)).save(wide)
    Image.fromarray(rng.integers(0, 255, (60, 50, 3), dtype=np.uint8)).save(tall)
    source = FrameSource.from_paths([wide, tall], image_size=28, rotate=90)
    frames = [frame for _, frame in source]
    assert torch.equal(frames[0], preprocess_image(Image.open(wide).transpose(_CLOCKWISE[90]), "crop", 28))
    # Turned, the wide image is the tall one: both frames crop to 28 x 28, nothing is padded.
    assert source.pad_height is None and [tuple(f.shape) for f in frames] == [(3, 28, 28), (3, 28, 28)]
    unturned = FrameSource.from_paths([wide, tall], image_size=28)
    assert unturned.pad_height == 28 and torch.equal(next(iter(unturned))[1][:, 7:21], preprocess_image(Image.open(wide), "crop", 28))
    with pytest.raises(ValueError, match="rotate must be 0, 90, 180 or 270"):
        FrameSource.from_paths([wide], rotate=45)


def test_a_stream_that_changes_resolution_keeps_its_first_frame_size(caplog) -> None:
    """A video or camera whose picture changes size mid-stream (a resolution switch): later
    frames are padded with white or centre-cropped to the first frame's preprocessed size, as
    one sequence needs, with a warning; the first-size frames are untouched."""
    rng = np.random.default_rng(3)
    pictures = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((42, 56), (28, 56), (56, 56), (42, 56))]

    def frames():
        for i, p in enumerate(pictures):
            yield f"f{i}", Image.fromarray(p)

    source = FrameSource(frames, length=None, description="a stream", image_size=56)
    with caplog.at_level("WARNING", logger="mapstream.io.sources"):
        got = dict(source)
    assert {name: tuple(f.shape) for name, f in got.items()} == {f"f{i}": (3, 42, 56) for i in range(4)}
    direct = [preprocess_image(Image.fromarray(p), "crop", 56) for p in pictures]
    assert torch.equal(got["f0"], direct[0]) and torch.equal(got["f3"], direct[3])
    assert torch.equal(got["f1"][:, 7:35], direct[1]) and bool((got["f1"][:, :7] == 1).all())  # padded white
    assert torch.equal(got["f2"], direct[2][:, 7:49])  # the middle rows
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "frame f1 is 56x28 after preprocessing, the stream's first 56x42; it and" in warned[0]


def test_a_file_too_extreme_to_crop_is_named_when_the_source_opens(tmp_path: Path) -> None:
    """From the files' headers, before the first frame is yielded (it used to fail at that frame,
    after every frame before it had run, without its name)."""
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(tmp_path / "0.png")
    Image.fromarray(np.zeros((10, 4000, 3), np.uint8)).save(tmp_path / "1.png")
    with pytest.raises(ValueError, match=r"1\.png \(4000x10\) would be 56 wide and less than one 14-pixel patch.*'pad'"):
        open_source(tmp_path, image_size=56)


def test_a_picture_smaller_than_a_patch_is_refused_and_a_large_upscale_is_told(tmp_path: Path, caplog) -> None:
    """A 1x1 image would be upscaled to a whole frame of invented pixels: refused, named. A
    20x20 one, 28 times smaller than a 560-pixel frame, runs with one warning a pass."""
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(tmp_path / "0.png")
    Image.new("RGB", (1, 1), (200, 10, 10)).save(tmp_path / "1.png")
    with pytest.raises(ValueError, match=r"frame 1\.png of folder .* is 1x1 pixels, smaller than one 14-pixel patch"):
        list(open_source(tmp_path, image_size=56))
    (tmp_path / "1.png").unlink()
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "2.png")
    with caplog.at_level(logging.WARNING, logger="mapstream.io.sources"):
        assert len(list(open_source(tmp_path, image_size=560))) == 2
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "frame 0.png is 28x28, upscaled 20 times to the model's 560-pixel frames" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mapstream.io.sources"):
        list(open_source(tmp_path, image_size=56))  # 2 and 2.8 times: no warning
    assert caplog.records == []


def test_image_links_that_lead_nowhere_are_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    """A loop of links (a.png -> b.png -> a.png) and a link to a missing file hold no picture:
    the folder's and the glob's other images run, and the skipped links are named."""
    Image.fromarray(np.zeros((28, 28, 3), np.uint8)).save(tmp_path / "0.png")
    (tmp_path / "a.png").symlink_to(tmp_path / "b.png")
    (tmp_path / "b.png").symlink_to(tmp_path / "a.png")
    (tmp_path / "c.png").symlink_to(tmp_path / "gone.png")
    for spec, says in ((tmp_path, "skipped 3 image links that lead nowhere"), (f"{tmp_path}/*.png", "skipped 3 links")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mapstream.io"):
            assert [name for name, _ in open_source(str(spec), image_size=28)] == ["0.png"]
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and says in warned[0], warned
        assert all(f"{name}.png" in warned[0] for name in "abc") and "0.png" not in warned[0]
