"""`mapstream serve`: a model served over WebSocket to clients that stream frames."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal, Optional

import tyro

from ..config import DEFAULT_CAMERA_ITERATIONS
from ..globalmap.config import MapConfig
from ..hub import DEFAULT_FILENAME, DEFAULT_REPO
from ..pipeline.options import RunOptions
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
    model: str = DEFAULT_REPO
    """Checkpoint path, folder, Hugging Face repo id, "small" (mapstream's own shipped model) or "tiny" (untrained, for tests)."""
    checkpoint_file: str = DEFAULT_FILENAME
    """File inside the repo/folder given by --model."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (the first CUDA GPU when there is one, else the CPU)."""
    camera_iterations: int = DEFAULT_CAMERA_ITERATIONS
    """Refinement passes of the camera head."""
    compile: bool = False
    """Build the model with torch.compile'd per-frame static parts (slow start, faster frames on GPUs)."""
    low_precision_heads: bool = False
    """Heads in --precision too, not fp32: faster on GPUs, within that precision's rounding."""
    gpu_memory: Optional[str] = None
    """GPU memory the server may use (e.g. 40GB): --max-sessions sessions' settings are fitted to it (the cache in FP8, a smaller sliding window, as mapstream run --gpu-memory), told at start and held to while serving; refused at start when nothing fits."""
    trunk_weights: Literal["auto", "int8", "fp8"] = RunOptions.trunk_weights
    """The trunk's linear weights, as mapstream run --trunk-weights (auto: in --precision; int8: weight-only; fp8: FP8 products)."""
    mode: Literal["auto", "streaming", "windowed"] = "auto"
    """How a session streams unless its client says: as mapstream run --mode (auto: windows as long as the model's training clips when its weights record them, e.g. the small model, else one cache; docs/SERVE.md)."""
    stream: Annotated[StreamFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=StreamFlags)
    """The stream settings each session starts from (a client may choose some, within bounds: docs/SERVE.md)."""
    map: MapConfig = field(default_factory=MapConfig)
    """The global map of the sessions a client opens with loop_closure (docs/MAP.md)."""

    def main(self) -> int:
        import asyncio
        import contextlib

        from ..device import resolve_device
        from ..gpu_memory import allocator_limit, parse_memory
        from ..pipeline.model_source import resolve_model
        from ..serve.background import serve_until_signalled
        from ..serve.config import resolve_token
        from ..serve.memory import prepare_served_model
        from ..serve.server import Server
        from ..session import resolve_precision

        try:
            config, stream = self.server.config(), self.stream.config()
            resolve_token(config)  # refused before the model loads
            if self.camera_iterations < 1:
                raise ValueError(f"camera_iterations must be >= 1, got {self.camera_iterations}")
            if self.gpu_memory is not None:
                parse_memory(self.gpu_memory)
        except ValueError as err:
            raise ValueError(as_flags(str(err), Serve)) from err
        device = resolve_device(self.device)
        model, desc, warnings = resolve_model(
            self.model, filename=self.checkpoint_file, device=device, backend=stream.backend,
            camera_num_iterations=self.camera_iterations, compile=self.compile,
        )
        precision = resolve_precision(stream.precision, device)
        stream, memory = prepare_served_model(
            model, stream.with_settings(precision=precision), config, device, gpu_memory=self.gpu_memory,
            mode=self.mode, low_precision_heads=self.low_precision_heads, trunk_weights=self.trunk_weights)
        if memory is not None:
            print(memory.describe(), flush=True)
        try:
            server = Server(model, config, stream, mode=self.mode, map_config=self.map, model_desc=desc,
                            warnings=warnings)
        except ValueError as err:
            raise ValueError(as_flags(str(err), Serve)) from err

        def listening(running: Server) -> None:
            print(f"serving {desc} on {running.url} ({config.max_sessions} sessions at most); Ctrl-C stops",
                  flush=True)

        held = allocator_limit(memory.budget, device) if memory is not None else contextlib.nullcontext()
        with held:
            asyncio.run(serve_until_signalled(server, on_listening=listening))
        print("stopped")
        return 0
