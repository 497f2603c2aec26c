"""Many clients at once: every frame of every client answered, in order, none lost; frames of
different sessions stepped in shared batches whose results agree with solo runs to rounding;
every session freed at the end. The issue's acceptance at full length (slow): 16 clients of 500
frames each, none lost, the server's memory flat while they stream."""
from __future__ import annotations

import functools
import gc
import os
import threading
import weakref

import numpy as np
import pytest

from mapstream.client import Client, Result

from serve_helpers import frames, results, serving, solo, tiny_model, wait_until

SETTINGS = {"num_scale_frames": 2, "sliding_window": 8}


def _client(url, images, opened, out, key, keep, pauses):
    """One client: open, wait for the others (``opened``), stream ``images``, close. Keeps
    ``keep(answer)`` of each answer in ``out[key]``; after its i-th frame it waits at
    ``pauses[i]`` (a barrier of every client) when there is one."""
    session = Client(url).open_session(settings=SETTINGS, depth=True, dtype="float32")
    opened.wait(60)
    answers = []
    for i, image in enumerate(images, 1):
        session.send(image)
        answers += map(keep, session.poll())
        if i in pauses:
            pauses[i].wait(300)
    out[key] = answers + [keep(a) for a in session.close()]


def _round(running, clients: int, count: int, seed: int, hw=(28, 42), keep=lambda answer: answer, pauses=None):
    """``clients`` clients streaming ``count`` frames each at once; their inputs, what they
    kept of their answers, and weak references to their sessions on the server."""
    inputs = {k: frames(seed + k, count, hw) for k in range(clients)}
    out, opened = {}, threading.Barrier(clients + 1)
    threads = [threading.Thread(target=_client, args=(running.url, inputs[k], opened, out, k, keep, pauses or {}))
               for k in range(clients)]
    for thread in threads:
        thread.start()
    opened.wait(60)  # every session is open now
    sessions = [weakref.ref(s.session) for s in running.server.streams.values()]
    for thread in threads:
        thread.join(600)
    assert not any(t.is_alive() for t in threads)
    return inputs, out, sessions


def _gist(answer) -> tuple[str, int | None, int | None]:
    """What the completeness check reads of an answer: its kind ("result", "provisional" or
    the event's type), its frame id and (results) its sequence index."""
    if isinstance(answer, Result):
        return ("provisional" if answer.provisional else "result", answer.frame, answer.index)
    return (answer.type, answer.frame, None)


def _check_complete(out, clients: int, count: int) -> None:
    """Every client got a final result for each of its ``count`` frames, in order, nothing
    dropped, no error, and its session closed; ``out``: each client's answers as `_gist`s."""
    assert sorted(out) == list(range(clients))
    for gists in out.values():
        finals = [(frame, index) for kind, frame, index in gists if kind == "result"]
        assert finals == [(i, i) for i in range(count)]  # none lost, in order
        assert not [g for g in gists if g[0] in ("dropped", "error")]
        assert gists[-1][0] == "closed"


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
        _check_complete({k: [_gist(a) for a in answers] for k, answers in out.items()}, 16, 40)
        rounds, stepped = _batched_frames(running)
        assert stepped == 16 * 40 and stepped / rounds > 2  # frames of several sessions per forward
        _check_freed(running, sessions)
    for k in (0, 7, 15):  # batched results equal solo ones to the rounding of batched products
        for result, pred in zip(results(out[k]), solo(model, inputs[k], **SETTINGS), strict=True):
            assert isinstance(result, Result) and result.index == pred.index
            np.testing.assert_allclose(result.T_world_cam[:3], pred.T_world_cam.numpy(), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(result.depth, pred.depth.numpy(), atol=1e-5, rtol=1e-4)


def _rss() -> int:
    """Resident bytes of this process, where the server runs (in a thread) beside its clients."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cache_bytes(running) -> int:
    """Bytes held by the caches of the server's open sessions (read on the model thread,
    between steps)."""
    def held() -> int:
        total = 0
        for stream in running.server.streams.values():
            stats = stream.session.stats()
            total += sum(c.bytes_held for c in (stats["aggregator"], stats["camera"]) if c is not None)
        return total
    return running.server.worker.executor.submit(held).result(60)


# The memory check of the long round. From frame 100 to frame 500 of each client the server
# steps 16 * 400 = 6400 frames of 28x42 pixels. Keeping anything per frame costs at least:
# the decoded frame, 28 * 42 * 3 = 3.5 KB (22 MB in all), or its float32 depth map,
# 28 * 42 * 4 = 4.6 KB (30 MB in all), or a whole answer, more. The process's resident memory
# may grow by 10 MiB at most: keeping half a decoded frame or a third of a depth map per frame
# exceeds that, while the process (the allocators' pools warm after 100 frames, the clients
# keeping only a gist per answer) grows by a few MB at most. The caches are leased at their
# full size (window and trajectory capacity) when a sequence's first frame comes: their bytes
# do not change at all.
FRAMES, MIDWAY, RSS_GROWTH_BOUND = 500, 100, 10 * 2**20


@pytest.mark.slow
def test_sixteen_clients_of_500_frames_lose_no_frame_and_keep_the_servers_memory_flat():
    with serving(tiny_model(), max_batch=16, max_sessions=16) as running:
        samples = {}

        def sample(at: int) -> None:  # run by the last client to reach frame ``at``; the others wait
            gc.collect()
            samples[at] = (_rss(), _cache_bytes(running))

        pauses = {at: threading.Barrier(16, action=functools.partial(sample, at)) for at in (MIDWAY, FRAMES)}
        _, out, sessions = _round(running, 16, FRAMES, seed=2000, keep=_gist, pauses=pauses)
        _check_complete(out, 16, FRAMES)
        _check_freed(running, sessions)
    (rss_mid, cache_mid), (rss_end, cache_end) = samples[MIDWAY], samples[FRAMES]
    assert cache_mid > 0 and cache_end == cache_mid, (cache_mid, cache_end)
    assert rss_end - rss_mid < RSS_GROWTH_BOUND, f"resident memory {rss_mid / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB"
