"""The service's settings (`ServeConfig`) and who may connect (`resolve_token`).

`mapstream serve` turns these fields into its flags; the stream settings each session starts
from are a `StreamConfig` beside them.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..validation import check_count

__all__ = ["MIN_TOKEN_LENGTH", "TOKEN_ENV", "ServeConfig", "is_loopback", "resolve_token"]

TOKEN_ENV = "MAPSTREAM_TOKEN"
MIN_TOKEN_LENGTH = 16
"""A token shorter than this is refused: it could be guessed by trying."""


@dataclass(frozen=True)
class ServeConfig:
    """Where `mapstream serve` listens, who may connect and how much each client may ask."""

    host: str = "127.0.0.1"
    """Address to listen on; 0.0.0.0 (any) needs a token (--token-file or MAPSTREAM_TOKEN)."""
    port: int = 8765
    """Port to listen on (0: any free one, told when serving)."""
    token_file: Optional[Path] = None
    """File holding the bearer token every client sends (Authorization: Bearer TOKEN); else $MAPSTREAM_TOKEN."""
    no_auth: bool = False
    """Serve without a token: only on a loopback address, where only this machine's programs connect."""
    allow_origin: tuple[str, ...] = ()
    """Browser origins (http://HOST:PORT) whose pages may connect; a handshake with any other Origin header is refused."""
    max_sessions: int = 16
    """Sessions served at once; one more is refused (HTTP 503) until one ends."""
    max_frame_pixels: int = 1_000_000
    """Largest frame (height x width), as sent and after preprocessing: a larger one is refused unread."""
    max_message_bytes: int = 8 * 1024 * 1024
    """Largest message a client may send; a larger one ends its connection (close code 1009)."""
    max_fps: float = 30.0
    """Frames per second one session may send (a burst of one second's worth is let through)."""
    queue_size: int = 8
    """Frames queued per session; one more drops the oldest queued frame not marked as keyframe."""
    max_maps: int = 4
    """Sessions with a global map (opened with loop_closure) served at once: each runs the model on a thread of its own."""
    max_batch: int = 16
    """Most frames of different sessions stepped in one batched forward (1: each alone, exactly its solo results)."""
    idle_timeout: float = 60.0
    """Seconds a session may be idle (nothing from or to its client, nothing on the model) before it ends."""
    shutdown_timeout: float = 30.0
    """On shutdown: seconds to finish the frames already queued before closing every connection."""

    def __post_init__(self) -> None:
        check_count("port", self.port, least=0)
        if self.port > 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_sessions", "max_frame_pixels", "max_message_bytes", "queue_size", "max_batch", "max_maps"):
            check_count(name, getattr(self, name))
        for name in ("max_fps", "idle_timeout", "shutdown_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of {'frames' if name == 'max_fps' else 'seconds'}, "
                                 f"got {value!r}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine can reach (127.x, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(config: ServeConfig, environ: dict[str, str] | None = None) -> str | None:
    """The token clients must send, or None when the server runs open (--no-auth on a loopback
    address). Raises ValueError for every other case, saying how to go on: no token and no
    --no-auth, --no-auth beside a token or on an address other machines reach, a token file
    that cannot be read, a token too short to resist guessing."""
    environ = os.environ if environ is None else environ
    if config.token_file is not None:
        try:
            token = Path(config.token_file).read_text().strip()
        except OSError as err:
            raise ValueError(f"cannot read token_file {config.token_file}: {err.strerror or err}") from err
        source = f"token_file {config.token_file}"
    else:
        token, source = environ.get(TOKEN_ENV, "").strip(), f"${TOKEN_ENV}"
    if token and config.no_auth:
        raise ValueError(f"no_auth serves without a token, and a token is given ({source}): give one or the other")
    if token:
        if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
            raise ValueError(f"the token of {source} must be at least {MIN_TOKEN_LENGTH} characters without spaces "
                             "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        return token
    if not is_loopback(config.host):
        raise ValueError(
            f"serving on {config.host} lets other machines connect, so a token is required: put one in a file and "
            f"give token_file FILE, or set ${TOKEN_ENV} (no_auth is only for a loopback address such as 127.0.0.1)"
        )
    if not config.no_auth:
        raise ValueError(
            f"no token: give token_file FILE or set ${TOKEN_ENV}, or no_auth to serve on {config.host} without one "
            "(any program of this machine could then connect)"
        )
    return None
