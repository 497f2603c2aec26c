"""`VideoWriter`: frames in, a video out, atomically."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mapstream.render.video import VideoWriter, check_video_path, even_size

av = pytest.importorskip("av")


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def flat(h: int, w: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (h, w, 3)).copy()


def test_every_written_frame_comes_back_in_order_with_its_colour(tmp_path: Path) -> None:
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 220), (10, 10, 10)]
    with VideoWriter(tmp_path / "v.mp4", height=48, width=64, fps=12.5) as video:
        for c in colours:
            video.write(flat(48, 64, c))
    assert video.frames == len(colours)
    frames = decode(tmp_path / "v.mp4")
    assert len(frames) == len(colours) and frames[0].shape == (48, 64, 3)
    for frame, c in zip(frames, colours):
        assert np.abs(frame.reshape(-1, 3).mean(0) - c).max() < 6  # lossy, but each frame is its own colour
    with av.open(str(tmp_path / "v.mp4")) as container:
        assert container.streams.video[0].average_rate == 12.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]


def test_an_error_inside_leaves_the_earlier_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "v.mkv"
    path.write_bytes(b"earlier")
    with pytest.raises(KeyboardInterrupt), VideoWriter(path, height=16, width=16, fps=5) as video:
        video.write(flat(16, 16, (1, 2, 3)))
        raise KeyboardInterrupt
    assert path.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["v.mkv"]


def test_a_frame_of_another_size_or_type_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "v.mp4"
    with pytest.raises(ValueError, match=r"\[16, 32, 3\] uint8"), VideoWriter(path, height=16, width=32, fps=5) as video:
        video.write(flat(16, 32, (0, 0, 0)))
        video.write(flat(16, 30, (0, 0, 0)))
    with pytest.raises(ValueError, match="uint8"), VideoWriter(path, height=16, width=32, fps=5) as video:
        video.write(np.zeros((16, 32, 3), np.float32))
    assert list(tmp_path.iterdir()) == []


def test_sizes_rates_and_suffixes_are_checked_before_any_file_is_opened(tmp_path: Path) -> None:
    for kwargs, message in [({"height": 15, "width": 16}, "even"), ({"height": 16, "width": 0}, "even"),
                            ({"fps": 0}, "fps"), ({"fps": 1000}, "fps")]:
        size = {"height": 16, "width": 16, "fps": 10.0} | kwargs
        with pytest.raises(ValueError, match=message):
            VideoWriter(tmp_path / "v.mp4", **size)
    with pytest.raises(ValueError, match=r"\.mp4, \.mkv, \.mov"):
        check_video_path(tmp_path / "v.gif")
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        VideoWriter(tmp_path / "v.mp4", height=16, width=16, fps=10).write(flat(16, 16, (0, 0, 0)))
    assert list(tmp_path.iterdir()) == []


def test_even_size_keeps_the_aspect_with_even_sides() -> None:
    assert even_size((378, 504), 720) == (720, 960)
    assert even_size((480, 640), 363) == (364, 484)  # 363 -> 364; 484.0 -> 484
    assert even_size((100, 1), 10) == (10, 2)  # never below 2


def test_an_encoder_that_cannot_open_leaves_the_earlier_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "v.mp4"
    path.write_bytes(b"earlier")

    def no_encoder(self):
        raise RuntimeError("this PyAV build has neither an H.264 (libx264) nor an MPEG-4 encoder")

    monkeypatch.setattr(VideoWriter, "_open_stream", no_encoder)
    with pytest.raises(RuntimeError, match="encoder"), VideoWriter(path, height=16, width=16, fps=5):
        pass
    assert path.read_bytes() == b"earlier"
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]
