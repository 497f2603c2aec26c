"""The wire format of `mapstream serve` (docs/SERVE.md), shared by the server and the client.

One WebSocket connection is one session. Control messages and answers are JSON text
messages with a ``type``; a frame, and a result that carries arrays, is a binary message:

    b"MSF1" | uint32 big-endian header length | JSON header (UTF-8) | payload

The frame header says how its payload is encoded (``jpeg``, ``png`` or ``raw`` uint8 of a
declared ``[H, W, 3]`` shape); a result's header lists its arrays (``arrays``), each zlib
compressed, in payload order. Everything here is pure: no sockets, no model.
"""
from __future__ import annotations

import io
import json
import struct
import zlib
from typing import Any

import numpy as np

__all__ = [
    "ARRAY_DTYPES", "ENCODINGS", "MAGIC", "PROTOCOL_VERSION", "ProtocolError", "decode_arrays", "decode_image",
    "encode_arrays", "image_size", "open_image", "pack", "parse_json", "unpack",
]

PROTOCOL_VERSION = 1
MAGIC = b"MSF1"
"""The first four bytes of every binary message of protocol version 1."""
ENCODINGS = ("jpeg", "png", "raw")
ARRAY_DTYPES = ("float16", "float32", "uint8")
_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 64 * 1024
"""A binary message's JSON header is small (a few fields): a longer one is refused unread."""


class ProtocolError(ValueError):
    """A message that does not follow the protocol; ``code`` names the kind for the client,
    ``frame`` the frame's id when it is known."""

    def __init__(self, message: str, code: str = "bad_message", frame: int | None = None) -> None:
        super().__init__(message)
        self.code, self.frame = code, frame


def pack(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """A binary message: the magic, the header's length, the header as JSON, the payload."""
    text = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(text)) + text + payload


def unpack(message: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header and payload of a binary message (`pack`'s inverse), or a ProtocolError."""
    view = memoryview(message)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise ProtocolError(f"a binary message starts with {MAGIC!r} and the header's length (protocol "
                            f"{PROTOCOL_VERSION}); this one starts with {bytes(view[:8])!r}")
    (length,) = _LENGTH.unpack(view[4:8])
    if length > MAX_HEADER_BYTES or 8 + length > len(view):
        raise ProtocolError(f"a binary message's header says it is {length} bytes long; the message has "
                            f"{len(view) - 8} after the length and headers are at most {MAX_HEADER_BYTES}")
    header = parse_json(bytes(view[8 : 8 + length]))
    return header, view[8 + length :]


def parse_json(text: str | bytes) -> dict[str, Any]:
    """A JSON object, or a ProtocolError saying what was wrong."""
    try:
        value = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"not JSON: {err}") from err
    except RecursionError as err:  # Python's parser recurses per nested array or object
        raise ProtocolError("not a message: JSON nested too deeply (a message is an object of a few plain "
                            "fields)") from err
    if not isinstance(value, dict):
        raise ProtocolError(f"a message is a JSON object, got {type(value).__name__}")
    return value


_SIGNATURES = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n"}
"""How a JPEG and a PNG file begin."""
_PIL_FORMATS = {"jpeg": ["JPEG"], "png": ["PNG"]}
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)
"""What Pillow raises for a corrupt or truncated file (UnidentifiedImageError is an OSError)."""


def open_image(encoding: str, payload: memoryview):
    """The frame's image file opened (lazily: nothing decoded yet) by Pillow's plugin of its
    encoding alone, once its first bytes are that format's signature: no other plugin of
    Pillow (GIF, TIFF, EPS through Ghostscript, ...) ever reads a client's bytes. A
    ProtocolError ("bad_frame") for bytes of another format, whatever the header says."""
    from PIL import Image

    signature = _SIGNATURES[encoding]
    if bytes(payload[: len(signature)]) != signature:
        raise ProtocolError(f"the frame's header says {encoding}, and its data is not a {encoding.upper()} file (it "
                            f"starts with {bytes(payload[:8])!r}): this server decodes JPEG, PNG and raw frames only",
                            "bad_frame")
    return Image.open(io.BytesIO(payload), formats=_PIL_FORMATS[encoding])


def image_size(header: dict[str, Any], payload: memoryview) -> tuple[int, int]:
    """(height, width) of a frame message's image, from its header (raw) or the image file's
    own header (jpeg, png): no pixel is decoded, so a frame too large is refused unread."""
    encoding = header.get("encoding")
    if encoding not in ENCODINGS:
        raise ProtocolError(f"frame encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    if encoding == "raw":
        shape = header.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and shape[2] == 3
                and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)):
            raise ProtocolError(f"a raw frame declares its shape [H, W, 3] (uint8), got {shape!r}", "bad_frame")
        return shape[0], shape[1]
    from PIL import Image

    try:
        with open_image(header["encoding"], payload) as image:
            width, height = image.size
    except Image.DecompressionBombError as err:  # PIL's own bound, far above any server's
        raise ProtocolError(f"the frame is far too large: {err}", "frame_too_large") from err
    except _PIL_ERRORS as err:
        raise ProtocolError(f"the frame is not a readable {encoding} image: {err}", "bad_frame") from err
    return height, width


def decode_image(header: dict[str, Any], payload: memoryview) -> np.ndarray:
    """The frame's pixels as a [H, W, 3] uint8 array (RGB), or a ProtocolError ("bad_frame")
    naming what is wrong: a truncated or corrupt image, a raw payload of the wrong length."""
    height, width = image_size(header, payload)
    if header["encoding"] == "raw":
        if len(payload) != height * width * 3:
            raise ProtocolError(f"a raw frame of shape [{height}, {width}, 3] is {height * width * 3} bytes, "
                                f"got {len(payload)}", "bad_frame")
        return np.frombuffer(payload, dtype=np.uint8).reshape(height, width, 3).copy()
    from ..io.images import to_rgb

    try:
        with open_image(header["encoding"], payload) as image:
            image.load()
            return np.asarray(to_rgb(image), dtype=np.uint8).copy()
    except _PIL_ERRORS as err:  # PIL's words for truncated and corrupt data
        raise ProtocolError(f"the frame's {header['encoding']} data is corrupt or truncated: {err}",
                            "bad_frame") from err


def encode_arrays(arrays: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], bytes]:
    """Each array zlib compressed: their descriptions (for a header's ``arrays``) and the
    payload. The dtype is the array's (one of ARRAY_DTYPES), little-endian."""
    described, parts = [], []
    for name, array in arrays.items():
        dtype = np.dtype(array.dtype).newbyteorder("<")
        if dtype.name not in ARRAY_DTYPES:
            raise ValueError(f"array {name}: dtype {dtype.name} is not one of {ARRAY_DTYPES}")
        data = zlib.compress(np.ascontiguousarray(array, dtype=dtype).tobytes(), 1)
        described.append({"name": name, "dtype": dtype.name, "shape": list(array.shape), "compression": "zlib",
                          "bytes": len(data)})
        parts.append(data)
    return described, b"".join(parts)


def decode_arrays(described: list[dict[str, Any]], payload: memoryview) -> dict[str, np.ndarray]:
    """`encode_arrays`' inverse, checked against the descriptions (a ProtocolError if not)."""
    arrays, start = {}, 0
    for entry in described:
        try:
            end = start + int(entry["bytes"])
            dtype = np.dtype(entry["dtype"]).newbyteorder("<")
            if entry.get("compression") != "zlib" or dtype.name not in ARRAY_DTYPES or end > len(payload):
                raise ValueError(f"{entry!r} does not describe a zlib array within the payload")
            flat = np.frombuffer(zlib.decompress(payload[start:end]), dtype=dtype)
            arrays[entry["name"]] = flat.reshape(entry["shape"]).astype(dtype.newbyteorder("="))
        except (KeyError, TypeError, ValueError, zlib.error) as err:
            raise ProtocolError(f"result array {entry!r}: {err}") from err
        start = end
    return arrays
