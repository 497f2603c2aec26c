"""Tiny ONNX models for the sky tests, written without the ``onnx`` package.

The ONNX file format is a protobuf ``ModelProto``; the few messages needed here are encoded by
hand (field numbers from onnx/onnx.proto3). :func:`blue_sky_model` has the real model's
signature, input ``[1, 3, S, S]`` float32 and output ``[1, 1, S, S]``, and scores a pixel by
``sigmoid(gain * (blue - red))`` on the ImageNet-normalised input: high on sky blue, low on
browns and greys.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

_FLOAT = 1  # TensorProto.DataType.FLOAT


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _tensor(name: str, array: np.ndarray) -> bytes:
    """TensorProto: dims=1, data_type=2, name=8, raw_data=9."""
    dims = b"".join(_int(1, d) for d in array.shape)
    return dims + _int(2, _FLOAT) + _bytes(8, name) + _bytes(9, array.astype("<f4").tobytes())


def _value_info(name: str, shape: list[int | str]) -> bytes:
    """ValueInfoProto{name=1, type=2: TypeProto{tensor_type=1: {elem_type=1, shape=2}}}."""
    dims = b"".join(_bytes(1, _int(1, d) if isinstance(d, int) else _bytes(2, d)) for d in shape)
    tensor_type = _int(1, _FLOAT) + _bytes(2, dims)
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor_type))


def _node(op: str, inputs: list[str], outputs: list[str]) -> bytes:
    """NodeProto: input=1, output=2, op_type=4."""
    return b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs) + _bytes(4, op)


def blue_sky_model(
    size: int = 320, *, gain: float = 1.0, dynamic: bool = False, channels: int = 3, input_name: str = "input.1"
) -> bytes:
    """Serialized ONNX model: Conv 1x1 (weights ``gain * [-1, 0, 1]``) then Sigmoid.

    ``dynamic`` declares batch, height and width as symbolic dims (the segmenter then uses 320);
    ``channels`` other than 3 gives a model with the wrong input (its weights are ``gain``).
    """
    weight = np.array([-gain, 0.0, gain] if channels == 3 else [gain] * channels, np.float32)
    weight = weight.reshape(1, channels, 1, 1)
    bias = np.zeros(1, np.float32)
    spatial: list[int | str] = ["h", "w"] if dynamic else [size, size]
    graph = (
        _bytes(1, _node("Conv", [input_name, "W", "B"], ["logits"]))
        + _bytes(1, _node("Sigmoid", ["logits"], ["score"]))
        + _bytes(2, "blue_sky")
        + _bytes(5, _tensor("W", weight))
        + _bytes(5, _tensor("B", bias))
        + _bytes(11, _value_info(input_name, ["n" if dynamic else 1, channels, *spatial]))
        + _bytes(12, _value_info("score", ["n" if dynamic else 1, 1, *spatial]))
    )
    opset = _bytes(1, "") + _int(2, 13)
    return _int(1, 8) + _bytes(8, opset) + _bytes(2, "mapstream-tests") + _bytes(7, graph)


def rgb_to_model_input(rgb: tuple[int, int, int]) -> np.ndarray:
    """The normalised [3] input vector the model sees for one 8-bit colour (for expected values)."""
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    return (np.array(rgb, np.float32) / 255 - mean) / std


SKY_BLUE = (135, 206, 235)
BROWN = (120, 90, 60)
GREY = (128, 128, 128)


def sky_scene(height: int = 64, width: int = 96) -> np.ndarray:
    """``[H, W, 3]`` uint8: sky blue above row H/2; below it brown (left half) and grey (right).

    With :func:`blue_sky_model` the min-max normalised scores are 1 (sky), 0 (brown) and about
    0.45 (grey): only the top half is sky at threshold 0.9, while the reference's 1/255 rule
    would also call the grey quarter sky.
    """
    image = np.empty((height, width, 3), np.uint8)
    image[: height // 2] = SKY_BLUE
    image[height // 2 :, : width // 2] = BROWN
    image[height // 2 :, width // 2 :] = GREY
    return image


def write_model(folder: Path, name: str = "skyseg.onnx", **options: object) -> Path:
    """Write :func:`blue_sky_model` (``options`` passed on) to ``folder/name``; returns the path."""
    path = Path(folder) / name
    path.write_bytes(blue_sky_model(**options))
    return path


__all__ = ["BROWN", "GREY", "SKY_BLUE", "blue_sky_model", "rgb_to_model_input", "sky_scene", "write_model"]
