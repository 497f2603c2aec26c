"""`mapstream run` with a server's model: the run's frames are predicted by `mapstream serve`
and everything else (input, frame store, exports, run.json) is the run's own code, so a
remote run writes what a local run of the same input, model and settings writes.

The frames travel as PNG (lossless: the server gets the run's preprocessed frames exactly)
and depth and confidence come back as float32 at full size.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..checkpoint import DEFAULT_IMAGE_SIZE
from ..config import StreamConfig
from ..pipeline.run import OpenedSession, RunOptions, RunSummary, run
from .connection import Client, RemoteSession
from .events import Event, Result, ServiceError

__all__ = ["RUN_SETTINGS", "remote_run", "remote_session_opener"]

RUN_SETTINGS = ("num_scale_frames", "cache_scale_frames", "keyframe_interval", "sliding_window",
                "trajectory_capacity", "shared_from", "window_join")
"""The stream settings a remote run asks the server for (the others are the server's)."""
_STREAM_FIELDS = {f.name for f in dataclasses.fields(StreamConfig)}


class _RunSession:
    """A `RemoteSession` driven as the run drives a `Session`: `step` sends a frame and returns
    the predictions that have arrived meanwhile, `flush` waits for the rest. A frame the
    server drops or refuses stops the run: its outputs would miss it."""

    def __init__(self, remote: RemoteSession, encoding: str) -> None:
        self.remote, self.encoding = remote, encoding

    def step(self, frame: torch.Tensor, *, keyframe: bool | None = None, name: str | None = None) -> list:
        self.remote.send(frame, keyframe=keyframe, name=name, encoding=self.encoding)
        return self._predictions(self.remote.poll())

    def flush(self) -> list:
        return self._predictions(self.remote.close())

    def close(self) -> None:
        if self.remote.ended is None:
            self.remote.abort()

    @staticmethod
    def _predictions(answers: list[Result | Event]) -> list:
        preds = []
        for answer in answers:
            if isinstance(answer, Result):
                if not answer.provisional:
                    preds.append(answer.prediction())
            elif answer.type == "dropped" or answer.type == "error":
                raise answer.error() if answer.type == "error" else ServiceError(
                    f"the server dropped frame {answer.frame} ({answer.data.get('reason')})", "dropped", answer.frame)
        return preds


def remote_session_opener(url: str, *, token: str | None = None, encoding: str = "png"):
    """``open_session`` for `mapstream.pipeline.run`: a session of the server at ``url``."""

    def open_session(opts: RunOptions, device: torch.device, length: int | None) -> OpenedSession:
        # The server plans the session, as a local run plans its input: it knows the model.
        settings = {name: getattr(opts.stream, name) for name in RUN_SETTINGS}
        remote = Client(url, token=token).open_session(settings=settings, depth=True, confidence=True,
                                                       dtype="float32", mode=opts.mode, frames=length)
        info: dict[str, Any] = remote.info
        planned = {name: info["settings"][name] for name in RUN_SETTINGS}
        planned.update({k: v for k, v in (info.get("windows") or {}).items() if k in _STREAM_FIELDS})
        stream = opts.stream.with_settings(**planned)
        # A server that does not say its model's width serves the official one's.
        return OpenedSession(_RunSession(remote, encoding), info.get("mode", "streaming"), stream, info["model"],
                             list(info["warnings"]), info["precision"], info["heads_precision"],
                             info["camera_iterations"], where=url,
                             image_size=info.get("image_size", DEFAULT_IMAGE_SIZE),
                             trunk_weights=info.get("trunk_weights", "auto"))

    return open_session


def remote_run(opts: RunOptions, url: str, *, token: str | None = None, encoding: str = "png",
               progress: bool | None = None) -> RunSummary:
    """`mapstream.pipeline.run` of ``opts`` with the frames predicted by the server at ``url``."""
    return run(opts, progress=progress, open_session=remote_session_opener(url, token=token, encoding=encoding))
