"""How a command reads its frames: the flags `mapstream run` and `mapstream stream` share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

__all__ = ["InputFlags"]


@dataclass(frozen=True)
class InputFlags:
    """Frame reading and preprocessing (spelled without a prefix: --image-size, --stride, ...)."""

    image_size: Optional[int] = None
    """Target width (crop mode); sides become multiples of 14. Default: the model's own (518 for the official weights, the width a mapstream-trained file records: 294 for the shipped small model)."""
    preprocess: Literal["crop", "pad"] = "crop"
    """crop: width --image-size, taller frames centre-cropped to square; pad: longest side, padded white to square."""
    rotate: Literal[0, 90, 180, 270] = 0
    """Turn every frame clockwise by this many degrees first (the reference's --rotate_clockwise_90 is 90)."""
    fps: Optional[float] = 10.0
    """Video sampling rate (frames per second kept; None keeps every frame)."""
    stride: int = 1
    """Keep every n-th frame (after --fps sampling for videos)."""
    first_k: Optional[int] = None
    """Keep at most this many frames (counted after --stride)."""

    def options(self) -> dict[str, Any]:
        """These settings as `RunOptions` keyword arguments (same names)."""
        return dict(image_size=self.image_size, preprocess=self.preprocess, rotate=self.rotate, fps=self.fps,
                    stride=self.stride, first_k=self.first_k)
