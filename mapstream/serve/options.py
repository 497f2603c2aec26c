"""A session's ``open`` message read into `SessionOptions`: how the session streams (its mode,
the stream settings a client may choose, the frames it announces), how its frames are
preprocessed and which arrays its results carry; and `plan_session`, the plan it runs.

The server's `StreamConfig` is each session's default and, for what costs memory or holds
the model, its bound: a client may shorten the sliding window, the trajectory memory, the
scale phase and the scale frames the cache keeps, not lengthen them (a scale phase runs its
frames through the model at once, while every other session waits). The settings that
follow the server's model and device (precision, attention backend, CUDA graphs) and the
windows' sizes are the server's alone; a preprocessing may not make frames larger than the
server's pixel limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..checkpoint import DEFAULT_IMAGE_SIZE
from ..config import StreamConfig
from ..export.points import DEFAULT_CONF_THRESHOLD
from ..io.images import check_preprocess_args
from ..pipeline.stream_plan import MODES, StreamPlan, plan_stream
from .protocol import PROTOCOL_VERSION, ProtocolError

__all__ = ["CLIENT_SETTINGS", "OutputOptions", "SessionOptions", "parse_open", "plan_session", "WINDOW_SETTINGS"]

CLIENT_SETTINGS = ("num_scale_frames", "cache_scale_frames", "keyframe_interval", "provisional", "sliding_window",
                   "trajectory_capacity", "shared_from", "window_join")
"""The stream settings a client may choose in its open message."""
WINDOW_SETTINGS = ("window_size", "overlap", "overlap_keyframes", "shared_from", "window_join")
"""The settings of a windowed session, as its ``opened`` answer tells them."""
_BOUNDED = ("sliding_window", "trajectory_capacity")


@dataclass(frozen=True)
class OutputOptions:
    """What a result carries beside the camera: depth and confidence maps, and the frame's
    world points above a confidence with their colours, each at every ``stride``-th pixel."""

    depth: bool = False
    confidence: bool = False
    points: bool = False
    dtype: str = "float16"
    stride: int = 1
    conf_threshold: float = DEFAULT_CONF_THRESHOLD

    @property
    def any_array(self) -> bool:
        return self.depth or self.confidence or self.points


@dataclass(frozen=True)
class SessionOptions:
    stream: StreamConfig
    preprocess: tuple[str, int] | None  # (mode, image_size) as `mapstream run` does, or frames go in as sent
    outputs: OutputOptions
    mode: str = "auto"  # one of MODES, as `mapstream run --mode`
    frames: int | None = None  # how many frames the client will send, when it knows (None: a live stream)
    chosen: frozenset[str] = frozenset()  # the settings the client named
    loop_closure: bool = False  # a global map beside the session (the server's MapConfig; docs/SERVE.md)


def plan_session(options: SessionOptions, trained_views: int | None) -> tuple[StreamPlan, list[str]]:
    """How a session streams, and what the client is warned of: `plan_stream` of its mode for
    an input of ``options.frames`` frames (None: live), on weights whose training clips held
    ``trained_views`` frames. A live session through one cache keeps its settings as given (its
    keyframe rule: None stores every frame; its provisional predictions); a session of known
    length is planned as `mapstream run` plans that input. A client that names ``shared_from``
    gets it where "auto" would answer a live session from the earlier window. Windows give
    final predictions only."""
    plan = plan_stream(options.mode, options.stream, options.frames, trained_views)
    if plan.mode == "streaming" and options.frames is None:
        plan = replace(plan, stream=options.stream)
    elif "shared_from" in options.chosen:
        plan = replace(plan, stream=plan.stream.with_settings(shared_from=options.stream.shared_from))
    warnings = []
    if options.stream.provisional and not plan.stream.provisional:
        why = "runs windows" if plan.mode == "windowed" else "announced its frames, as a run does"
        warnings.append(f"no provisional predictions: this session {why}, and its results are final only")
    return plan, warnings


def _settings(given: Any, server: StreamConfig) -> StreamConfig:
    if given is None:
        return server
    if not isinstance(given, dict):
        raise ProtocolError(f"settings is an object of stream settings, got {type(given).__name__}", "bad_open")
    unknown = sorted(set(given) - set(CLIENT_SETTINGS))
    if unknown:
        raise ProtocolError(f"settings {unknown} cannot be chosen by a client (it may set {', '.join(CLIENT_SETTINGS)};"
                            " precision, backend and fast are the server's)", "bad_open")
    for name in _BOUNDED:
        if name in given:
            bound, value = getattr(server, name), given[name]
            if bound is not None and (value is None or (isinstance(value, int) and value > bound)):
                raise ProtocolError(f"{name} may be at most the server's {bound}, got {value!r}", "bad_open")
    try:
        chosen = server.with_settings(**given)
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"settings: {err}", "bad_open") from err
    if chosen.num_scale_frames > server.num_scale_frames:
        raise ProtocolError(f"num_scale_frames may be at most the server's {server.num_scale_frames} (a scale phase "
                            f"runs its frames through the model at once), got {chosen.num_scale_frames}", "bad_open")
    if chosen.anchor_frames > server.anchor_frames:
        raise ProtocolError(f"the scale frames the cache keeps (cache_scale_frames, null: num_scale_frames) may be at "
                            f"most the server's {server.anchor_frames}, got {chosen.anchor_frames}", "bad_open")
    return chosen


def _preprocess(given: Any, patch_size: int, image_size: int, max_pixels: int) -> tuple[str, int] | None:
    if given is None:
        return None
    if not isinstance(given, dict) or set(given) - {"mode", "image_size"}:
        raise ProtocolError(f"preprocess is null or {{\"mode\": \"crop\"|\"pad\", \"image_size\": N}}, got {given!r}",
                            "bad_open")
    mode, size = given.get("mode", "crop"), given.get("image_size", image_size)
    try:
        if isinstance(size, bool) or not isinstance(size, int):
            raise ValueError(f"image_size must be an integer, got {size!r}")
        check_preprocess_args(mode, size, patch_size)
    except ValueError as err:
        raise ProtocolError(f"preprocess: {err}", "bad_open") from err
    # Crop makes frames image_size wide and at most as high, pad image_size square: the
    # largest frame this preprocessing makes is image_size x image_size.
    if size * size > max_pixels:
        largest = math.isqrt(max_pixels) // patch_size * patch_size
        instead = f"ask for image_size {largest} or less" if largest else "send frames as they are (preprocess null)"
        raise ProtocolError(f"preprocess image_size {size} makes frames of up to {size}x{size} = {size * size} pixels; "
                            f"this server takes at most {max_pixels} pixels a frame (max_frame_pixels): {instead}",
                            "bad_open")
    return mode, size


def _outputs(given: Any) -> OutputOptions:
    if given is None:
        return OutputOptions()
    fields = OutputOptions.__dataclass_fields__
    if not isinstance(given, dict) or set(given) - set(fields):
        raise ProtocolError(f"outputs is an object with some of {sorted(fields)}, got {given!r}", "bad_open")
    options = OutputOptions(**given)
    for name in ("depth", "confidence", "points"):
        if not isinstance(getattr(options, name), bool):
            raise ProtocolError(f"outputs.{name} is true or false", "bad_open")
    if options.dtype not in ("float16", "float32"):
        raise ProtocolError(f"outputs.dtype is float16 or float32, got {options.dtype!r}", "bad_open")
    if isinstance(options.stride, bool) or not isinstance(options.stride, int) or options.stride < 1:
        raise ProtocolError(f"outputs.stride is an integer >= 1, got {options.stride!r}", "bad_open")
    if isinstance(options.conf_threshold, bool) or not isinstance(options.conf_threshold, (int, float)):
        raise ProtocolError(f"outputs.conf_threshold is a number, got {options.conf_threshold!r}", "bad_open")
    return options


def _mode(given: Any, server_mode: str) -> str:
    if given is None:
        return server_mode
    if given not in MODES:
        raise ProtocolError(f"mode is one of {', '.join(MODES)} (or null: the server's {server_mode}), got {given!r}",
                            "bad_open")
    return given


def _frames(given: Any) -> int | None:
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
        raise ProtocolError(f"frames is the number of frames the client will send (an integer >= 1), or null for a "
                            f"live stream; got {given!r}", "bad_open")
    return given


def parse_open(message: dict[str, Any], server: StreamConfig, patch_size: int,
               image_size: int = DEFAULT_IMAGE_SIZE, mode: str = "auto", *, max_pixels: int) -> SessionOptions:
    """The options of an ``open`` message, or a ProtocolError saying what is wrong;
    ``image_size``: the served model's own frame width, where ``preprocess`` names none;
    ``mode``: the server's, where the message names none; ``max_pixels``: the largest frame
    the server takes (`ServeConfig.max_frame_pixels`), which no preprocessing may exceed."""
    if message.get("type") != "open":
        raise ProtocolError(f"the first message opens the session ({{\"type\": \"open\", \"version\": "
                            f"{PROTOCOL_VERSION}}}), got type {message.get('type')!r}", "bad_open")
    if message.get("version") != PROTOCOL_VERSION:
        raise ProtocolError(f"this server speaks protocol version {PROTOCOL_VERSION}, the client asked for "
                            f"{message.get('version')!r}", "unsupported_version")
    unknown = sorted(set(message) - {"type", "version", "settings", "preprocess", "outputs", "mode", "frames",
                                     "loop_closure"})
    if unknown:
        raise ProtocolError(f"open has no fields {unknown}", "bad_open")
    return SessionOptions(_settings(message.get("settings"), server),
                          _preprocess(message.get("preprocess"), patch_size, image_size, max_pixels),
                          _outputs(message.get("outputs")),
                          _mode(message.get("mode"), mode), _frames(message.get("frames")),
                          frozenset(message.get("settings") or ()), _loop_closure(message.get("loop_closure")))


def _loop_closure(given: Any) -> bool:
    if given is not None and not isinstance(given, bool):
        raise ProtocolError(f"loop_closure is true or false, got {given!r}", "bad_open")
    return bool(given)
