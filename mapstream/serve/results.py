"""Predictions as the messages a client receives (docs/SERVE.md, "Results").

The camera travels as JSON numbers: a float32 value printed by Python's float repr reads back
as the same float32, so poses and intrinsics arrive exactly. Arrays travel in a binary
message, zlib compressed, in the dtype the session asked for.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ..geometry import unproject_depth
from ..session import FramePrediction
from .options import OutputOptions
from .protocol import encode_arrays, pack
from .stream import QueuedFrame

__all__ = ["result_header", "result_message", "text"]


def text(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"))


def _matrix(t: torch.Tensor) -> list:
    return t.detach().float().cpu().numpy().astype(np.float64).tolist()


def result_header(pred: FramePrediction, frame: QueuedFrame, sequence: int, latency: float) -> dict[str, Any]:
    """The JSON part of a result: the camera (camera-to-world 4x4, intrinsics 3x3, the 9 pose
    encoding numbers) and what the frame is."""
    T = torch.eye(4, dtype=torch.float32)
    T[:3] = pred.T_world_cam.detach().float().cpu()
    return {
        "type": "result", "frame": frame.frame_id, "name": frame.name, "index": int(pred.index),
        "sequence": sequence, "keyframe": bool(pred.keyframe), "scale_frame": bool(pred.scale_frame),
        "provisional": bool(pred.provisional), "T_world_cam": _matrix(T), "K": _matrix(pred.K),
        "pose_enc": _matrix(pred.pose_enc), "latency_s": round(latency, 6),
    }


def _arrays(pred: FramePrediction, frame: QueuedFrame, outputs: OutputOptions) -> dict[str, np.ndarray]:
    step, dtype, arrays = outputs.stride, np.dtype(outputs.dtype), {}
    if outputs.depth:
        arrays["depth"] = pred.depth.float().cpu().numpy()[::step, ::step].astype(dtype)
    if outputs.confidence:
        arrays["confidence"] = pred.depth_conf.float().cpu().numpy()[::step, ::step].astype(dtype)
    if outputs.points:
        world = unproject_depth(pred.depth.float().cpu(), pred.K.float().cpu(), pred.T_world_cam.float().cpu())
        world = world.numpy()[::step, ::step]
        keep = pred.depth_conf.float().cpu().numpy()[::step, ::step] > outputs.conf_threshold
        keep &= np.isfinite(world).all(axis=-1)
        arrays["points"] = world[keep].astype(dtype)
        arrays["colors"] = frame.image[::step, ::step][keep].astype(np.uint8)
    return arrays


def result_message(pred: FramePrediction, frame: QueuedFrame, sequence: int, latency: float,
                   outputs: OutputOptions) -> str | bytes:
    """A text message when the session asked for no array, else a binary one whose header is
    the same JSON with ``arrays`` describing the payload."""
    header = result_header(pred, frame, sequence, latency)
    if not outputs.any_array:
        return text(header)
    described, payload = encode_arrays(_arrays(pred, frame, outputs))
    return pack({**header, "arrays": described}, payload)
