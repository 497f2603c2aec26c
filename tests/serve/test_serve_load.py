"""Many clients at once: every frame of every client answered, in order, none lost; frames of
different sessions stepped in shared batches whose results agree with solo runs to rounding;
every session freed at the end. The heavier variant (slow) also holds the server's resident
memory flat from one round of clients to the next."""
from __future__ import annotations

import gc
import os
import threading
import weakref

import numpy as np
import pytest

from mapstream.client import Client, Result

from serve_helpers import events, frames, results, serving, solo, tiny_model, wait_until

SETTINGS = {"num_scale_frames": 2, "sliding_window": 8}


def _client(url, images, barrier, out, key):
    session = Client(url).open_session(settings=SETTINGS, depth=True, dtype="float32")
    barrier.wait(60)
    answers = []
    for image in images:
        session.send(image)
        answers += session.poll()
    out[key] = answers + session.close()


def _round(running, clients: int, count: int, seed: int, hw=(28, 42)):
    """``clients`` clients streaming ``count`` frames each at once; their answers and inputs,
    and weak references to their sessions on the server."""
    inputs = {k: frames(seed + k, count, hw) for k in range(clients)}
    out, opened = {}, threading.Barrier(clients + 1)
    threads = [threading.Thread(target=_client, args=(running.url, inputs[k], opened, out, k)) for k in range(clients)]
    for thread in threads:
        thread.start()
    opened.wait(60)  # every session is open now
    sessions = [weakref.ref(s.session) for s in running.server.streams.values()]
    for thread in threads:
        thread.join(300)
    assert not any(t.is_alive() for t in threads)
    return inputs, out, sessions


def _check_complete(out, clients: int, count: int) -> None:
    assert sorted(out) == list(range(clients))
    for answers in out.values():
        got = results(answers)
        assert [(r.frame, r.index) for r in got] == [(i, i) for i in range(count)]  # none lost, in order
        assert not events(answers, "dropped") and not events(answers, "error")
        assert answers[-1].type == "closed"


def _check_freed(running, sessions) -> None:
    """No session (nor its cache) is kept once its connection has ended and been cleaned up."""
    assert sessions
    wait_until(lambda: not running.server.streams and gc.collect() >= 0 and all(ref() is None for ref in sessions))


def _batched_frames(running) -> tuple[float, float]:
    metric = running.server.metrics.batch
    count = sum(s.value for s in metric.collect()[0].samples if s.name.endswith("_count"))
    total = sum(s.value for s in metric.collect()[0].samples if s.name.endswith("_sum"))
    return count, total


def test_sixteen_clients_lose_no_frame_share_batches_and_are_freed():
    model = tiny_model()
    with serving(model, max_batch=16, queue_size=8, max_sessions=16) as running:
        inputs, out, sessions = _round(running, 16, 40, seed=100)
        _check_complete(out, 16, 40)
        rounds, stepped = _batched_frames(running)
        assert stepped == 16 * 40 and stepped / rounds > 2  # frames of several sessions per forward
        _check_freed(running, sessions)
    for k in (0, 7, 15):  # batched results equal solo ones to the rounding of batched products
        for result, pred in zip(results(out[k]), solo(model, inputs[k], **SETTINGS), strict=True):
            assert isinstance(result, Result) and result.index == pred.index
            np.testing.assert_allclose(result.T_world_cam[:3], pred.T_world_cam.numpy(), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(result.depth, pred.depth.numpy(), atol=1e-5, rtol=1e-4)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_rounds_of_clients_keep_the_servers_memory_flat():
    model = tiny_model()
    with serving(model, max_batch=16, max_sessions=16) as running:
        growth = []
        for r in range(3):
            before = _rss()
            inputs, out, sessions = _round(running, 16, 150, seed=1000 * r, hw=(56, 84))
            _check_complete(out, 16, 150)
            _check_freed(running, sessions)
            del inputs, out
            gc.collect()
            growth.append(_rss() - before)
    # The first round grows the allocators' pools; later rounds reuse them.
    assert max(growth[1:]) < 64 * 2**20, growth
