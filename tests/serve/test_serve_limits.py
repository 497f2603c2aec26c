"""What a client may ask of the server is bounded by the server's own limits: no preprocessing
makes a frame larger than the pixel limit or blows a thumbnail up to a full frame, only JPEG
and PNG files (and raw pixels) are decoded, by Pillow's plugins of those two formats alone,
and a session's scale phase and kept scale frames are at most the server's."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import EpsImagePlugin, Image

from mapstream.client import Client, Result, ServiceError
from mapstream.config import StreamConfig
from mapstream.serve.frames import decode_frame
from mapstream.serve.protocol import ProtocolError, pack

from serve_helpers import events, frames, results, serving, tiny_model

MAX_PIXELS = 100_000  # sqrt: 316.2, so image_size 308 (22 patches) is the largest that fits


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _file(image: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt)
    return buffer.getvalue()


def test_a_preprocessing_that_makes_frames_above_the_pixel_limit_is_refused_at_the_open(model):
    with serving(model, max_frame_pixels=MAX_PIXELS) as running:
        client = Client(running.url)
        for size in (2800, 322):  # 322 x 322 = 103 684 pixels: one patch more than fits
            with pytest.raises(ServiceError) as err:
                client.open_session(preprocess={"mode": "crop", "image_size": size})
            assert err.value.code == "bad_open"
            assert f"at most {MAX_PIXELS} pixels a frame (max_frame_pixels): ask for image_size 308 or less" in str(
                err.value)
        with pytest.raises(ServiceError, match="at most 100000 pixels") as err:  # the model's own width, 518
            client.open_session(preprocess={"mode": "pad"})
        # The largest that fits: frames of a 56 x 42 thumbnail come to the model 308 wide (5.5 times).
        session = client.open_session(preprocess={"mode": "pad", "image_size": 308}, settings={"num_scale_frames": 1},
                                      depth=True)
        thumbnail = frames(40, 1, hw=(42, 56))[0]
        session.send(thumbnail)
        (got,) = results(session.close())
    assert got.depth.shape == (308, 308) and 308 * 308 <= MAX_PIXELS


def test_a_frame_enlarged_beyond_reason_is_refused(model):
    preprocess = ("crop", 308)
    tiny = frames(41, 1, hw=(14, 14))[0]  # 82 bytes as a PNG, 22 times enlarged
    with pytest.raises(ProtocolError, match="would enlarge it 22.0 times.*at least 39 pixels wide") as err:
        decode_frame({"encoding": "png"}, memoryview(_file(tiny, "PNG")), preprocess, MAX_PIXELS, 14)
    assert err.value.code == "bad_frame" and "at most 8 times" in str(err.value)
    tall = frames(41, 1, hw=(40, 20))[0]  # pad: its height comes to 308, 7.7 times
    assert decode_frame({"encoding": "png"}, memoryview(_file(tall, "PNG")), ("pad", 308), MAX_PIXELS, 14).shape == (
        308, 308, 3)
    with pytest.raises(ProtocolError, match="at least 39 pixels high"):
        decode_frame({"encoding": "png"}, memoryview(_file(tall[:38], "PNG")), ("pad", 308), MAX_PIXELS, 14)
    with serving(model, max_frame_pixels=MAX_PIXELS) as running:
        session = Client(running.url).open_session(preprocess={"mode": "crop", "image_size": 308})
        refused = session.send(tiny)
        answers = session.close()
    (error,) = events(answers, "error")
    assert error.frame == refused and error.data["code"] == "bad_frame" and "enlarge" in error.data["message"]


def _pcd_behind_a_jpeg_signature() -> bytes:
    """Bytes that open as a JPEG's and are a Kodak PhotoCD image (which Pillow reads from its
    2048th byte on, whatever comes before)."""
    return b"\xff\xd8\xff" + bytes(2045) + b"PCD_IPI" + bytes(2041) + bytes(800_000)


def _eps() -> bytes:
    return b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 42\n0 0 moveto 28 42 lineto stroke\nshowpage\n"


def test_only_jpeg_and_png_files_are_decoded_whatever_the_header_says(monkeypatch):
    opened_as_eps = []
    original = EpsImagePlugin.EpsImageFile._open
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open",
                        lambda self: opened_as_eps.append(1) or original(self))
    image = frames(42, 1)[0]  # 28 x 42: any of these, decoded, would be a frame the model takes
    others = {fmt: _file(image, fmt) for fmt in ("GIF", "BMP", "TIFF", "WEBP", "PPM")}
    others.update(EPS=_eps(), PCD=_pcd_behind_a_jpeg_signature(), PNG=_file(image, "PNG"), JPEG=_file(image, "JPEG"))
    for label in ("jpeg", "png"):
        for fmt, data in others.items():
            if fmt == label.upper():
                continue
            with pytest.raises(ProtocolError) as err:
                decode_frame({"encoding": label}, memoryview(data), ("crop", 56), MAX_PIXELS, 14)
            assert err.value.code == "bad_frame", (label, fmt)
    assert not opened_as_eps  # Pillow's EPS plugin (Ghostscript) never read a byte
    assert decode_frame({"encoding": "png"}, memoryview(others["PNG"]), None, MAX_PIXELS, 14).shape == (28, 42, 3)


def test_a_gif_labelled_png_is_a_bad_frame_and_the_session_goes_on(model):
    image = frames(43, 1)[0]
    with serving(model) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        session._ws.send(pack({"frame": 0, "encoding": "png"}, _file(image, "GIF")))
        answer = session.receive(30)
        assert answer.type == "error" and answer.data["code"] == "bad_frame" and answer.frame == 0
        assert "this server decodes JPEG, PNG and raw frames only" in answer.data["message"]
        session._ws.send(pack({"frame": 1, "encoding": "raw", "shape": list(image.shape)}, image.tobytes()))
        assert [r.frame for r in results(session.close())] == [1]


@pytest.mark.parametrize("settings, words", [
    ({"num_scale_frames": 64}, "num_scale_frames may be at most the server's 4"),
    ({"num_scale_frames": 2, "cache_scale_frames": 1_000_000}, "may be at most the server's 4, got 1000000"),
])
def test_a_scale_phase_or_kept_scale_frames_beyond_the_servers_are_refused(model, settings, words):
    with serving(model, stream=StreamConfig(num_scale_frames=4)) as running:
        with pytest.raises(ServiceError, match=words) as err:
            Client(running.url).open_session(settings=settings)
        assert err.value.code == "bad_open"
        session = Client(running.url).open_session(settings={"num_scale_frames": 4, "cache_scale_frames": 2})
        for image in frames(44, 5):
            session.send(image)
        got = [a for a in session.close() if isinstance(a, Result)]
    assert [(r.index, r.scale_frame) for r in got] == [(0, True), (1, True), (2, True), (3, True), (4, False)]
