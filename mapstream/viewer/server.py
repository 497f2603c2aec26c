"""The viser server both viewers run on: started only where it can listen, talking only to
its own page (:mod:`mapstream.viewer.origin_guard`), and its address.

viser is imported here, when a server starts, never when mapstream is imported.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["Served", "check_listen_host", "check_port", "import_viser", "move_cameras", "server_url", "start_server"]


def check_listen_host(host: str) -> None:
    """Fail fast when no server could listen on ``host`` here: viser 1.1, given an address that
    is not on this machine, tries 1000 ports in turn and then waits forever for a server that
    never started.

    Raises:
        OSError: ``host`` does not resolve, or none of its addresses belongs to this machine.
    """
    try:
        infos = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise OSError(f"cannot listen on {host}: unknown host ({err.strerror})") from err
    reason = "it resolves to no address"
    # Like asyncio's create_server (viser's), one address that binds is enough.
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind(address)  # port 0: a busy port is viser's to skip, not an error here
                return
        except OSError as err:
            reason = err.strerror or str(err)
    raise OSError(f"cannot listen on {host}: address not available on this machine ({reason})")


def import_viser() -> Any:
    try:
        import viser
    except ImportError as err:
        raise RuntimeError("the viewer needs viser: pip install 'mapstream[viewer]'") from err
    return viser


def start_server(host: str, port: int, title: str, allowed_origins: Iterable[str] = ()) -> Any:
    """A running ``viser.ViserServer`` on ``host`` (checked first) and ``port``, or the next
    free port when that one is busy, whose websocket refuses pages other than its own and
    those of ``allowed_origins`` (:class:`~mapstream.viewer.origin_guard.OriginPolicy`).

    Raises:
        OSError: no server can listen on ``host`` here.
        ValueError: an allowed origin is not ``scheme://host[:port]``.
        RuntimeError: viser is not installed, or its websocket cannot be guarded.
    """
    from mapstream.viewer.origin_guard import OriginPolicy, guard_origins

    policy = OriginPolicy(host, allowed_origins)  # checked before anything listens
    viser = import_viser()
    check_listen_host(host)
    server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
    try:
        guard_origins(server, policy)
    except BaseException:
        server.stop()
        raise
    return server


def check_port(port: int) -> int:
    """``port`` when a server may ask for it (0: any free port), else a ValueError."""
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535 (0: any free port), got {port}")
    return port


def move_cameras(server: Any, eye, target, up, *, steps: int = 1, step_s: float = 0.0) -> None:
    """Put every connected browser's camera at ``eye`` (None: where it is) looking at ``target``
    with ``up`` up, each in one update (no frame drawn half-moved). With ``steps`` > 1 each
    camera glides there from where it is (:func:`~mapstream.viewer.scene.glide`), ``step_s``
    seconds a step; a camera whose viewpoint the server does not know yet jumps (or, without an
    ``eye``, stays)."""
    from mapstream.viewer.scene import glide

    paths = []
    for client in server.get_clients().values():
        try:
            start = (client.camera.position, client.camera.look_at, client.camera.up_direction)
        except (AttributeError, AssertionError):  # viser asserts until the browser has sent its camera
            start = None
        if start is None and eye is None:
            continue
        end = (start[0] if eye is None else eye, target, up)
        paths.append((client, glide(start, end, steps if start is not None else 1)))
    for k in range(max((len(path) for _, path in paths), default=0)):
        if k:
            time.sleep(step_s)
        for client, path in paths:
            if k < len(path):
                position, look_at, view_up = path[k]
                with client.atomic():
                    client.camera.up_direction = tuple(view_up)
                    client.camera.position = tuple(position)
                    client.camera.look_at = tuple(look_at)


def server_url(host: str, port: int) -> str:
    """``http://host:port``; a wildcard host is shown as 127.0.0.1."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}"


class Served:
    """What the viewers share once started: a context manager, the port bound and the address.
    A subclass sets ``server`` (None until :meth:`start`) and ``host``, and defines ``start``
    (returning itself) and ``stop``."""

    server: Any | None
    host: str

    def start(self):
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self if self.server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port actually bound (after ``start``)."""
        if self.server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return int(self.server.get_port())

    @property
    def url(self) -> str:
        """``http://host:port``; a wildcard host is shown as 127.0.0.1."""
        return server_url(self.host, self.port)
