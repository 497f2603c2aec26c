"""One client streams while others misbehave on the same server: each misbehaving client gets
a clear answer, and the streaming client's results stay bit-identical to its solo run.

The server steps each session alone here (``max_batch=1``), which makes its results exactly
those of a local `Session.step` on the same frames: any influence of one session on another
(a shared cache, frames crossing sessions, a failed step) shows as a changed bit. Batched
steps agree with solo steps to rounding only; test_serve_load checks them to a tolerance.
"""
from __future__ import annotations

import io
import socket
import threading

import numpy as np
import pytest
from PIL import Image

from mapstream.client import Client, Result, ServiceError
from mapstream.serve.protocol import pack

from serve_helpers import TOKEN, assert_exact, events, frames, results, serving, solo, tiny_model, wait_until

SETTINGS = {"num_scale_frames": 3}


def _jpeg(image) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG")
    return buffer.getvalue()


def _unauthenticated(url):
    with pytest.raises(ServiceError, match="HTTP 401"):
        Client(url).open_session()
    with pytest.raises(ServiceError, match="HTTP 401"):
        Client(url, token="wrong-" + TOKEN).open_session()
    with pytest.raises(ServiceError, match="HTTP 403"):
        Client(url, token=TOKEN, origin="https://attacker.example").open_session()
    return "refused"


def _oversized_frame(url):
    session = Client(url, token=TOKEN).open_session(settings={"num_scale_frames": 1})
    big = np.full((700, 700, 3), 128, np.uint8)  # 490 000 pixels > 100 000, in a small JPEG
    first = session.send(big, encoding="jpeg")
    answer = session.receive(30)
    assert answer.type == "error" and answer.data["code"] == "frame_too_large" and answer.frame == first
    assert "at most 100000" in answer.data["message"] and not answer.fatal
    session.send(frames(1, 1)[0])  # the session goes on
    assert [r.index for r in results(session.close())] == [0]
    return "told"


def _corrupt_jpeg(url):
    session = Client(url, token=TOKEN).open_session(settings={"num_scale_frames": 1})
    jpeg = _jpeg(frames(2, 1, hw=(140, 140))[0])
    bad = session.send(jpeg[: len(jpeg) // 2])
    answer = session.receive(30)
    assert answer.type == "error" and answer.data["code"] == "bad_frame" and answer.frame == bad
    assert "corrupt or truncated" in answer.data["message"]
    session._ws.send('{"type": "dance"}')  # and an unknown control
    answer = session.receive(30)
    assert answer.type == "error" and answer.data["code"] == "bad_message" and not answer.fatal
    session.send(frames(2, 1)[0])
    assert [r.index for r in results(session.close())] == [0]
    return "told"


def _oversized_message(url):
    session = Client(url, token=TOKEN).open_session()
    session._ws.send(pack({"frame": 0, "encoding": "raw", "shape": [14, 14, 3]}, bytes(300_000)))
    with pytest.raises(ServiceError) as err:
        session.receive(30)
    assert err.value.code == "connection_closed" and "1009" in str(err.value)  # message too big
    return "closed"


def _flood(url):
    session = Client(url, token=TOKEN).open_session(settings={"num_scale_frames": 2})
    sent = [session.send(image, wait=False) for image in frames(4, 60)]
    answers = session.close()
    settled = {}  # frame -> the first answer naming it
    for answer in answers:
        if answer.frame is not None:
            settled.setdefault(answer.frame, answer.type if not isinstance(answer, Result) else "result")
    assert sorted(settled) == sent  # every frame answered
    refused = [f for f, kind in settled.items() if kind == "error"]
    assert len(refused) >= 60 - 21  # the rate: about one second's burst of 20 frames is let through
    assert all(a.data["code"] == "rate_limited" for a in events(answers, "error"))
    return "limited"


def _vanish(url):
    session = Client(url, token=TOKEN).open_session(settings={"num_scale_frames": 2})
    for image in frames(5, 6):
        session.send(image, wait=False)
    session._ws.socket.shutdown(socket.SHUT_RDWR)  # gone mid-stream, without a close frame
    session._ws.socket.close()
    return "vanished"


def test_misbehaving_clients_are_told_and_leave_another_session_bit_identical(tmp_path):
    model = tiny_model()
    images = frames(0, 16)
    expected = solo(model, images, **SETTINGS)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    running = serving(model, token_file=token_file, max_batch=1, max_frame_pixels=100_000,
                      max_message_bytes=200_000, max_fps=20.0, queue_size=4)
    try:
        outcomes, failures = {}, []

        def disturb(name, fn):
            try:
                outcomes[name] = fn(running.url)
            except BaseException as err:  # noqa: BLE001 - reported by the test below
                failures.append((name, err))

        threads = [threading.Thread(target=disturb, args=(fn.__name__, fn)) for fn in
                   (_unauthenticated, _oversized_frame, _corrupt_jpeg, _oversized_message, _flood, _vanish)]
        session = Client(running.url, token=TOKEN).open_session(settings=SETTINGS, depth=True, dtype="float32")
        for thread in threads:
            thread.start()
        answers = []
        for image in images:
            session.send(image)
            answers += session.poll()
        answers += session.close()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        assert outcomes == {"_unauthenticated": "refused", "_oversized_frame": "told", "_corrupt_jpeg": "told",
                            "_oversized_message": "closed", "_flood": "limited", "_vanish": "vanished"}
        got = results(answers)
        assert [r.frame for r in got] == list(range(16))
        for result, pred in zip(got, expected, strict=True):
            assert_exact(result, pred)
        wait_until(lambda: not running.server.streams)  # every session ended, the vanished one too
    finally:
        running.stop()
