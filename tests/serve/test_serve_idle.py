"""A session never stalls and never holds its place for ever: one whose client fell behind
(its answers piled up, so its frames and its close wait queued) is served to the end once the
client reads again; one whose client stops reading ends within two idle timeouts; and one
whose frame is on the model is not taken for idle, however long the model takes."""
from __future__ import annotations

import asyncio
import time

import pytest

from mapstream.client import Client, Result, ServiceError

from serve_helpers import frames, model_thread_held, only_session, sends_held, serving, tiny_model, wait_until


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _worker_settled(running) -> None:
    """Wait until the worker has finished its round in progress and looked for the next: the
    model thread runs its work in order, and the event loop then runs the worker's resumption
    before this later call."""
    running.server.worker.executor.submit(lambda: None).result(30)
    running.call(asyncio.sleep(0), 10)


def test_a_client_that_fell_behind_is_answered_to_the_end_once_it_reads_again(model):
    with serving(model, queue_size=2, idle_timeout=60.0) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        stream = only_session(running)
        with sends_held(running, stream):  # the client reads nothing meanwhile
            sent = [session.send(image, wait=False) for image in frames(60, 12)]
            session._ws.send('{"type": "close"}')
            # Its answers piled up: the worker leaves the rest queued, its close last.
            wait_until(lambda: stream.ending == "close" and stream.congested() and stream.queue)
            _worker_settled(running)
            assert stream.queue
        answers = list(session.answers(timeout=20))  # no other client wakes the worker
    settled = [a.frame for a in answers if isinstance(a, Result) or a.type == "dropped"]
    assert sorted(settled) == sent and answers[-1].type == "closed"


def test_a_client_that_stops_reading_has_its_session_ended_and_its_place_freed(model):
    with serving(model, queue_size=2, idle_timeout=1.0, max_sessions=1) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        stream = only_session(running)
        with sends_held(running, stream):  # for good: the client never reads again
            for image in frames(61, 8):
                session.send(image, wait=False)
            wait_until(lambda: stream.congested() and stream.queue)
            wait_until(lambda: not running.server.streams and stream.released, timeout=20)
        assert stream.ending == "idle"
        with pytest.raises(ServiceError, match="connection closed"):
            for _ in range(100):  # what arrived before the connection was dropped, then its end
                session.receive(10)
        Client(running.url).open_session().close()  # its place is free


def test_a_session_whose_frame_is_on_the_model_is_not_taken_for_idle(model):
    with serving(model, idle_timeout=0.3) as running:
        session = Client(running.url).open_session(settings={"num_scale_frames": 1})
        stream = only_session(running)
        with model_thread_held(running):
            sent = session.send(frames(62, 1)[0], wait=False)
            wait_until(lambda: stream.waiting)  # taken: on the (held) model thread
            time.sleep(1.5)  # five idle timeouts, twenty rounds of the idle check
        answer = session.receive(10)
        assert isinstance(answer, Result) and answer.frame == sent
        answer = session.receive(10)  # and once idle after it, the session ends
        assert answer.type == "error" and answer.data["code"] == "idle_timeout" and answer.fatal
