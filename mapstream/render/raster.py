"""Point splatting with a depth buffer: the flythrough renderer's only drawing primitive.

Points are drawn as squares of (2r + 1)² pixels at their projected position; where several
land on one pixel the nearest wins, and among equally near ones the first in the input, so a
frame is a pure function of its inputs on any device. Lines (the trajectory, frustum edges)
are points sampled along them, depth tested with the cloud.
"""
from __future__ import annotations

import math
from typing import Literal, overload

import torch
from torch import Tensor

from mapstream.geometry.camera import project_points

__all__ = ["pinhole", "sample_segments", "splat"]


def pinhole(height: int, width: int, fov_y_deg: float) -> Tensor:
    """Intrinsics ``[3, 3]`` of a ``height`` x ``width`` image with vertical field of view
    ``fov_y_deg``, square pixels, principal point at the image centre."""
    f = (height / 2) / math.tan(math.radians(fov_y_deg) / 2)
    return torch.tensor([[f, 0.0, (width - 1) / 2], [0.0, f, (height - 1) / 2], [0.0, 0.0, 1.0]], dtype=torch.float64)


@overload
def splat(
    points: Tensor, colors: Tensor, K: Tensor, T_world_cam: Tensor, hw: tuple[int, int], *,
    radius: int = 0, background: tuple[int, int, int] = (0, 0, 0), near: float = 1e-6,
    return_depth: Literal[False] = False,
) -> Tensor: ...


@overload
def splat(
    points: Tensor, colors: Tensor, K: Tensor, T_world_cam: Tensor, hw: tuple[int, int], *,
    radius: int = 0, background: tuple[int, int, int] = (0, 0, 0), near: float = 1e-6,
    return_depth: Literal[True],
) -> tuple[Tensor, Tensor]: ...


def splat(
    points: Tensor, colors: Tensor, K: Tensor, T_world_cam: Tensor, hw: tuple[int, int], *,
    radius: int = 0, background: tuple[int, int, int] = (0, 0, 0), near: float = 1e-6, return_depth: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Render ``points`` [P, 3] (world) with ``colors`` [P, 3] uint8 into an ``hw`` image.

    Args:
        K: ``[3, 3]`` intrinsics; T_world_cam: ``[3, 4]`` camera-to-world (see :func:`look_at`).
        radius: each point covers the pixels within this Chebyshev distance of its rounded
            projection (0: one pixel).
        background: colour of pixels no point covers.
        near: points with camera depth at or below this are not drawn.
        return_depth: also return the depth buffer (for eye-dome lighting,
            :mod:`mapstream.render.edl`).

    Returns:
        ``[H, W, 3]`` uint8 on the points' device; with ``return_depth``, ``(image, depth)``
        where depth ``[H, W]`` float64 is the camera z of each pixel's point, ``inf`` where no
        point is drawn.
    """
    if points.ndim != 2 or points.shape[-1] != 3 or colors.shape != points.shape:
        raise ValueError(f"points [P, 3] and colors [P, 3] expected, got {list(points.shape)}, {list(colors.shape)}")
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    height, width = hw
    device = points.device
    image = torch.tensor(background, dtype=torch.uint8, device=device).expand(height * width, 3).clone()
    if len(points) == 0:
        empty = torch.full((height, width), math.inf, dtype=torch.float64, device=device)
        return (image.view(height, width, 3), empty) if return_depth else image.view(height, width, 3)
    uv, z = project_points(points.double(), K.to(device, torch.float64), T_world_cam.to(device, torch.float64))
    keep = (z > near) & torch.isfinite(uv).all(-1)
    order = torch.nonzero(keep).squeeze(1)  # input order, which breaks depth ties
    col, row, z = uv[order, 0].round().long(), uv[order, 1].round().long(), z[order]
    if radius:
        offsets = torch.arange(-radius, radius + 1, device=device)
        dr, dc = torch.meshgrid(offsets, offsets, indexing="ij")
        row = (row[:, None] + dr.reshape(1, -1)).reshape(-1)
        col = (col[:, None] + dc.reshape(1, -1)).reshape(-1)
        side = (2 * radius + 1) ** 2
        z, order = z.repeat_interleave(side), order.repeat_interleave(side)
    inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    pixel, z, order = (row * width + col)[inside], z[inside], order[inside]
    nearest = torch.full((height * width,), math.inf, dtype=z.dtype, device=device)
    nearest.scatter_reduce_(0, pixel, z, reduce="amin")
    front = z == nearest[pixel]
    winner = torch.full((height * width,), len(points), dtype=torch.long, device=device)
    winner.scatter_reduce_(0, pixel[front], order[front], reduce="amin")
    drawn = winner < len(points)
    image[drawn] = colors.to(device)[winner[drawn]]
    if return_depth:
        return image.view(height, width, 3), nearest.view(height, width)
    return image.view(height, width, 3)


def sample_segments(starts: Tensor, ends: Tensor, per_segment: int) -> Tensor:
    """``per_segment`` evenly spaced points on each segment (both ends included):
    ``[S * per_segment, 3]``, segment by segment."""
    t = torch.linspace(0.0, 1.0, max(per_segment, 2), dtype=starts.dtype, device=starts.device)
    return (starts[:, None] + (ends - starts)[:, None] * t[None, :, None]).reshape(-1, 3)
