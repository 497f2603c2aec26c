"""`mapstream stream`: `mapstream run` with a server's model (`mapstream serve`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Optional

import tyro

from ..config import StreamConfig
from ..export import ALL_FORMATS
from ._cloud import CloudFlags, PointCloudFlags
from ._flags import as_flags
from ._input import InputFlags
from .run import print_run_summary

_STREAM = StreamConfig()  # the defaults of the stream settings a client may choose


@dataclass
class Stream:
    """Reconstruct INPUT with the model of a mapstream server: the frames go to the server, the
    run folder is written here, file for file as mapstream run writes it.

    INPUT is an image folder, a video file, a glob, a webcam index or a stream URL. The token
    comes from --token-file or $MAPSTREAM_TOKEN. docs/SERVE.md has the details.
    """

    ON_INTERRUPT: ClassVar[str] = "a run keeps the frames it finished and resumes from them when run again"

    input: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="INPUT")]
    """Image folder, video file, glob, webcam index or stream URL."""
    to: str = "ws://127.0.0.1:8765"
    """The server's address (ws://HOST:PORT, or wss:// behind a TLS proxy)."""
    out: Path = Path("runs/latest")
    """Output folder (created; an interrupted run there is resumed)."""
    token_file: Optional[Path] = None
    """File holding the server's token (default: $MAPSTREAM_TOKEN; none for a server run with --no-auth)."""
    frames: Annotated[InputFlags, tyro.conf.OmitArgPrefixes] = field(default_factory=InputFlags)
    mode: Literal["auto", "streaming", "windowed"] = "auto"
    """As mapstream run --mode, planned by the server for its model (windows of the server's sizes)."""
    num_scale_frames: int = _STREAM.num_scale_frames
    """Frames that open the sequence together and stay its anchors."""
    cache_scale_frames: Optional[int] = _STREAM.cache_scale_frames
    """Stored frames the cache keeps for ever (None: --num-scale-frames)."""
    keyframe_interval: Optional[int] = _STREAM.keyframe_interval
    """Store every k-th frame (None: as mapstream run chooses, from the input's length)."""
    sliding_window: int = _STREAM.sliding_window
    """Most recent stored frames kept (at most the server's)."""
    trajectory_capacity: Optional[int] = _STREAM.trajectory_capacity
    """Evicted frames whose special tokens stay visible (at most the server's)."""
    encoding: Literal["png", "raw"] = "png"
    """How frames travel: png (lossless, smaller) or raw pixels (no encoding work)."""
    formats: tuple[str, ...] = ALL_FORMATS
    """Outputs to write (default: all of them)."""
    cloud: CloudFlags = field(default_factory=PointCloudFlags)
    resume: bool = True
    """Continue an interrupted run found in --out, keeping its finished frames; --no-resume starts over."""
    quiet: bool = False
    """No progress bar."""

    def main(self) -> int:
        from ..client.run import remote_run
        from ..pipeline import RunOptions

        try:
            stream = StreamConfig(
                num_scale_frames=self.num_scale_frames, cache_scale_frames=self.cache_scale_frames,
                keyframe_interval=self.keyframe_interval, sliding_window=self.sliding_window,
                trajectory_capacity=self.trajectory_capacity,
            )
            opts = RunOptions(
                input=self.input, out=self.out, model=self.to, mode=self.mode, **self.frames.options(),
                stream=stream, device="cpu", formats=self.formats,
                conf_threshold=self.cloud.conf_threshold, conf_percentile=self.cloud.conf_percentile,
                voxel_size=self.cloud.voxel_size, drop_black_background=self.cloud.drop_black_background,
                drop_white_background=self.cloud.drop_white_background, max_points=self.cloud.max_points,
                resume=self.resume,
            )
            summary = remote_run(opts, self.to, token=self._token(), encoding=self.encoding, progress=not self.quiet)
        except ValueError as err:
            raise ValueError(as_flags(str(err), Stream)) from err
        print_run_summary(summary, where=self.to)
        return 0

    def _token(self) -> str | None:
        if self.token_file is None:
            return os.environ.get("MAPSTREAM_TOKEN", "").strip() or None
        try:
            return self.token_file.read_text().strip()
        except OSError as err:
            raise ValueError(f"cannot read token_file {self.token_file}: {err.strerror or err}") from err
