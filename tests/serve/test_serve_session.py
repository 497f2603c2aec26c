"""A session's life on the server: the queue's policy when the model is busy, the rate limit,
scene cuts, idle sessions, vanished clients and a graceful shutdown, each with exact outcomes."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from mapstream.client import Client, Result, ServiceError
from mapstream.session import SessionClosedError

from serve_helpers import (
    as_tensor, assert_exact, events, frames, model_thread_held, only_session, results, send_sequences, serving, solo,
    tiny_model, wait_until,
)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def test_a_busy_model_drops_the_oldest_unmarked_frames_and_serves_the_rest_exactly(model):
    images = frames(7, 10)
    with serving(model, queue_size=4, max_batch=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2}, depth=True, dtype="float32")
        with model_thread_held(running):
            sent = [session.send(images[0], wait=False)]
            wait_until(lambda: only_session(running).waiting)  # frame 0 is on the (held) model thread
            sent += [session.send(image, keyframe=True if i == 2 else None, wait=False)
                     for i, image in enumerate(images[1:], 1)]
            dropped = []
            while len(dropped) < 5:
                answer = session.receive(30)
                assert answer.type == "dropped" and answer.data["reason"] == "queue full"
                dropped.append(answer.frame)
            assert [f.frame_id for f in only_session(running).queue] == [2, 7, 8, 9]
        answers = session.close()
    assert sent == list(range(10)) and dropped == [1, 3, 4, 5, 6]  # frame 2 was marked as a keyframe
    kept = [0, 2, 7, 8, 9]
    got = results(answers)
    assert [r.frame for r in got] == kept
    for result, pred in zip(got, solo(model, [images[i] for i in kept], num_scale_frames=2), strict=True):
        assert_exact(result, pred)  # the kept frames are the session's sequence, as if sent alone


def test_frames_beyond_the_rate_are_refused_by_name(model):
    with serving(model, max_fps=2.0) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        sent = [session.send(image, wait=False) for image in frames(8, 10)]
        answers = session.close()
    refused = [a.frame for a in events(answers, "error") if a.data["code"] == "rate_limited"]
    assert refused == sent[2:]  # a burst of one second's worth (2 frames) went through
    assert [r.frame for r in results(answers)] == sent[:2]


def test_a_reset_starts_a_new_sequence_of_another_size_exactly_as_locally(model):
    first, second = frames(9, 5), frames(10, 4, hw=(42, 28))
    with serving(model, max_batch=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 3}, depth=True, dtype="float32")
        answers = send_sequences(session, first, second)
    kinds = [a.type if not isinstance(a, Result) else "result" for a in answers]
    assert kinds.count("reset") == 1 and kinds[-1] == "closed"
    got = results(answers)
    assert [(r.sequence, r.index) for r in got] == [(0, i) for i in range(5)] + [(1, i) for i in range(4)]
    expected = solo(model, first, num_scale_frames=3) + solo(model, second, num_scale_frames=3)
    for result, pred in zip(got, expected, strict=True):
        assert_exact(result, pred)


def test_a_short_sequence_is_flushed_when_the_client_closes(model):
    images = frames(11, 2)
    with serving(model, max_batch=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 4})
        for image in images:
            session.send(image)
        answers = session.close()
    assert [a.type for a in answers if not isinstance(a, Result)] == ["buffered", "buffered", "closed"]
    got = results(answers)
    for result, pred in zip(got, solo(model, images, num_scale_frames=4), strict=True):
        assert_exact(result, pred)


def test_an_idle_session_ends_and_frees_its_cache(model):
    with serving(model, idle_timeout=0.3) as running:
        session = Client(running.url).open_session()
        served = only_session(running)
        answer = session.receive(10)
        assert answer.type == "error" and answer.data["code"] == "idle_timeout" and answer.fatal
        with pytest.raises(ServiceError, match="connection closed"):
            session.receive(10)
        wait_until(lambda: served.released and not running.server.streams)
        with pytest.raises(SessionClosedError):
            served.session.step(as_tensor(frames(0, 1)[0]))


def test_a_client_that_vanishes_mid_stream_has_its_session_freed(model):
    with serving(model) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2})
        served = only_session(running)
        with model_thread_held(running):  # its frames are still queued when it goes
            for image in frames(12, 5):
                session.send(image, wait=False)
            wait_until(lambda: only_session(running).queued_frames == 4)  # and one on the model thread
            session._ws.socket.shutdown(socket.SHUT_RDWR)
            session._ws.socket.close()
            wait_until(lambda: not running.server.streams)  # ended while its step is still to run
            assert not served.released  # freed after that step, on the model thread
        wait_until(lambda: served.released)
        with pytest.raises(SessionClosedError):
            served.session.step(as_tensor(frames(0, 1)[0]))
        again = Client(running.url).open_session()  # the server goes on
        again.close()


def test_shutdown_answers_the_frames_taken_refuses_later_ones_and_closes(model):
    images = frames(13, 5)
    with serving(model, max_batch=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 2}, depth=True, dtype="float32")
        stopper = threading.Thread(target=running.stop, args=(30,))
        with model_thread_held(running):
            for image in images:
                session.send(image, wait=False)
            wait_until(lambda: running.server.streams and only_session(running).queued_frames == 4)
            stopper.start()
            wait_until(lambda: running.server._draining)
            late = session.send(frames(14, 1)[0], wait=False)
            refusal = session.receive(10)
        answers = list(session.answers(30))
        stopper.join(30)
        assert not stopper.is_alive()
    assert refusal.type == "error" and refusal.data["code"] == "shutting_down" and refusal.frame == late
    assert answers[-1].type == "error" and answers[-1].data["code"] == "shutting_down" and answers[-1].fatal
    got = results(answers)
    assert [r.frame for r in got] == [0, 1, 2, 3, 4], answers
    for result, pred in zip(got, solo(model, images, num_scale_frames=2), strict=True):
        assert_exact(result, pred)
    assert session._ws.close_code == 1001
    with pytest.raises(OSError):
        Client(running.url, open_timeout=5).open_session()
    assert np.isfinite(got[-1].T_world_cam).all()


def test_points_and_strided_arrays_are_the_predictions(model):
    from mapstream.geometry import unproject_depth

    images = frames(15, 3)
    expected = solo(model, images, num_scale_frames=1)
    threshold = float(expected[0].depth_conf.median())
    with serving(model, max_batch=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1}, depth=True, confidence=True,
                                                    points=True, dtype="float32", stride=2, conf_threshold=threshold)
        for image in images:
            session.send(image)
        got = results(session.close())
    for result, pred, image in zip(got, expected, images, strict=True):
        assert np.array_equal(result.depth, pred.depth.numpy()[::2, ::2])
        assert np.array_equal(result.confidence, pred.depth_conf.numpy()[::2, ::2])
        world = unproject_depth(pred.depth, pred.K, pred.T_world_cam).numpy()[::2, ::2]
        keep = pred.depth_conf.numpy()[::2, ::2] > threshold
        assert 0 < keep.sum() < keep.size  # the threshold chooses
        assert np.array_equal(result.arrays["points"], world[keep])
        assert np.array_equal(result.arrays["colors"], image[::2, ::2][keep])


def test_a_client_that_never_opens_is_told_and_let_go(model):
    from websockets.sync.client import connect

    with serving(model, idle_timeout=0.3) as running:
        with connect(running.url, proxy=None) as ws:
            answer = ws.recv(10)
            assert '"code":"idle_timeout"' in answer and '"fatal":true' in answer
        with connect(running.url, proxy=None) as ws:
            ws.send('{"type": "open", "version": 1, "settings": {"backend": "sdpa"}}')
            answer = ws.recv(10)
            assert '"code":"bad_open"' in answer and "cannot be chosen by a client" in answer
        assert not running.server.streams

