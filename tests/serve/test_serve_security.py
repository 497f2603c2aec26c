"""Who gets in, over real loopback connections: the token, the Origin header, the session
count, the health and metrics endpoints; and the command's refusal to serve unprotected."""
from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from mapstream.cli.main import main
from mapstream.client import Client, ServiceError

from serve_helpers import TOKEN, frames, results, serving, tiny_model, wait_until


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def guarded(model, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN)
    running = serving(model, token_file=token_file, allow_origin=("http://localhost:9000",), max_sessions=2)
    yield running
    running.stop()


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_connection_without_the_token_or_with_another_is_refused(guarded):
    for token in (None, "x" * len(TOKEN), TOKEN[:-1]):
        with pytest.raises(ServiceError, match="HTTP 401 missing or wrong bearer token") as err:
            Client(guarded.url, token=token).open_session()
        assert err.value.code == "http_401"
    with Client(guarded.url, token=TOKEN).open_session() as session:
        assert len(session.id) >= 20  # unguessable: 128 random bits


def test_a_foreign_web_page_is_refused_and_an_allowed_one_let_in(guarded):
    for origin in ("http://evil.example", "http://localhost:9001", "null"):
        with pytest.raises(ServiceError, match="HTTP 403 connections from web pages of") as err:
            Client(guarded.url, token=TOKEN, origin=origin).open_session()
        assert err.value.code == "http_403"
    with Client(guarded.url, token=TOKEN, origin="http://LOCALHOST:9000").open_session() as session:
        assert session.info["version"] == 1


def test_sessions_beyond_the_limit_are_refused_until_one_ends(guarded):
    client = Client(guarded.url, token=TOKEN)
    first, second = client.open_session(), client.open_session()
    with pytest.raises(ServiceError, match="HTTP 503 the server is full \\(2 sessions\\)"):
        client.open_session()
    first.close()
    # The place is free once the server has let the first session's cache go, which it does on
    # its model thread after the client has its `closed` answer.
    wait_until(lambda: guarded.server._slots < 2)
    third = client.open_session()  # the freed place is taken again
    for session in (second, third):
        session.close()


def test_health_is_public_and_metrics_need_the_token(guarded):
    base = "http" + guarded.url[2:]
    assert _get(base + "/healthz") == (200, "ok\n")
    status, text = _get(base + "/metrics")
    assert status == 401 and "bearer token" in text
    status, text = _get(base + "/metrics", TOKEN)
    assert status == 200 and "mapstream_sessions " in text and "mapstream_frame_latency_seconds_bucket" in text
    assert _get(base + "/elsewhere", TOKEN)[0] == 404


def test_metrics_count_what_happened(model):
    with serving(model) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2})
        for image in frames(3, 5):
            session.send(image)
        assert [r.index for r in results(session.close())] == [0, 1, 2, 3, 4]
        wait_until(lambda: not running.server.streams)
        _, text = _get("http" + running.url[2:] + "/metrics")
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['mapstream_frames_total{outcome="done"}']) == 5
    assert float(lines["mapstream_frame_latency_seconds_count"]) == 5
    assert float(lines["mapstream_sessions_opened_total"]) == 1
    assert float(lines["mapstream_sessions"]) == 0
    assert float(lines["mapstream_batch_frames_sum"]) == 5  # each frame stepped once


def test_the_command_refuses_to_serve_unprotected(capsys, tmp_path):
    assert main(["serve", "--host", "0.0.0.0", "--no-auth", "--model", "tiny"]) == 2
    assert "a token is required" in capsys.readouterr().err
    assert main(["serve", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "--no-auth" in err
    (tmp_path / "t").write_text("short")
    assert main(["serve", "--token-file", str(tmp_path / "t"), "--model", "tiny"]) == 2
    assert "at least 16 characters" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--mode", "windowed", "--overlap", "0"], "an overlap of 0 frames leaves consecutive windows no frame"),
    (["--mode", "windowed", "--keyframe-interval", "auto"], "windowed inference needs a fixed keyframe interval"),
])
def test_the_command_refuses_window_settings_no_window_runs(capsys, flags, message):
    assert main(["serve", "--no-auth", "--model", "tiny", *flags]) == 2
    assert message in capsys.readouterr().err
