"""The synchronous client of `mapstream serve`.

    client = Client("ws://127.0.0.1:8765", token=token)
    with client.open_session(settings={"num_scale_frames": 8}, depth=True) as session:
        for frame in frames:                 # [H, W, 3] uint8, [3, H, W] floats in [0, 1], JPEG/PNG bytes, PIL
            session.send(frame)
            for answer in session.poll():    # what has arrived, without waiting
                ...
        answers = session.close()            # the rest, once every frame is answered

`send` keeps the server's rules by default: it waits while ``queue_size`` frames are
unanswered (so none is dropped) and spaces frames by the session's ``max_fps``. One
`RemoteSession` is one connection; use it from one thread.
"""
from __future__ import annotations

import io
import json
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..export.points import DEFAULT_CONF_THRESHOLD
from ..serve.protocol import PROTOCOL_VERSION, pack
from .events import Event, Result, ServiceError, parse_answer

__all__ = ["Client", "RemoteSession"]

_SETTLING = ("buffered", "dropped", "error")  # events that answer a frame (with a result: the first)


class Client:
    """Where the server is and how to be let in: ``token`` for ``Authorization: Bearer``;
    ``origin``: an Origin header to send (browsers do; programs need none)."""

    def __init__(self, url: str, *, token: str | None = None, origin: str | None = None,
                 open_timeout: float = 30.0) -> None:
        self.url, self.token, self.origin, self.open_timeout = url, token, origin, open_timeout

    def open_session(self, *, settings: dict[str, Any] | None = None, preprocess: dict[str, Any] | None = None,
                     depth: bool = False, confidence: bool = False, points: bool = False, dtype: str = "float16",
                     stride: int = 1, conf_threshold: float = DEFAULT_CONF_THRESHOLD, mode: str | None = None,
                     frames: int | None = None, loop_closure: bool = False) -> RemoteSession:
        """Connect and open a session (docs/SERVE.md, "Opening"). ``mode``: "auto", "streaming"
        or "windowed" (None: the server's); ``frames``: how many frames will be sent, when known
        (the session is then planned as `mapstream run` plans an input of that length);
        ``loop_closure``: the server keeps a global map beside the session and sends ``map``
        events (corrected keyframe cameras) as it closes loops and when a sequence ends. Raises
        ServiceError when the server refuses the connection (its HTTP answer's text) or the options."""
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            ws = connect(self.url, additional_headers=headers, origin=self.origin, open_timeout=self.open_timeout,
                         max_size=None, compression=None, proxy=None)
        except InvalidStatus as err:
            body = err.response.body.decode(errors="replace").strip()
            raise ServiceError(f"{self.url} refused the connection: HTTP {err.response.status_code} {body}",
                               f"http_{err.response.status_code}") from err
        outputs = {"depth": depth, "confidence": confidence, "points": points, "dtype": dtype, "stride": stride,
                   "conf_threshold": conf_threshold}
        open_message = {"type": "open", "version": PROTOCOL_VERSION, "settings": settings, "preprocess": preprocess,
                        "outputs": outputs, "mode": mode, "frames": frames, "loop_closure": loop_closure}
        ws.send(json.dumps(open_message))
        answer = parse_answer(ws.recv(timeout=self.open_timeout))
        if not (isinstance(answer, Event) and answer.type == "opened"):
            ws.close()
            raise answer.error() if isinstance(answer, Event) else ServiceError(f"unexpected answer {answer!r}")
        return RemoteSession(ws, answer.data)


class RemoteSession:
    """An open session on the server (see the module docstring). ``info``: the server's
    ``opened`` message (limits, effective settings, the model)."""

    def __init__(self, ws, info: dict[str, Any]) -> None:
        self._ws, self.info = ws, info
        self.id: str = info["session"]
        self.queue_size: int = int(info["queue_size"])
        self._interval = 1.0 / float(info["max_fps"])
        self._last_send = -float("inf")
        self._next_id = 0
        self.unanswered: set[int] = set()
        self._inbox: deque[Result | Event] = deque()
        self.ended: Event | None = None  # the closed or fatal error event, once received

    # ------------------------------------------------------------------ sending
    def send(self, frame, *, keyframe: bool | None = None, name: str | None = None, encoding: str = "png",
             wait: bool = True) -> int:
        """Send one frame; returns its id. ``encoding``: how arrays and PIL images travel
        ("png" lossless, "jpeg", "raw"); bytes are sent as the image file they are. ``wait``:
        keep to the server's queue and frame rate (see the module docstring)."""
        if self.ended is not None:
            raise ServiceError(f"the session has ended ({self.ended.data})", "ended")
        header, payload = _frame_payload(frame, encoding)
        if wait:
            while len(self.unanswered) >= self.queue_size:
                self._inbox.append(self._receive_one(None))
            pause = self._last_send + self._interval - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        frame_id, self._next_id = self._next_id, self._next_id + 1
        header.update(frame=frame_id, keyframe=keyframe, name=name)
        self._ws.send(pack(header, payload))
        self._last_send = time.monotonic()
        self.unanswered.add(frame_id)
        return frame_id

    def reset(self) -> None:
        """Start a new sequence after the frames sent so far (a scene cut)."""
        self._ws.send('{"type":"reset"}')

    # ------------------------------------------------------------------ receiving
    def _receive_one(self, timeout: float | None) -> Result | Event:
        from websockets.exceptions import ConnectionClosed

        try:
            answer = parse_answer(self._ws.recv(timeout=timeout))
        except ConnectionClosed as err:
            if self.ended is None:
                self.ended = Event("error", {"code": "connection_closed", "message": str(err), "fatal": True})
            raise ServiceError(f"the connection closed: {err}", "connection_closed") from err
        if isinstance(answer, Result) or answer.type in _SETTLING:
            self.unanswered.discard(answer.frame)
        if isinstance(answer, Event) and (answer.type == "closed" or answer.fatal):
            self.ended = answer
        return answer

    def receive(self, timeout: float | None = None) -> Result | Event | None:
        """The next answer (waiting up to ``timeout`` seconds, None: for ever); None when
        none came in time."""
        if self._inbox:
            return self._inbox.popleft()
        try:
            return self._receive_one(timeout)
        except TimeoutError:
            return None

    def poll(self) -> list[Result | Event]:
        """Every answer that has arrived, without waiting."""
        answers = list(self._inbox)
        self._inbox.clear()
        while self.ended is None and (answer := self.receive(0)) is not None:
            answers.append(answer)
        return answers

    def answers(self, timeout: float | None = None) -> Iterator[Result | Event]:
        """Answers as they come until the session ends (``timeout``: longest wait for one)."""
        while True:
            answer = self.receive(timeout)
            if answer is None:
                raise TimeoutError(f"no answer within {timeout} s")
            yield answer
            if answer is self.ended:
                return

    def close(self, timeout: float | None = 60.0) -> list[Result | Event]:
        """Finish: the server answers every frame sent (the scale phase of a short sequence
        included), then the session ends. Returns the answers not yet received."""
        answers = list(self._inbox)
        self._inbox.clear()
        if self.ended is None:
            self._ws.send('{"type":"close"}')
            answers += list(self.answers(timeout))
        self._ws.close()
        return answers

    def abort(self) -> None:
        """Drop the connection without finishing (the server frees the session)."""
        self._ws.close()

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()


def _frame_payload(frame, encoding: str) -> tuple[dict[str, Any], bytes]:
    """The header fields and payload of a frame (see `RemoteSession.send`)."""
    if isinstance(frame, (bytes, bytearray, memoryview)):
        data = bytes(frame)
        kind = "png" if data[:8] == b"\x89PNG\r\n\x1a\n" else "jpeg" if data[:2] == b"\xff\xd8" else None
        if kind is None:
            raise ValueError("bytes are sent as a JPEG or PNG file; this is neither (for raw pixels send an array)")
        return {"encoding": kind}, data
    array = _as_uint8(frame)
    if encoding == "raw":
        return {"encoding": "raw", "shape": list(array.shape)}, array.tobytes()
    if encoding not in ("png", "jpeg"):
        raise ValueError(f"encoding is png, jpeg or raw, got {encoding!r}")
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG" if encoding == "png" else "JPEG",
                                **({"compress_level": 1} if encoding == "png" else {"quality": 90}))
    return {"encoding": encoding}, buffer.getvalue()


def _as_uint8(frame) -> np.ndarray:
    """[H, W, 3] uint8 from an array of that shape, a [3, H, W] float tensor in [0, 1]
    (rounded: a frame of uint8 / 255 values comes back exactly) or a PIL image."""
    if hasattr(frame, "convert") and hasattr(frame, "size"):  # a PIL image
        return np.asarray(frame.convert("RGB"), dtype=np.uint8)
    if hasattr(frame, "detach"):  # a torch tensor
        t = frame.detach().float().cpu()
        if t.dim() == 4 and t.shape[0] == 1:
            t = t[0]
        if t.dim() != 3 or t.shape[0] != 3:
            raise ValueError(f"a tensor frame is [3, H, W] in [0, 1], got shape {list(t.shape)}")
        return (t.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).contiguous().numpy()
    array = np.asarray(frame)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"an array frame is [H, W, 3] uint8, got {array.dtype} {list(array.shape)}")
    return np.ascontiguousarray(array)
