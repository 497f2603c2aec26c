"""Who gets in: every HTTP request and WebSocket handshake passes `Gate.process_request`
before a session exists.

- ``GET /healthz`` answers anyone (200 "ok", 503 while shutting down): it says nothing else.
- A request with an ``Origin`` header comes from a browser page; it is refused (403) unless
  that origin was allowed (``--allow-origin``): a page the user merely visits must not drive
  the server with the user's network position.
- Everything else needs ``Authorization: Bearer TOKEN`` when the server has a token (401
  otherwise, compared in constant time), then: ``GET /metrics`` answers Prometheus' text;
  a WebSocket handshake on ``/`` opens a session unless the server is full or shutting down
  (503).

A request that is no WebSocket handshake at all (a ``POST``, a plain ``GET /``, bytes that
are not HTTP, a connection closed before its request) never reaches `Gate`: websockets
refuses it while parsing. `HandshakeLog` makes each such refusal one INFO line, so that no
one who can reach the port fills the log with tracebacks.
"""
from __future__ import annotations

import hmac
import http
import logging
import sys
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from websockets.datastructures import Headers
from websockets.exceptions import InvalidHandshake
from websockets.http11 import Response

from ..viewer.origin_guard import check_origin_url
from .metrics import Metrics

__all__ = ["Gate", "HandshakeLog"]

log = logging.getLogger(__name__)


class Gate:
    """The checks of the module docstring. ``token``: None serves without one (loopback,
    ``--no-auth``); ``refusal``: why a new session is refused now, as (metric label, text
    for the client), or None."""

    def __init__(self, token: str | None, allowed_origins: Iterable[str], metrics: Metrics,
                 refusal: Callable[[], tuple[str, str] | None], draining: Callable[[], bool]) -> None:
        self._token = token.encode() if token is not None else None
        self.allowed_origins = frozenset(check_origin_url(o) for o in allowed_origins)
        self._metrics = metrics
        self._refusal = refusal
        self._draining = draining

    def process_request(self, connection: Any, request: Any) -> Response | None:
        path = urllib.parse.urlsplit(request.path).path
        if path == "/healthz":
            if self._draining():
                return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
            return connection.respond(http.HTTPStatus.OK, "ok\n")
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin):
            return self._refuse(connection, "origin", http.HTTPStatus.FORBIDDEN,
                                f"connections from web pages of {origin} are not allowed (the server's "
                                "--allow-origin lets a page's origin in)\n")
        if not self._authorized(request.headers.get("Authorization")):
            response = self._refuse(connection, "auth", http.HTTPStatus.UNAUTHORIZED,
                                    "missing or wrong bearer token: send the header 'Authorization: Bearer TOKEN' "
                                    "with the server's token\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="mapstream"'
            return response
        if path == "/metrics":
            body, content_type = self._metrics.exposition()
            headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body)))])
            return Response(200, "OK", headers, body)
        if path != "/":
            return connection.respond(http.HTTPStatus.NOT_FOUND, f"no {path} here: sessions open on /, "
                                      "metrics are on /metrics, health on /healthz\n")
        refusal = self._refusal()
        if refusal is not None:
            return self._refuse(connection, refusal[0], http.HTTPStatus.SERVICE_UNAVAILABLE, refusal[1] + "\n")
        return None

    def _origin_allowed(self, origin: str) -> bool:
        try:
            return check_origin_url(origin) in self.allowed_origins
        except ValueError:  # "null" (a sandboxed page or a local file), or garbage
            return False

    def _authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def _refuse(self, connection: Any, reason: str, status: http.HTTPStatus, text: str) -> Response:
        self._metrics.refused.labels(reason).inc()
        log.info("refused a connection from %s: %s", _peer(connection), text.strip())
        return connection.respond(status, text)


class HandshakeLog(logging.LoggerAdapter):
    """The logger given to websockets' server: a failed handshake whose cause is the client's
    request (websockets' InvalidHandshake: not HTTP, not GET, not an upgrade, closed early)
    is logged as one INFO line naming the peer and the cause, without a traceback; every
    other record passes unchanged (a failure of the server itself keeps its traceback)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def process(self, msg, kwargs):
        return msg, kwargs  # websockets' own adapter gives the record its extra fields

    def log(self, level, msg, *args, exc_info=None, **kwargs) -> None:
        error = sys.exc_info()[1] if exc_info is True else exc_info
        if level >= logging.ERROR and isinstance(error, InvalidHandshake):
            cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
            peer = _peer((kwargs.get("extra") or {}).get("websocket"))
            level, msg, args, exc_info = logging.INFO, "refused a request from %s that is no WebSocket handshake: " \
                "%s%s", (peer, error, cause), None
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)


def _peer(connection: Any) -> str:
    try:
        host, port = connection.remote_address[:2]
        return f"{host}:{port}"
    except (TypeError, ValueError, AttributeError):
        return "an unknown address"
