"""What the service tests share: the tiny model, deterministic frames, a server on an
ephemeral loopback port, the model thread or a client's answers held still, and solo runs to
compare with."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import numpy as np
import torch

import mapstream
from mapstream.client import Event, Result
from mapstream.serve import BackgroundServer, ServeConfig, Server

TOKEN = "a-test-token-of-enough-length-0123"
HW = (28, 42)


def tiny_model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def frames(seed: int, count: int, hw: tuple[int, int] = HW) -> list[np.ndarray]:
    """``count`` [H, W, 3] uint8 frames of smooth random images (seeded)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (hw[0] // 7 + 1, hw[1] // 7 + 1, 3)).astype(np.float64)
    out = []
    for i in range(count):
        coarse = np.roll(base, i, axis=1) * 0.8 + rng.integers(0, 50, base.shape)
        image = np.kron(coarse, np.ones((7, 7, 1)))[: hw[0], : hw[1]]
        out.append(np.clip(image, 0, 255).astype(np.uint8))
    return out


def as_tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(image).permute(2, 0, 1).float().div(255)


def solo(model, images: list[np.ndarray], *, resets: tuple[int, ...] = (), **settings) -> list:
    """The predictions of a local session stepping ``images`` alone (flushed and reset before
    each index in ``resets``, flushed at the end), in order."""
    preds = []
    with model.session(**settings) as session:
        for i, image in enumerate(images):
            if i in resets:
                preds += session.flush()
                session.reset()
            preds += session.step(as_tensor(image))
        preds += session.flush()
    return preds


def send_sequences(session, *sequences) -> list:
    """Send each sequence's frames, a reset between sequences; the answers once closed."""
    for k, images in enumerate(sequences):
        if k:
            session.reset()
        for image in images:
            session.send(image)
    return session.close()


def results(answers) -> list[Result]:
    return [a for a in answers if isinstance(a, Result) and not a.provisional]


def events(answers, kind: str) -> list[Event]:
    return [a for a in answers if isinstance(a, Event) and a.type == kind]


def assert_exact(result: Result, pred) -> None:
    """A result carries exactly the local prediction: camera and (float32) depth, bit for bit."""
    assert result.index == pred.index
    assert np.array_equal(result.T_world_cam[:3], pred.T_world_cam.numpy())
    assert np.array_equal(result.K, pred.K.numpy())
    assert np.array_equal(result.pose_enc, pred.pose_enc.numpy())
    if result.depth is not None:
        assert result.depth.dtype == np.float32
        assert np.array_equal(result.depth, pred.depth.numpy())


def serving(model, **config) -> BackgroundServer:
    """A started server of ``model`` on 127.0.0.1, any free port; ``config``: ServeConfig fields
    (default: no token, a high frame rate, a short shutdown), and the Server's model_desc,
    warnings and map_config."""
    settings = {"host": "127.0.0.1", "port": 0, "no_auth": "token_file" not in config, "max_fps": 10_000.0,
                "shutdown_timeout": 10.0, **config}
    stream = settings.pop("stream", None)
    described = {k: settings.pop(k) for k in ("model_desc", "warnings", "map_config") if k in settings}
    return BackgroundServer(Server(model, ServeConfig(**settings), stream, environ={}, **described)).start()


def only_session(running: BackgroundServer):
    """The server's one open session (``ServedStream``), once it is registered."""
    wait_until(lambda: len(running.server.streams) == 1)
    return next(iter(running.server.streams.values()))


@contextlib.contextmanager
def model_thread_held(running: BackgroundServer):
    """The server's model thread kept busy until the block ends: queued frames stay queued,
    so what the queue does with more is exact."""
    release, holding = threading.Event(), threading.Event()

    def hold():
        holding.set()
        release.wait(60)

    future = running.server.worker.executor.submit(hold)
    holding.wait(10)
    try:
        yield
    finally:
        release.set()
        future.result(10)


@contextlib.contextmanager
def sends_held(running: BackgroundServer, stream):
    """The server's writes to one session's client held until the block ends, as when the
    client reads nothing and its TCP window is full: its answers pile up in the session's
    outbox."""
    async def hold() -> asyncio.Event:
        released, send = asyncio.Event(), stream.connection.send

        async def held_send(*args, **kwargs):
            await released.wait()
            return await send(*args, **kwargs)

        stream.connection.send = held_send
        return released

    released = running.call(hold(), 10)
    try:
        yield
    finally:
        running.loop.call_soon_threadsafe(released.set)


def wait_until(condition, timeout: float = 10.0) -> None:
    """Wait (bounded) for ``condition()``, e.g. the server's bookkeeping after a connection ends."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
