"""Which web pages may open the viewer's websocket: the viewer's own, nobody else's.

A browser lets any page it shows open a websocket to any address, loopback included, and
sends the page's origin in the handshake's ``Origin`` header. Through the viewer's websocket
a page can click the viewer's buttons and fill its path fields, so a foreign page open in
the user's browser could make the viewer write files. The handshake is therefore refused
(HTTP 403) unless ``Origin`` is one of this server's own pages: ``http(s)://HOST:PORT`` where
PORT is the port the connection arrived on and HOST is a loopback address or ``localhost``,
the address the connection arrived on, the ``--host`` the server listens on, or this
machine's own name. Named hosts beyond those are never trusted: a page of
``http://evil.example:8080`` whose name an attacker points at 127.0.0.1 (DNS rebinding)
still sends its own name. A page served through a tunnel or proxy on another port is let in
with ``allowed_origins`` (``mapstream view --allow-origin``). A handshake without ``Origin``
comes from a program, not a browser page; it could send any header it likes, so refusing it
would protect nothing.

viser has no setting for this. It serves with ``websockets``, whose ``Server`` consults its
public ``process_request`` hook at each handshake; :func:`guard_origins` finds the
``websockets`` server that a started viser server listens with (the one bound to its port)
and wraps that hook. When it cannot find it (another viser or websockets version), the
viewer does not start: it never serves unguarded.
"""
from __future__ import annotations

import asyncio
import gc
import http
import ipaddress
import logging
import socket
import threading
import urllib.parse
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ALLOW_ORIGIN_HINT", "OriginPolicy", "check_origin_url", "guard_origins"]

WILDCARD_HOSTS = ("", "0.0.0.0", "::")
ALLOW_ORIGIN_HINT = "--allow-origin"
"""The command-line flag that adds an origin (named in the refusal's log line)."""
MAX_LOGGED_REFUSALS = 32
"""Distinct refused origins logged; a client sending ever new ones is refused without a line each."""


def check_origin_url(origin: str) -> str:
    """``origin`` as a browser sends it (``scheme://host[:port]``, lower case), or a ValueError
    saying what an origin looks like."""
    parts = urllib.parse.urlsplit(origin.strip())
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as err:
        raise ValueError(f"origin {origin!r} has a bad port ({err}); give it as http://HOST:PORT") from err
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(
            f"origin {origin!r} is not a page's origin; give it as http://HOST:PORT (e.g. http://localhost:9000)"
        )
    return f"{parts.scheme}://{parts.netloc.lower()}"


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address (an IPv4 address mapped into IPv6 as itself), or None for a name."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _same_address(a: str, b: str) -> bool:
    first = _address(a)
    return first is not None and first == _address(b)


def _is_loopback(host: str) -> bool:
    address = _address(host)
    return host == "localhost" if address is None else address.is_loopback


class OriginPolicy:
    """Decides whether a handshake's ``Origin`` is one of the viewer's own pages (see the
    module docstring). ``host`` is the address the server listens on; ``allowed_origins``
    are further origins let in as given (:func:`check_origin_url`)."""

    def __init__(self, host: str, allowed_origins: Iterable[str] = ()) -> None:
        self.allowed_origins = frozenset(check_origin_url(o) for o in allowed_origins)
        names = set() if host in WILDCARD_HOSTS else {host.strip("[]").lower()}
        if host in WILDCARD_HOSTS:  # reachable by this machine's name from the network
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        self.host_names = frozenset(names)
        self._refused: set[str] = set()
        self._refused_lock = threading.Lock()

    def allows(self, origin: str | None, local_address: str, local_port: int) -> bool:
        """Whether a handshake that arrived on ``local_address:local_port`` with header
        ``Origin: origin`` (None: no header) may open the websocket."""
        if origin is None:
            return True
        try:
            normal = check_origin_url(origin)
        except ValueError:  # "null" (a sandboxed page or a file), or garbage
            return False
        if normal in self.allowed_origins:
            return True
        parts = urllib.parse.urlsplit(normal)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        return port == local_port and (
            _is_loopback(host) or _same_address(host, local_address) or host in self.host_names
            or any(_same_address(host, name) for name in self.host_names)
        )

    def process_request(self, connection: Any, request: Any) -> Any | None:
        """A websocket handshake from a foreign page gets HTTP 403; anything else goes on."""
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return None  # the page's own files: as public as the page
        origin = request.headers.get("Origin")
        address, port = connection.local_address[:2]
        if self.allows(origin, address, port):
            return None
        self._log_refusal(origin)
        return connection.respond(
            http.HTTPStatus.FORBIDDEN, f"this viewer only talks to its own page, not to one from {origin}\n"
        )

    def _log_refusal(self, origin: str | None) -> None:
        with self._refused_lock:  # once an origin (a page may retry in a loop), and a bounded log
            if str(origin) in self._refused or len(self._refused) >= MAX_LOGGED_REFUSALS:
                return
            self._refused.add(str(origin))
        try:
            allowable = check_origin_url(str(origin))
        except ValueError:  # "null" (a local file or a sandboxed frame): no flag lets it in
            logger.warning(
                "viewer: refused a connection from a page of origin %s (a local file or a sandboxed frame), which "
                "is not this viewer's own page; open the viewer at its own address (http://HOST:PORT) instead",
                origin,
            )
            return
        logger.warning(
            "viewer: refused a connection from a page of %s, which is not this viewer's own page; if you opened "
            "the viewer through that address yourself (a tunnel or a proxy), start it with %s %s",
            origin, ALLOW_ORIGIN_HINT, allowable,
        )


def _listening_server(viser_server: Any) -> Any:
    """The ``websockets`` server bound to ``viser_server``'s port (see the module docstring).

    Raises:
        RuntimeError: there is none (this viser serves in another way).
    """
    from websockets.asyncio.server import Server

    port = int(viser_server.get_port())
    for candidate in gc.get_objects():
        # type(), not isinstance: the scan meets lazy module proxies that warn when asked their class.
        if issubclass(type(candidate), Server) and hasattr(candidate, "process_request"):
            try:
                ports = {sock.getsockname()[1] for sock in candidate.sockets}
            except (AttributeError, OSError):  # not (or no longer) listening
                continue
            if port in ports:
                return candidate
    raise RuntimeError(
        "cannot check which web pages connect to the viewer with this version of viser or websockets, so it "
        "does not start (any page open in your browser could use it); install the versions mapstream is tested "
        "with: pip install 'mapstream[viewer]'"
    )


def guard_origins(viser_server: Any, policy: OriginPolicy) -> None:
    """Refuse websocket handshakes from foreign pages on a started ``viser_server`` from now on
    (``policy``), and close any such connection that came in while it started.

    Raises:
        RuntimeError: the server cannot be guarded (see :func:`_listening_server`).
    """
    server = _listening_server(viser_server)
    serve_request = server.process_request

    def process_request(connection: Any, request: Any) -> Any | None:
        refusal = policy.process_request(connection, request)
        if refusal is not None or serve_request is None:
            return refusal
        return serve_request(connection, request)

    server.process_request = process_request
    for connection in list(server.connections):
        request = connection.request
        address, port = connection.local_address[:2]
        if request is not None and not policy.allows(request.headers.get("Origin"), address, port):
            asyncio.run_coroutine_threadsafe(connection.close(1008, "foreign origin"), server.get_loop())
