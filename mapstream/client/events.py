"""What a client receives: a `Result` per predicted frame, an `Event` for everything else
(``buffered``, ``dropped``, ``error``, ``reset``, ``closed``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..serve.protocol import ProtocolError, decode_arrays, parse_json, unpack

__all__ = ["Event", "Result", "ServiceError", "parse_answer"]


class ServiceError(RuntimeError):
    """The server refused something or ended the session; ``code`` names the kind (see
    docs/SERVE.md), ``frame`` the frame it concerns, if one."""

    def __init__(self, message: str, code: str = "error", frame: int | None = None) -> None:
        super().__init__(message)
        self.code, self.frame = code, frame


@dataclass
class Result:
    """One frame's prediction. Conventions as `FramePrediction`'s: OpenCV camera axes,
    ``T_world_cam`` camera-to-world (here 4x4), the world the first frame's camera."""

    frame: int
    """The id the client gave the frame."""
    index: int
    """Its position in the sequence (0 = the first frame after the last reset)."""
    sequence: int
    """Resets before it."""
    name: str | None
    keyframe: bool
    scale_frame: bool
    provisional: bool
    T_world_cam: np.ndarray  # [4, 4] float32
    K: np.ndarray  # [3, 3] float32
    pose_enc: np.ndarray  # [9] float32
    latency_s: float
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    """What the session asked for: depth, confidence ([h, w]), points ([N, 3]) and colors ([N, 3] uint8)."""

    @property
    def depth(self) -> np.ndarray | None:
        return self.arrays.get("depth")

    @property
    def confidence(self) -> np.ndarray | None:
        return self.arrays.get("confidence")

    def prediction(self):
        """The result as a `mapstream.FramePrediction` (CPU tensors); depth and confidence
        as sent (zeros when the session did not ask for them)."""
        import torch

        from ..geometry import invert_se3
        from ..session import FramePrediction

        T = torch.from_numpy(self.T_world_cam[:3].copy())
        hw = self.depth.shape if self.depth is not None else (0, 0)
        depth = torch.from_numpy(self.depth.astype(np.float32)) if self.depth is not None else torch.zeros(hw)
        conf = self.confidence
        return FramePrediction(
            index=self.index, pose_enc=torch.from_numpy(self.pose_enc.copy()), T_world_cam=T,
            T_cam_world=invert_se3(T), K=torch.from_numpy(self.K.copy()), depth=depth,
            depth_conf=torch.from_numpy(conf.astype(np.float32)) if conf is not None else torch.zeros(hw),
            keyframe=self.keyframe, scale_frame=self.scale_frame, provisional=self.provisional, name=self.name,
        )


@dataclass
class Event:
    """Any other message: ``type`` and its fields (``frame``, ``code``, ``message``...)."""

    type: str
    data: dict[str, Any]

    @property
    def frame(self) -> int | None:
        return self.data.get("frame")

    @property
    def fatal(self) -> bool:
        return bool(self.data.get("fatal"))

    def error(self) -> ServiceError:
        return ServiceError(f"{self.data.get('code')}: {self.data.get('message')}", self.data.get("code", "error"),
                            self.frame)


def _f32(value: Any, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(value, dtype=np.float64).astype(np.float32).reshape(shape)


def parse_answer(message: str | bytes) -> Result | Event:
    """A server message as a `Result` or an `Event` (a ProtocolError when it is neither)."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        header, payload = unpack(bytes(message))
        arrays = decode_arrays(header.get("arrays", []), payload)
    else:
        header, arrays = parse_json(message), {}
    kind = header.get("type")
    if kind != "result":
        if not isinstance(kind, str):
            raise ProtocolError(f"a server message without a type: {header!r}")
        return Event(kind, header)
    try:
        return Result(
            frame=int(header["frame"]), index=int(header["index"]), sequence=int(header["sequence"]),
            name=header.get("name"), keyframe=bool(header["keyframe"]), scale_frame=bool(header["scale_frame"]),
            provisional=bool(header["provisional"]), T_world_cam=_f32(header["T_world_cam"], (4, 4)),
            K=_f32(header["K"], (3, 3)), pose_enc=_f32(header["pose_enc"], (9,)),
            latency_s=float(header.get("latency_s", float("nan"))), arrays=arrays,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"a result without its fields: {err}") from err
