"""Every bad message gets its error code, and the server's log gets no traceback: not from a
JSON nested thirty thousand deep, nor from requests that are no WebSocket handshake at all
(a POST, a plain GET, bytes that are not HTTP), which anyone who reaches the port can send."""
from __future__ import annotations

import contextlib
import http.client
import logging
import socket

import pytest

from mapstream.client import Client

from serve_helpers import frames, results, serving, tiny_model, wait_until

NESTED = "[" * 30_000


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _tracebacks(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_a_deeply_nested_message_is_told_by_its_code_and_the_session_goes_on(model, caplog):
    from websockets.sync.client import connect

    caplog.set_level(logging.INFO)
    image = frames(50, 1)[0]
    with serving(model) as running:
        with connect(running.url, proxy=None) as ws:  # as the first message: the open is refused
            ws.send(NESTED)
            answer = ws.recv(10)
            assert '"code":"bad_open"' in answer and "nested too deeply" in answer and '"fatal":true' in answer
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        session._ws.send(NESTED)  # a control
        session._ws.send(b"MSF1" + len(NESTED).to_bytes(4, "big") + NESTED.encode())  # a frame's header
        for _ in range(2):
            answer = session.receive(30)
            assert answer.type == "error" and answer.data["code"] == "bad_message" and not answer.fatal
            assert "nested too deeply" in answer.data["message"]
        session.send(image)
        assert [r.index for r in results(session.close())] == [0]
        wait_until(lambda: not running.server.streams)
    assert not _tracebacks(caplog)


def _request(port: int, method: str, body: bytes | None = None) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, "/", body=body)
        return connection.getresponse().status
    except (ConnectionError, http.client.RemoteDisconnected):
        return None  # refused without an answer
    finally:
        connection.close()


def test_requests_that_are_no_handshake_leave_one_line_in_the_log_and_no_traceback(model, caplog):
    caplog.set_level(logging.INFO)
    with serving(model) as running:
        port = running.server.port
        assert _request(port, "POST", b'{"type": "open"}') is None
        assert _request(port, "PUT", b"x") is None
        assert _request(port, "GET") == 426  # "Upgrade Required": a plain GET of /
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # not HTTP
            raw.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64) + b"\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):  # closed unanswered, however the socket tells it
                assert raw.recv(100) == b""
        with socket.create_connection(("127.0.0.1", port), timeout=10):  # gone before its request
            pass
        with Client(running.url).open_session() as session:  # the server serves on
            assert session.info["version"] == 1
        wait_until(lambda: sum("no WebSocket handshake" in r.getMessage() for r in caplog.records) >= 5)
    assert not _tracebacks(caplog)
    refused = [r.getMessage() for r in caplog.records if "no WebSocket handshake" in r.getMessage()]
    assert any("unsupported HTTP method; expected GET; got POST" in line for line in refused), refused
    assert all(line.startswith("refused a request from 127.0.0.1:") for line in refused), refused
