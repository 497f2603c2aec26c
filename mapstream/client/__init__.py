"""The client of `mapstream serve` (docs/SERVE.md): open a session, send frames, read poses,
depth and points back.

    from mapstream.client import Client
    session = Client("ws://127.0.0.1:8765", token=token).open_session(depth=True)

It needs `websockets` (pip install 'mapstream[serve]'), not the server's other packages.
"""
from __future__ import annotations

from .connection import Client, RemoteSession
from .events import Event, Result, ServiceError

__all__ = ["Client", "Event", "RemoteSession", "Result", "ServiceError"]
