"""The pure parts of the service: the wire format, the frame checks, the open message, the
rate limit, the queue's drop policy and who may start a server without a token."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mapstream.config import StreamConfig
from mapstream.serve.config import ServeConfig, resolve_token
from mapstream.serve.frames import check_frame_message, decode_frame
from mapstream.serve.options import parse_open
from mapstream.serve.protocol import ProtocolError, decode_arrays, encode_arrays, pack, unpack
from mapstream.serve.stream import QueuedFrame, RateLimit, ServedStream

from serve_helpers import TOKEN, frames

MAX_PIXELS = 1_000_000


def _png(image: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt)
    return buffer.getvalue()


def test_binary_messages_round_trip_and_refuse_what_is_not_one():
    header, payload = unpack(pack({"frame": 3, "encoding": "raw"}, b"\x00\x01\x02"))
    assert header == {"frame": 3, "encoding": "raw"} and bytes(payload) == b"\x00\x01\x02"
    with pytest.raises(ProtocolError, match="starts with b'MSF1'"):
        unpack(b"GIF89a" + b"\x00" * 10)
    with pytest.raises(ProtocolError, match="header says it is"):
        unpack(b"MSF1\x00\x00\x10\x00{}")


def test_arrays_arrive_exactly_in_their_dtype():
    rng = np.random.default_rng(0)
    sent = {"depth": rng.random((5, 7)).astype(np.float32), "confidence": rng.random((5, 7)).astype(np.float16),
            "colors": rng.integers(0, 256, (4, 3)).astype(np.uint8)}
    described, payload = encode_arrays(sent)
    got = decode_arrays(described, memoryview(payload))
    assert [d["name"] for d in described] == ["depth", "confidence", "colors"]
    for name, array in sent.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array)
    with pytest.raises(ProtocolError):
        decode_arrays(described, memoryview(payload[:-3]))


def test_frames_decode_to_the_pixels_sent():
    image = frames(0, 1)[0]
    raw = {"encoding": "raw", "shape": list(image.shape)}
    assert np.array_equal(decode_frame(raw, memoryview(image.tobytes()), None, 10_000, 14), image)
    assert np.array_equal(decode_frame({"encoding": "png"}, memoryview(_png(image)), None, 10_000, 14), image)
    jpeg = decode_frame({"encoding": "jpeg"}, memoryview(_png(image, "JPEG")), None, 10_000, 14)
    assert jpeg.shape == image.shape and jpeg.dtype == np.uint8


def test_bad_frames_are_told_what_is_wrong():
    image = frames(0, 1, hw=(140, 140))[0]
    jpeg = _png(image, "JPEG")
    with pytest.raises(ProtocolError, match="corrupt or truncated") as err:  # its scan data cut short
        decode_frame({"encoding": "jpeg"}, memoryview(jpeg[: len(jpeg) * 2 // 3]), None, 100_000, 14)
    assert err.value.code == "bad_frame"
    with pytest.raises(ProtocolError, match="not a readable jpeg") as err:  # its header garbled
        decode_frame({"encoding": "jpeg"}, memoryview(jpeg[:20] + bytes(400) + jpeg[420:]), None, 100_000, 14)
    assert err.value.code == "bad_frame"
    with pytest.raises(ProtocolError, match="not a readable png"):
        decode_frame({"encoding": "png"}, memoryview(b"hello"), None, 10_000, 14)
    with pytest.raises(ProtocolError, match="at most 1000") as err:  # told from the header alone
        decode_frame({"encoding": "png"}, memoryview(_png(image)[:60]), None, 1000, 14)
    assert err.value.code == "frame_too_large"
    with pytest.raises(ProtocolError, match="multiples of 14"):
        decode_frame({"encoding": "png"}, memoryview(_png(image[:27])), None, 100_000, 14)
    with pytest.raises(ProtocolError, match="is 3528 bytes, got 3"):
        decode_frame({"encoding": "raw", "shape": [28, 42, 3]}, memoryview(b"abc"), None, 10_000, 14)


def test_preprocessing_on_the_server_is_the_runs():
    from mapstream.io.images import preprocess_image

    image = frames(1, 1, hw=(60, 80))[0]
    got = decode_frame({"encoding": "png"}, memoryview(_png(image)), ("crop", 42), 10_000, 14)
    expected = preprocess_image(Image.fromarray(image), "crop", 42, 14)
    assert np.array_equal(got, (expected.permute(1, 2, 0) * 255).round().byte().numpy())


def test_frame_headers_are_checked():
    assert check_frame_message({"frame": 4, "encoding": "png", "keyframe": True, "name": "a"}, 3) == 4
    for header, last, words in [
        ({"frame": 3, "encoding": "png"}, 3, "increase"), ({"frame": "1", "encoding": "png"}, None, "integer"),
        ({"frame": 1, "encoding": "png", "keyframe": "yes"}, None, "keyframe"),
        ({"frame": 1, "encoding": "png", "colour": 1}, None, "unknown"),
        ({"frame": 1, "encoding": "png", "name": "x" * 300}, None, "name"),
    ]:
        with pytest.raises(ProtocolError, match=words) as err:
            check_frame_message(header, last)
        assert err.value.frame == (header["frame"] if isinstance(header["frame"], int) else None)  # named when known


def test_an_open_message_chooses_within_the_servers_bounds():
    server = StreamConfig(sliding_window=16)
    options = parse_open({"type": "open", "version": 1, "settings": {"num_scale_frames": 2, "sliding_window": 8},
                          "outputs": {"depth": True, "dtype": "float32"}}, server, 14, max_pixels=MAX_PIXELS)
    assert options.stream.num_scale_frames == 2 and options.stream.sliding_window == 8
    assert options.outputs.depth and options.outputs.dtype == "float32" and not options.outputs.points
    assert options.preprocess is None  # frames used as sent
    # A preprocess without a width takes the served model's own (518 unless its weights record another).
    shaped = {"type": "open", "version": 1, "preprocess": {"mode": "pad"}}
    assert parse_open(shaped, server, 14, max_pixels=MAX_PIXELS).preprocess == ("pad", 518)
    assert parse_open(shaped, server, 14, image_size=294, max_pixels=MAX_PIXELS).preprocess == ("pad", 294)
    shaped["preprocess"]["image_size"] = 140
    assert parse_open(shaped, server, 14, image_size=294, max_pixels=MAX_PIXELS).preprocess == ("pad", 140)
    for message, words in [
        ({"type": "open", "version": 2}, "version 1"),
        ({"type": "open", "version": 1, "settings": {"sliding_window": 32}}, "at most the server's 16"),
        ({"type": "open", "version": 1, "settings": {"trajectory_capacity": None}}, "at most the server's"),
        ({"type": "open", "version": 1, "settings": {"precision": "fp16"}}, "cannot be chosen by a client"),
        ({"type": "open", "version": 1, "settings": {"num_scale_frames": 0}}, "num_scale_frames"),
        ({"type": "open", "version": 1, "preprocess": {"mode": "crop", "image_size": 50}}, "multiple of"),
        ({"type": "open", "version": 1, "outputs": {"stride": 0}}, "stride"),
        ({"type": "hello"}, "opens the session"),
    ]:
        with pytest.raises(ProtocolError, match=words):
            parse_open(message, server, 14, max_pixels=MAX_PIXELS)


def test_the_rate_limit_lets_one_seconds_burst_through_then_the_rate():
    now = [0.0]
    limit = RateLimit(4.0, clock=lambda: now[0])
    assert [limit.allow() for _ in range(6)] == [True] * 4 + [False] * 2
    now[0] = 0.5  # two frames' worth
    assert [limit.allow() for _ in range(3)] == [True, True, False]


def _frame(i: int, keyframe=None) -> QueuedFrame:
    return QueuedFrame(i, np.zeros((14, 14, 3), np.uint8), keyframe, None, 0.0)


def test_a_full_queue_drops_its_oldest_frame_not_marked_as_keyframe():
    stream = ServedStream("s", session=None, options=None, queue_size=3, limit=RateLimit(1.0))
    dropped = [stream.offer(_frame(i, keyframe=True if i in (0, 3) else None)) for i in range(7)]
    assert [d.frame_id if d else None for d in dropped] == [None, None, None, 1, 2, 4, 5]
    assert [f.frame_id for f in stream.queue] == [0, 3, 6]
    stream = ServedStream("s", session=None, options=None, queue_size=2, limit=RateLimit(1.0))
    assert [stream.offer(_frame(i, keyframe=True)) for i in range(2)] == [None, None]
    assert stream.offer(_frame(2)).frame_id == 2  # all queued are keyframes: the new one goes


def test_a_server_without_a_token_is_refused_unless_it_is_loopback_and_said_so(tmp_path):
    with pytest.raises(ValueError, match="a token is required"):
        resolve_token(ServeConfig(host="0.0.0.0", no_auth=True), {})
    with pytest.raises(ValueError, match="no_auth to serve on 127.0.0.1"):
        resolve_token(ServeConfig(), {})
    assert resolve_token(ServeConfig(no_auth=True), {}) is None
    assert resolve_token(ServeConfig(host="0.0.0.0"), {"MAPSTREAM_TOKEN": TOKEN}) == TOKEN
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert resolve_token(ServeConfig(host="::", token_file=tmp_path / "token"), {}) == TOKEN
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token(ServeConfig(), {"MAPSTREAM_TOKEN": "short"})
    with pytest.raises(ValueError, match="one or the other"):
        resolve_token(ServeConfig(no_auth=True), {"MAPSTREAM_TOKEN": TOKEN})
    with pytest.raises(ValueError, match="cannot read token_file"):
        resolve_token(ServeConfig(token_file=tmp_path / "missing"), {})
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        ServeConfig(max_batch=0)
