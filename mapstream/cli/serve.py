"""`mapstream serve`: a model served over WebSocket to clients that stream frames."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, Optional

import tyro

from ..serve.config import ServeConfig
from ._flags import as_flags
from .run import StreamFlags


@dataclass(frozen=True)
class ServeFlags(ServeConfig):
    """`ServeConfig`'s fields as flags, checked when the command builds its `ServeConfig`
    (so that a bad value is told with its flag's name)."""

    def __post_init__(self) -> None:
        pass

    def config(self) -> ServeConfig:
        return ServeConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ServeConfig)})


@dataclass(frozen=True)
class SessionFlags(StreamFlags):
    """The settings each session starts from (a client may choose some, within bounds:
    docs/SERVE.md). Windowed runs are not served: their settings are no flags here."""

    window_size: tyro.conf.Suppress[int] = 64
    overlap: tyro.conf.Suppress[Optional[int]] = 16
    overlap_keyframes: tyro.conf.Suppress[Optional[int]] = None
    shared_from: tyro.conf.Suppress[Literal["earlier", "later"]] = "later"
    window_join: tyro.conf.Suppress[Literal["shared", "anchor"]] = "shared"


@dataclass
class Serve:
    """Serve a model over WebSocket: clients stream frames and get poses, depth and points back.

    Every connection needs the bearer token (--token-file or $MAPSTREAM_TOKEN); --no-auth serves
    without one on a loopback address only. Ctrl-C (or SIGTERM) finishes the queued frames and
    stops. The protocol, the limits and the client: docs/SERVE.md.
    """

    ON_INTERRUPT: ClassVar[str] = "the server finished the frames it had taken"

    server: Annotated[ServeFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=ServeFlags)
    """Where it listens, who may connect, the limits."""
    model: str = "robbyant/lingbot-map"
    """Checkpoint path, folder, Hugging Face repo id, "small" (mapstream's own shipped model) or "tiny" (untrained, for tests)."""
    checkpoint_file: str = "lingbot-map-long.pt"
    """File inside the repo/folder given by --model."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (the first CUDA GPU when there is one, else the CPU)."""
    camera_iterations: int = 4
    """Refinement passes of the camera head."""
    compile: bool = False
    """Build the model with torch.compile'd per-frame static parts (slow start, faster frames on GPUs)."""
    low_precision_heads: bool = False
    """Heads in --precision too, not fp32: faster on GPUs, within that precision's rounding."""
    stream: Annotated[SessionFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=SessionFlags)
    """The sessions' stream settings (mapstream.StreamConfig)."""

    def main(self) -> int:
        import asyncio

        from ..device import resolve_device
        from ..pipeline.model_source import resolve_model
        from ..serve.background import serve_until_signalled
        from ..serve.config import resolve_token
        from ..serve.server import Server
        from ..session import resolve_precision

        try:
            config, stream = self.server.config(), self.stream.config()
            resolve_token(config)  # refused before the model loads
            if self.camera_iterations < 1:
                raise ValueError(f"camera_iterations must be >= 1, got {self.camera_iterations}")
        except ValueError as err:
            raise ValueError(as_flags(str(err), Serve)) from err
        device = resolve_device(self.device)
        model, desc, warnings = resolve_model(
            self.model, filename=self.checkpoint_file, device=device, backend=stream.backend,
            camera_num_iterations=self.camera_iterations, compile=self.compile,
        )
        precision = resolve_precision(stream.precision, device)
        if precision in ("bf16", "fp16"):
            model.cast_for_inference(precision, heads=self.low_precision_heads)
        server = Server(model, config, stream.with_settings(precision=precision), model_desc=desc, warnings=warnings)

        def listening(running: Server) -> None:
            print(f"serving {desc} on {running.url} ({config.max_sessions} sessions at most); Ctrl-C stops",
                  flush=True)

        asyncio.run(serve_until_signalled(server, on_listening=listening))
        print("stopped")
        return 0
