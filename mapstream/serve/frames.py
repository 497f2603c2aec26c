"""A frame message checked and decoded into the pixels the model gets.

The checks run before the expensive part: the header's fields first, then the image's size
from the image file's own header (a frame of too many pixels is refused before a pixel is
decoded), then decoding, the session's preprocessing and the patch-size rule. A session's
preprocessing never makes a frame larger than the pixel limit (`parse_open` refuses an
``image_size`` that could), and enlarges a frame at most ``MAX_ENLARGEMENT`` times: a
thumbnail blown up to a full frame is refused, not guessed at.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .protocol import ProtocolError, decode_image, image_size

__all__ = ["check_frame_message", "decode_frame", "MAX_ENLARGEMENT", "MAX_NAME_LENGTH"]

MAX_NAME_LENGTH = 256
MAX_ENLARGEMENT = 8
"""Most times a session's preprocessing may enlarge a frame's sides (a 65-pixel-wide frame
for a width of 518); a smaller frame holds too little for the model to see."""
_FRAME_FIELDS = {"frame", "encoding", "shape", "keyframe", "name"}


def check_frame_message(header: dict[str, Any], last_id: int | None) -> int:
    """The frame's id, once its header's fields are valid: ids are integers that increase
    within a connection (the answers name them), ``keyframe`` is true, false or null, ``name``
    a short string or null. A ProtocolError otherwise."""
    frame_id = header.get("frame")
    if isinstance(frame_id, bool) or not isinstance(frame_id, int) or frame_id < 0:
        raise ProtocolError(f"a frame's header has its id \"frame\", an integer >= 0; got {frame_id!r}", "bad_frame")
    if last_id is not None and frame_id <= last_id:
        raise ProtocolError(f"frame ids increase within a session: {frame_id} after {last_id}", "bad_frame", frame_id)
    unknown = sorted(set(header) - _FRAME_FIELDS)
    if unknown:
        raise ProtocolError(f"frame {frame_id}: unknown header fields {unknown}", "bad_frame", frame_id)
    if header.get("keyframe") not in (True, False, None):
        raise ProtocolError(f"frame {frame_id}: keyframe is true, false or null", "bad_frame", frame_id)
    name = header.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_LENGTH):
        raise ProtocolError(f"frame {frame_id}: name is a string of at most {MAX_NAME_LENGTH} characters or null",
                            "bad_frame", frame_id)
    return frame_id


def decode_frame(header: dict[str, Any], payload, preprocess: tuple[str, int] | None, max_pixels: int,
                 patch_size: int) -> np.ndarray:
    """The frame as the model gets it, [H, W, 3] uint8: decoded, preprocessed when the session
    asked (as `mapstream run` preprocesses), with sides that are multiples of the patch size.
    A ProtocolError (``frame_too_large``, ``bad_frame``) says what is wrong."""
    height, width = image_size(header, payload)
    if height * width > max_pixels:
        raise ProtocolError(f"frame of {width}x{height} = {height * width} pixels; this server takes at most "
                            f"{max_pixels}", "frame_too_large")
    image = decode_image(header, payload)
    if preprocess is not None:
        image = _preprocessed(image, *preprocess, patch_size)
    h, w = image.shape[:2]
    if h % patch_size or w % patch_size:
        raise ProtocolError(f"frame of {w}x{h} pixels: the model takes sides that are multiples of {patch_size}; "
                            "resize it, or open the session with preprocess", "bad_frame")
    return image


def _preprocessed(image: np.ndarray, mode: str, image_size_: int, patch_size: int) -> np.ndarray:
    import torch
    from PIL import Image

    from ..io.images import preprocess_image, resized_shape

    height, width = image.shape[:2]
    new_w, new_h = resized_shape(width, height, mode, image_size_, patch_size)
    enlargement = max(new_w / width, new_h / height)
    if enlargement > MAX_ENLARGEMENT:
        side = "wide" if new_w == image_size_ else "high"
        raise ProtocolError(f"frame of {width}x{height} pixels: preprocessing to image_size {image_size_} would enlarge "
                            f"it {enlargement:.1f} times, and this server enlarges frames at "
                            f"most {MAX_ENLARGEMENT} times: send frames at least "
                            f"{math.ceil(image_size_ / MAX_ENLARGEMENT)} pixels {side}, or open the session with a "
                            "smaller preprocess image_size", "bad_frame")

    try:
        frame = preprocess_image(Image.fromarray(image), mode, image_size_, patch_size)
    except ValueError as err:
        raise ProtocolError(f"preprocessing: {err}", "bad_frame") from err
    # Exact: the frame's values are uint8 / 255 (the padding is 255 / 255).
    return (frame.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
