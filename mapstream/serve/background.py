"""Running a `Server`: in a thread of its own beside synchronous code (`BackgroundServer`),
or in the foreground until SIGINT or SIGTERM asks it to shut down (`serve_until_signalled`)."""
from __future__ import annotations

import asyncio
import logging
import signal
import threading

from .server import Server

__all__ = ["BackgroundServer", "serve_until_signalled"]

log = logging.getLogger(__name__)


class BackgroundServer:
    """``server`` serving from an event loop in a daemon thread. `start` returns once it
    listens (its errors raised here); `stop` shuts it down gracefully and waits."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        if self._thread is not None:  # started already (e.g. started, then used in a with block)
            return self
        self._thread = threading.Thread(target=self._run, name="mapstream-serve", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"the server did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            try:
                self.loop.run_until_complete(self.server.start())
            except BaseException as err:  # noqa: BLE001 - raised again by start()
                self._error = err
                return
            finally:
                self._started.set()
            self.loop.run_until_complete(self.server.wait_closed())
        finally:
            self.loop.close()

    def call(self, coroutine, timeout: float | None = None):
        """Run ``coroutine`` on the server's loop and return its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self, timeout: float | None = None) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        self.call(self.server.shutdown(), timeout)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


async def serve_until_signalled(server: Server, on_listening=None) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully (a second signal does not
    cut the shutdown short: it has its own timeout). ``on_listening(server)`` is called
    once the server listens."""
    await server.start()
    if on_listening is not None:
        on_listening(server)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: _shutdown_on(server, s))
    try:
        await server.wait_closed()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _shutdown_on(server: Server, sig: signal.Signals) -> None:
    log.info("%s: shutting down", signal.Signals(sig).name)
    asyncio.ensure_future(server.shutdown())
