"""`Server`: the asyncio WebSocket service of docs/SERVE.md around one model.

Each connection runs a handler that reads the client's messages, checks and decodes its
frames (decoding runs on the default executor, never on the event loop) and queues them on
its `ServedStream`; a sender task per connection writes the answers in order; the `Worker`
steps the queued frames on the model thread. A connection that ends, however it ends, has
its queue emptied and its `Session` closed on the model thread (its cache freed).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from ..checkpoint import model_image_size, model_trained_views
from ..config import StreamConfig
from ..globalmap import MapConfig
from ..models.gct import GCTNetwork
from ..pipeline.stream_plan import check_mode
from ..session import Session, resolve_precision
from ..windowed import WindowedSession
from .config import ServeConfig, resolve_token
from .frames import check_frame_message, decode_frame
from .gate import Gate, HandshakeLog
from .memory import sessions_memory_warning
from .metrics import Metrics
from .options import CLIENT_SETTINGS, WINDOW_SETTINGS, OutputOptions, SessionOptions, parse_open, plan_session
from .protocol import PROTOCOL_VERSION, ProtocolError, parse_json, unpack
from .results import result_message, text
from .scheduler import Worker
from .session_map import SessionMap
from .stream import Control, QueuedFrame, RateLimit, ServedStream

__all__ = ["Server"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class _Answer:
    """A prediction the sender encodes (off the event loop) and sends."""

    pred: Any
    frame: QueuedFrame
    sequence: int


@dataclass(frozen=True)
class _Close:
    code: int
    reason: str


def _plain(value: Any) -> Any:
    """A setting as JSON holds it (a keyframe policy object, given from Python, by its repr)."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def _error(code: str, message: str, *, frame: int | None = None, fatal: bool = False) -> str:
    return text({"type": "error", "code": code, "message": message, "frame": frame, "fatal": fatal})


class Server:
    """Serves ``model`` (on its device, in its dtype; the caller loads and casts it) as
    docs/SERVE.md describes. ``stream``: the settings each session starts from and is bounded
    by (default: the model's); ``mode``: how a session streams unless its client says
    (`mapstream run --mode`: "auto" runs windows of the weights' training clip length where
    they record one); ``map_config``: the global map of sessions opened with loop_closure
    (default `MapConfig()`); ``model_desc`` and ``warnings``: what clients are told of the model;
    ``environ``: where $MAPSTREAM_TOKEN is read (default: os.environ). Refuses to be made
    without a token where `resolve_token` says so, and with window settings no window runs."""

    def __init__(self, model: GCTNetwork, config: ServeConfig = ServeConfig(), stream: StreamConfig | None = None,
                 *, mode: str = "auto", map_config: MapConfig | None = None, model_desc: str = "",
                 warnings: list[str] = (), environ: dict[str, str] | None = None) -> None:
        self.model, self.config, self.model_desc, self.warnings = model, config, model_desc, list(warnings)
        self.map_config = map_config or MapConfig()
        self._token = resolve_token(config, environ)
        device = next(model.parameters()).device
        stream = stream or model.stream_config
        self.stream_config = stream.with_settings(precision=resolve_precision(stream.precision, device))
        check_mode(mode, self.stream_config)
        self.mode = mode
        self.trained_views = model_trained_views(model)
        if device.type == "cuda":
            told = sessions_memory_warning(model, self.stream_config, config,
                                           torch.cuda.get_device_properties(device).total_memory)
            if told:
                log.warning("%s", told)
        live_options = SessionOptions(self.stream_config, None, OutputOptions(), mode)
        live, _ = plan_session(live_options, self.trained_views)
        if live.reason:
            log.info("live sessions: %s", live.reason)
        self.streams: dict[str, ServedStream] = {}
        self._slots = 0  # connections past the handshake that hold or are opening a session
        self._draining = False
        self.metrics = Metrics(lambda: len(self.streams), lambda: [s.queued_frames for s in self.streams.values()])
        self.gate = Gate(self._token, config.allow_origin, self.metrics, self._refusal, lambda: self._draining)
        self.worker = Worker(self.streams, config.max_batch, self.metrics, self._deliver)
        self._ws_server = None
        self._tasks: list[asyncio.Task] = []
        self._stopped: asyncio.Event | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Server:
        """Listen (``config.port`` 0: any free port, then in ``self.port``)."""
        if self._ws_server is not None:
            raise RuntimeError("this server is started already; a Server serves once")
        self._stopped = asyncio.Event()
        self._ws_server = await serve(
            self._handle, self.config.host, self.config.port, process_request=self.gate.process_request,
            max_size=self.config.max_message_bytes, compression=None, server_header="mapstream",
            logger=HandshakeLog(logging.getLogger("websockets.server")),
        )
        self.port = int(next(iter(self._ws_server.sockets)).getsockname()[1])
        self._tasks = [asyncio.create_task(self.worker.run()), asyncio.create_task(self._reap_idle())]
        log.info("serving on %s (%s)", self.url, "no token: loopback only" if self._token is None else "token required")
        return self

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"ws://{host}:{self.port}"

    async def wait_closed(self) -> None:
        await self._stopped.wait()

    async def shutdown(self) -> None:
        """Stop taking connections, finish every session's queued frames (within
        ``shutdown_timeout``), tell each client, close every connection, free every cache."""
        if self._draining:
            await self._stopped.wait()
            return
        self._draining = True
        log.info("shutting down: finishing the queued frames of %d sessions", len(self.streams))
        self._ws_server.close(close_connections=False)
        for stream in list(self.streams.values()):
            if stream.ending is None:
                stream.ending = "shutdown"
                stream.queue.append(Control("finish", "shutdown"))
        self.worker.wake()
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for stream in list(self.streams.values()):  # past the deadline: the rest are refused
            stream.queue.clear()
            with contextlib.suppress(Exception):
                await stream.connection.close(1001, "server shutting down")
        await self._ws_server.wait_closed()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.worker.close()
        self._stopped.set()
        log.info("shut down")

    def _refusal(self) -> tuple[str, str] | None:
        if self._draining:
            return "shutdown", "the server is shutting down"
        if self._slots >= self.config.max_sessions:
            return "full", f"the server is full ({self.config.max_sessions} sessions); try again later"
        return None

    # ------------------------------------------------------------------ one connection
    async def _handle(self, ws) -> None:
        refusal = self._refusal()  # the gate checked it at the handshake; this is the count that holds
        if refusal is not None:
            self.metrics.refused.labels(refusal[0]).inc()
            full = refusal[0] == "full"
            return await self._turn_away(ws, "server_full" if full else "shutting_down", refusal[1],
                                         1013 if full else 1001)
        self._slots += 1
        try:
            stream = await self._open(ws)
            if stream is not None:
                await self._serve(stream, ws)
        finally:
            self._slots -= 1

    async def _open(self, ws) -> ServedStream | None:
        """The session the client's first message opens, registered and greeted; None when the
        message is not a valid ``open`` (the client is told why) or the connection went."""
        try:
            first = await asyncio.wait_for(ws.recv(), timeout=self.config.idle_timeout)
            if isinstance(first, bytes):
                raise ProtocolError("the first message is a JSON text message {\"type\": \"open\", ...}", "bad_open")
            try:
                message = parse_json(first)
            except ProtocolError as err:
                raise ProtocolError(f"the open message: {err}", "bad_open") from err
            options = parse_open(message, self.stream_config, self.model.config.patch_size,
                                 model_image_size(self.model), self.mode, max_pixels=self.config.max_frame_pixels)
        except ConnectionClosed:
            return None
        except asyncio.TimeoutError:
            return await self._turn_away(ws, "idle_timeout", f"no open message within {self.config.idle_timeout:g} s",
                                         1000)
        except ProtocolError as err:
            return await self._turn_away(ws, err.code, str(err), 1008)
        try:
            plan, warnings = plan_session(options, self.trained_views)
            kind = WindowedSession if plan.mode == "windowed" else Session
            session = await self.worker.on_model_thread(
                functools.partial(kind, self.model, plan.stream, output_device="cpu"))
        except (TypeError, ValueError) as err:  # settings the open message passed but a session refuses
            return await self._turn_away(ws, "bad_open", f"settings: {err}", 1008)
        stream = ServedStream(secrets.token_urlsafe(16), session, options, self.config.queue_size,
                              RateLimit(self.config.max_fps), connection=ws, warnings=warnings)
        if options.loop_closure:
            refusal = self._map_refusal()
            if refusal is None:
                try:
                    stream.map = SessionMap(self.model, self.map_config, asyncio.get_running_loop(),
                                            lambda message: stream.outbox.put_nowait(text(message)))
                except ValueError as err:  # gtsam or faiss missing: told as the map's own error says
                    refusal = f"loop_closure: {err}"
            if refusal is not None:
                await self.worker.on_model_thread(session.close)
                return await self._turn_away(ws, "bad_open", refusal, 1008)
        self.streams[stream.id] = stream
        self.metrics.sessions_opened.inc()
        stream.outbox.put_nowait(text(self._opened(stream)))
        if self._draining:  # shutdown began while the session was made
            stream.ending = "shutdown"
            stream.queue.append(Control("finish", "shutdown"))
        log.info("session %s opened (%d open)", stream.id[:8], len(self.streams))
        return stream

    def _map_refusal(self) -> str | None:
        maps = sum(stream.map is not None for stream in self.streams.values())
        if maps >= self.config.max_maps:
            return (f"loop_closure: this server runs at most {self.config.max_maps} global maps at once (max_maps), "
                    "all taken; open without loop_closure or try again later")
        return None

    @staticmethod
    async def _turn_away(ws, code: str, message: str, close_code: int) -> None:
        """Tell a client that opened no session why, and close its connection."""
        with contextlib.suppress(ConnectionClosed):
            await ws.send(_error(code, message, fatal=True))
            await ws.close(close_code, code)

    def _opened(self, stream: ServedStream) -> dict[str, Any]:
        c, settings, windowed = self.config, stream.session.config, stream.windowed
        return {
            "type": "opened", "version": PROTOCOL_VERSION, "session": stream.id, "queue_size": c.queue_size,
            "max_fps": c.max_fps, "max_frame_pixels": c.max_frame_pixels, "max_message_bytes": c.max_message_bytes,
            "idle_timeout": c.idle_timeout, "patch_size": self.model.config.patch_size,
            "image_size": model_image_size(self.model), "model": self.model_desc,
            "warnings": self.warnings + stream.warnings,
            "precision": self.stream_config.precision,
            "heads_precision": str(self.model.head_dtype).removeprefix("torch."),
            "trunk_weights": self.model.trunk_weights,
            "camera_iterations": self.model.config.camera_num_iterations,
            "settings": {name: _plain(getattr(settings, name)) for name in CLIENT_SETTINGS},
            "mode": "windowed" if windowed else "streaming",
            "windows": {**{name: getattr(settings, name) for name in WINDOW_SETTINGS}, "span": stream.session.span,
                        "overlap_frames": stream.session.overlap} if windowed else None,
            "trained_views": self.trained_views,
            "preprocess": None if stream.options.preprocess is None else dict(
                zip(("mode", "image_size"), stream.options.preprocess)),
            "outputs": asdict(stream.options.outputs),
            "loop_closure": asdict(self.map_config) if stream.map is not None else None,
        }

    async def _serve(self, stream: ServedStream, ws) -> None:
        sender = asyncio.create_task(self._send_loop(stream, ws))
        try:
            async for message in ws:
                stream.last_active = time.monotonic()
                if stream.outbox.qsize() > stream.outbox_limit:  # answers pile up: it sends, it does not read
                    await ws.close(1008, "the client does not read its answers")
                    break
                try:
                    if isinstance(message, bytes):
                        await self._on_frame(stream, message)
                    else:
                        self._on_control(stream, parse_json(message))
                except ProtocolError as err:
                    stream.outbox.put_nowait(_error(err.code, str(err), frame=err.frame))
        except ConnectionClosed:
            pass
        finally:
            await self._end(stream, sender)

    async def _on_frame(self, stream: ServedStream, message: bytes) -> None:
        header, payload = unpack(message)
        frame_id = check_frame_message(header, stream.last_frame_id)
        stream.last_frame_id = frame_id
        if stream.windowed and header.get("keyframe") is not None:
            return self._refuse(stream, frame_id, "bad_frame", "this session runs windows, which store frames at a "
                                "fixed interval: send frames with keyframe null (or open the session with mode "
                                "streaming to choose keyframes)")
        if stream.ending is not None:
            code = "shutting_down" if self._draining else "closing"
            return self._refuse(stream, frame_id, code, "the session is ending: frames sent after close (or a server "
                                "shutdown) are not taken")
        if not stream.limit.allow():
            return self._refuse(stream, frame_id, "rate_limited",
                                f"more than {self.config.max_fps:g} frames a second: this frame is not taken")
        loop = asyncio.get_running_loop()
        try:
            image = await loop.run_in_executor(None, decode_frame, header, payload, stream.options.preprocess,
                                               self.config.max_frame_pixels, self.model.config.patch_size)
            hw = image.shape[:2]
            if stream.frame_hw is not None and hw != stream.frame_hw:
                raise ProtocolError(f"frame of {hw[1]}x{hw[0]} pixels in a sequence of {stream.frame_hw[1]}x"
                                    f"{stream.frame_hw[0]}: send reset before changing the size", "bad_frame")
        except ProtocolError as err:
            return self._refuse(stream, frame_id, err.code, str(err))
        if stream.ending is not None:  # the server began shutting down while the frame was decoded
            return self._refuse(stream, frame_id, "shutting_down", "the server is shutting down: this frame is "
                                "not taken")
        stream.frame_hw = hw
        frame = QueuedFrame(frame_id, image, header.get("keyframe"), header.get("name"), time.monotonic())
        dropped = stream.offer(frame)
        if dropped is not None:
            self.metrics.frames.labels("dropped").inc()
            stream.outbox.put_nowait(text({"type": "dropped", "frame": dropped.frame_id, "reason": "queue full"}))
        self.worker.wake()
        return None

    def _refuse(self, stream: ServedStream, frame_id: int, code: str, message: str) -> None:
        self.metrics.frames.labels("refused").inc()
        stream.outbox.put_nowait(_error(code, message, frame=frame_id))

    def _on_control(self, stream: ServedStream, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind not in ("reset", "close"):
            raise ProtocolError(f"a client sends frames (binary) and the text messages reset and close, got type "
                                f"{kind!r}")
        if stream.ending is not None:
            raise ProtocolError(f"{kind}: the session is ending already", "closing")
        if len(stream.queue) >= 2 * self.config.queue_size:
            raise ProtocolError(f"{kind}: the queue is full of controls; wait for their answers", "queue_full")
        if kind == "reset":
            stream.frame_hw = None
            stream.queue.append(Control("reset"))
        else:
            stream.ending = "close"
            stream.queue.append(Control("finish", "close"))
        self.worker.wake()

    async def _end(self, stream: ServedStream, sender: asyncio.Task) -> None:
        """However the connection ended: nothing more for it, its cache freed after any step
        in progress (on the model thread)."""
        stream.gone = True
        stream.queue.clear()
        self.streams.pop(stream.id, None)
        if not sender.done():
            sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        if stream.map is not None:
            await asyncio.get_running_loop().run_in_executor(None, stream.map.close)
            stream.map = None
        await self.worker.on_model_thread(stream.session.close)
        stream.released = True
        stream.waiting.clear()
        log.info("session %s ended (%d open)", stream.id[:8], len(self.streams))

    # ------------------------------------------------------------------ answers
    def _deliver(self, outcomes) -> None:
        """A round's outcomes into the sessions' outboxes, in order (on the event loop)."""
        for stream, item, result in outcomes:
            if stream.gone:
                continue
            if isinstance(result, BaseException):
                stream.ending = "error"
                stream.queue.clear()
                stream.outbox.put_nowait(_error("internal", f"the server failed on this session: {result}",
                                                fatal=True))
                stream.outbox.put_nowait(_Close(1011, "internal error"))
                continue
            answered = set()
            for pred in result:
                frame = stream.waiting.get(pred.index) if pred.provisional else stream.waiting.pop(pred.index, None)
                if frame is not None:
                    answered.add(frame.frame_id)
                    stream.outbox.put_nowait(_Answer(pred, frame, stream.sequence))
                    if stream.map is not None and not pred.provisional:
                        self._to_map(stream, pred, frame)
            if isinstance(item, QueuedFrame) and item.frame_id not in answered:
                stream.outbox.put_nowait(text({"type": "buffered", "frame": item.frame_id}))
            elif isinstance(item, Control):
                self._finish_control(stream, item)

    def _to_map(self, stream: ServedStream, pred, frame: QueuedFrame) -> None:
        try:
            stream.map.take(pred, frame.image)
        except RuntimeError as err:  # the map's thread failed: the session goes on without it
            stream.map = None
            stream.outbox.put_nowait(_error("map_failed", f"the global map stopped: {err}; the session's results "
                                            "go on without it"))

    def _retire_map(self, stream: ServedStream, *, another: bool) -> None:
        """The sequence's final map message, queued where its place in the answers is: solved
        off the event loop, and sent before anything queued after it."""
        if stream.map is None:
            return
        solve = stream.map.retire(another=another)
        if not another:
            stream.map = None

        def final() -> str:
            try:
                return text(solve())
            except Exception as err:  # noqa: BLE001 (any failure of the map is told, not raised)
                log.warning("session %s: the global map failed: %s", stream.id[:8], err)
                return _error("map_failed", f"the global map failed: {err}")

        stream.outbox.put_nowait(asyncio.get_running_loop().run_in_executor(None, final))

    def _finish_control(self, stream: ServedStream, control: Control) -> None:
        stream.waiting.clear()
        stream.next_index = 0
        self._retire_map(stream, another=control.kind == "reset")
        if control.kind == "reset":
            stream.sequence += 1
            stream.outbox.put_nowait(text({"type": "reset", "sequence": stream.sequence}))
        elif control.reason == "shutdown":
            stream.outbox.put_nowait(_error("shutting_down", "the server is shutting down: every frame it took was "
                                            "answered; frames sent after this are not", fatal=True))
            stream.outbox.put_nowait(_Close(1001, "server shutting down"))
        else:
            stream.outbox.put_nowait(text({"type": "closed", "sequence": stream.sequence}))
            stream.outbox.put_nowait(_Close(1000, "closed"))

    async def _send_loop(self, stream: ServedStream, ws) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionClosed):
            while True:
                item = await stream.outbox.get()
                if isinstance(item, asyncio.Future):  # a message still being made (a map's final solve)
                    item = await item
                if isinstance(item, _Close):
                    await ws.close(item.code, item.reason)
                    return
                if isinstance(item, _Answer):
                    latency = time.monotonic() - item.frame.arrived
                    if not item.pred.provisional:
                        self.metrics.frames.labels("done").inc()
                        self.metrics.latency.observe(latency)
                    item = await loop.run_in_executor(None, result_message, item.pred, item.frame, item.sequence,
                                                      latency, stream.options.outputs)
                await ws.send(item)
                stream.last_active = time.monotonic()
                if stream.queue and not stream.congested():  # the worker left its queue while answers piled up
                    self.worker.wake()

    async def _reap_idle(self) -> None:
        """End the sessions that showed no life for ``idle_timeout`` (see `_end_idle`)."""
        period = min(1.0, self.config.idle_timeout / 4)
        while True:
            await asyncio.sleep(period)
            self._end_idle(time.monotonic())  # a function: no session is held across the sleep

    def _end_idle(self, now: float) -> None:
        """A session is idle when for ``idle_timeout`` its client sent nothing, no answer of its
        was sent and none of its items was on the model: its client is told and its queue
        emptied. One still there an ``idle_timeout`` later has not read even that (a client
        that stopped reading, or a peer gone without closing): its connection is dropped."""
        for stream in list(self.streams.values()):
            if stream.on_model or stream.ending == "shutdown" or now - stream.last_active <= self.config.idle_timeout:
                continue
            if stream.ending == "idle":
                log.info("session %s: its client read nothing for %g s: its connection is dropped", stream.id[:8],
                         self.config.idle_timeout)
                stream.connection.transport.abort()  # its handler then ends it, as any connection that goes
                stream.last_active = now
                continue
            stream.ending, stream.last_active = "idle", now
            stream.queue.clear()
            stream.outbox.put_nowait(_error("idle_timeout", f"nothing from or to this client for "
                                            f"{self.config.idle_timeout:g} s: the session ends", fatal=True))
            stream.outbox.put_nowait(_Close(1000, "idle"))
