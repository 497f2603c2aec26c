"""What one worker does: hold a model and run its inputs one after another with it.

A worker (a Ray actor, or the job's own process without Ray) loads the model once and lends
each input's `mapstream.pipeline.run` a session of it. When the input is done the session is
reset (a scene cut: every cached frame forgotten, so the next input starts exactly as a fresh
session does) and kept for the next input with the same settings, so its CUDA graphs are
captured once per worker and frame size instead of once per input. An input's folder is the one
a single `mapstream run` of it writes, without a load or a capture per input.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoint import model_image_size
from ..pipeline import RunOptions, run
from ..pipeline.model_source import prepare_for_inference, resolve_model
from ..pipeline.run import OpenedSession, plan_for_model, planned_session
from ..session import resolve_precision
from .inputs import JobInput

__all__ = ["InputResult", "ModelHolder", "run_input"]

log = logging.getLogger(__name__)

BeforeInput = Callable[[JobInput, int], None]
"""Called in the worker with the input and its attempt (from 1) before each attempt: a hook
for tests to make an attempt fail or the worker die."""


@dataclass(frozen=True)
class InputResult:
    """One input's outcome. ``status``: ``done`` (run by this job), ``finished_before`` (a
    finished run of the same settings was there already), ``failed`` (``error`` says why,
    after ``attempts`` attempts) or ``not_run`` (the job was stopped before it)."""

    name: str
    input: str
    out: str
    status: str
    frames: int = 0
    new_frames: int = 0
    attempts: int = 0
    seconds: float = 0.0
    fps: float = 0.0
    error: str | None = None


# Stream settings whose sessions a worker keeps: a job's inputs share their settings except the
# keyframe interval, which follows each input's length.
_IDLE_SETTINGS = 2


class _LentSession:
    """A held session lent to one input: `close()` gives it back to the holder, reset, instead
    of releasing it; everything else is the session's own."""

    def __init__(self, session: Any, give_back: Callable[[Any], None]) -> None:
        self._session, self._give_back = session, give_back

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            self._give_back(session)


class ModelHolder:
    """The worker's model, loaded on its first input and kept for the next ones with the same
    model settings (a job's inputs share them), and the sessions its finished inputs gave
    back, one per stream setting, reused by the next inputs with that setting."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._loaded: tuple[Any, str, list[str], str] | None = None
        self._idle: dict[tuple, Any] = {}  # (mode, stream settings) -> a reset session

    @property
    def idle_sessions(self) -> int:
        """Sessions given back and not lent again (each holds its cache pages and graphs)."""
        return len(self._idle)

    def _drop_idle(self) -> None:
        for session in self._idle.values():
            session.close()
        self._idle.clear()

    def _take_back(self, key: tuple, session: Any) -> None:
        try:
            session.reset()
        except Exception:  # a session that cannot start a new sequence is not lent again
            log.warning("a session could not be reset after its input; the next input gets a new one", exc_info=True)
            session.close()
            return
        if key in self._idle:  # one kept per setting: inputs of a worker run one after another
            session.close()
            return
        self._idle[key] = session
        while len(self._idle) > _IDLE_SETTINGS:  # the setting given back longest ago goes
            self._idle.pop(next(iter(self._idle))).close()

    def close(self) -> None:
        """Release the idle sessions and the model (the worker is done)."""
        self._drop_idle()
        self._key, self._loaded = None, None

    def open_session(self, opts: RunOptions, device: torch.device, length: int | None) -> OpenedSession:
        """`run`'s ``open_session``: a session of the held model, planned as a single run plans
        it (`plan_stream`)."""
        precision = resolve_precision(opts.stream.precision, device)
        key = (opts.model, opts.checkpoint_file, str(device), opts.stream.backend, opts.camera_iterations,
               opts.compile, precision, opts.low_precision_heads, opts.trunk_weights, opts.demo)
        if key != self._key:
            self._drop_idle()  # sessions of the old model
            self._loaded = None  # the old model goes before the new one loads
            model, desc, warnings = resolve_model(
                opts.model, filename=opts.checkpoint_file, device=device, demo=opts.demo,
                backend=opts.stream.backend, camera_num_iterations=opts.camera_iterations, compile=opts.compile,
            )
            prepare_for_inference(model, precision, low_precision_heads=opts.low_precision_heads,
                                  trunk_weights=opts.trunk_weights)
            self._key, self._loaded = key, (model, desc, warnings, str(model.head_dtype).removeprefix("torch."))
            log.info("worker loaded %s on %s", desc, device)
        model, desc, warnings, heads = self._loaded
        plan = plan_for_model(opts, length, model, precision)
        setting = (plan.mode, plan.stream)
        session = self._idle.pop(setting, None)
        if session is None:
            session = planned_session(model, plan)
        lent = _LentSession(session, lambda returned: self._take_back(setting, returned))
        # A run adds its own warnings to the list it is given: each run gets its own copy.
        return OpenedSession(lent, plan.mode, plan.stream, desc, list(warnings), precision, heads,
                             opts.camera_iterations, image_size=model_image_size(model),
                             trunk_weights=model.trunk_weights)


def run_input(item: JobInput, opts: RunOptions, holder: ModelHolder, attempt: int,
              before_input: BeforeInput | None = None) -> InputResult:
    """One attempt at one input with the worker's model; raises what the run raises."""
    if before_input is not None:
        before_input(item, attempt)
    started = time.perf_counter()
    summary = run(opts, progress=False, open_session=holder.open_session)
    return InputResult(item.name, item.input, str(item.out), "done", summary.frames, summary.new_frames, attempt,
                       time.perf_counter() - started, summary.fps)
