"""`mapstream serve`: streaming reconstruction as a WebSocket service (docs/SERVE.md).

    server = Server(model, ServeConfig(port=0, no_auth=True))
    with BackgroundServer(server) as running:      # or: await server.start() in your event loop
        print(running.url)

The wire format (`mapstream.serve.protocol`) is shared with the client, `mapstream.client`;
importing it needs neither the server's packages nor a model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .background import BackgroundServer
    from .config import ServeConfig
    from .server import Server

__all__ = ["BackgroundServer", "ServeConfig", "Server"]

_WHERE = {"BackgroundServer": "background", "ServeConfig": "config", "Server": "server"}


def __getattr__(name: str) -> Any:
    """The server's names, imported when first used: the client imports the protocol module
    of this package without websockets' server side or prometheus_client."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
