"""What the map keeps of a keyframe: its pose as the stream gave it, a sparse depth map with
confidence for aligning loop clips, the image (JPEG) to feed those clips again, and its place
descriptor. About 30-60 KB a keyframe at the model's sizes (`MapKeyframe.nbytes`)."""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..geometry.align import Sim3

__all__ = ["MapKeyframe", "encode_image", "decode_image", "sparse_points"]


@dataclass
class MapKeyframe:
    index: int
    """The frame's position in the stream."""
    T_world_cam: np.ndarray
    """[4, 4] float64, the stream's camera-to-world pose (never changed: the graph holds the estimate)."""
    K: np.ndarray
    """[3, 3] float64 intrinsics of the full frame."""
    depth: np.ndarray
    """[h, w] float32, every `stride`-th pixel's depth (from pixel stride // 2)."""
    conf: np.ndarray
    """[h, w] float32 confidence of those pixels."""
    stride: int
    image: bytes
    """The frame as the model saw it, JPEG."""
    image_hw: tuple[int, int]
    descriptor: np.ndarray
    """[D] float32, L2-normalised."""
    path_length: float
    """Distance travelled along the stream's trajectory up to this keyframe (stream units)."""
    joined: bool = False
    """A window join lies between the previous keyframe and this one."""

    @property
    def pose(self) -> Sim3:
        return Sim3(self.T_world_cam[:3, :3].copy(), self.T_world_cam[:3, 3].copy(), 1.0)

    @property
    def median_depth(self) -> float:
        valid = self.depth[np.isfinite(self.depth) & (self.depth > 0)]
        return float(np.median(valid)) if valid.size else 1.0

    @property
    def nbytes(self) -> int:
        return len(self.image) + self.depth.nbytes + self.conf.nbytes + self.descriptor.nbytes + 2 * 16 * 8

    def frame(self) -> torch.Tensor:
        """The image as a [3, H, W] float tensor in [0, 1]."""
        return decode_image(self.image)


def encode_image(frame: torch.Tensor, quality: int) -> bytes:
    """A [3, H, W] frame in [0, 1] as JPEG bytes."""
    array = (frame.detach().float().clamp(0, 1).permute(1, 2, 0) * 255 + 0.5).to(torch.uint8).cpu().numpy()
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def decode_image(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data), formats=["JPEG"]) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255


def sparse_points(depth: np.ndarray, K: np.ndarray, stride: int) -> np.ndarray:
    """Camera-space points [h, w, 3] of a depth map sampled every `stride` pixels (from
    pixel stride // 2), with the full frame's intrinsics `K`."""
    h, w = depth.shape
    v, u = np.meshgrid(np.arange(h) * stride + stride // 2, np.arange(w) * stride + stride // 2, indexing="ij")
    x = (u - K[0, 2]) / K[0, 0] * depth
    y = (v - K[1, 2]) / K[1, 1] * depth
    return np.stack((x, y, depth), -1)


def sample(array: np.ndarray, stride: int) -> np.ndarray:
    """Every `stride`-th pixel of an [H, W] map, from pixel stride // 2."""
    return np.ascontiguousarray(array[stride // 2 :: stride, stride // 2 :: stride])
