"""Eye-dome lighting (EDL): image-space shading that makes a point cloud's shape readable.

A splatted cloud has no normals to light; EDL shades from the depth buffer alone. A pixel
whose neighbours (at ``radius`` pixels along the axes and diagonals: 8 of them) are nearer
than itself lies behind an edge or in a crease, and is darkened:

    obscurance = sum over neighbours of max(0, log(depth) - log(depth_neighbour))
    shade      = exp(-strength * obscurance),   colour *= shade

Log depth makes the shading depend on depth ratios, so a near and a far part of the scene
get outlines of the same weight. Neighbours with no point (the background, holes in a sparse
cloud, or off the image) count as infinitely far: they add nothing, so the cloud's silhouette
is not darkened by the emptiness around it and a sparse cloud is not darkened by its holes.
Pixels with no point keep their colour (the background stays the background), and a surface
facing the camera at one depth is not darkened at all.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["eye_dome_lighting", "eye_dome_obscurance", "eye_dome_shade"]


def eye_dome_obscurance(depth: Tensor, radius: int) -> Tensor:
    """``[H, W]`` obscurance of each pixel of the depth buffer ``depth`` [H, W] (camera z;
    ``inf``, or anything not finite and > 0, where no point is drawn), 0 where no point is."""
    if depth.ndim != 2:
        raise ValueError(f"depth must be [H, W], got {list(depth.shape)}")
    if radius < 1:
        raise ValueError(f"radius must be >= 1 pixel, got {radius}")
    covered = torch.isfinite(depth) & (depth > 0)
    log_depth = torch.where(covered, depth, math.inf).log()  # inf: no point, as if infinitely far
    padded = F.pad(log_depth[None, None], (radius,) * 4, value=math.inf)[0, 0]  # off the image: no point either
    height, width = depth.shape
    obscurance = torch.zeros_like(log_depth)
    for d_row, d_col in _neighbour_offsets(radius):  # 8 shifted views: vectorised over every pixel
        neighbour = padded[radius + d_row: radius + d_row + height, radius + d_col: radius + d_col + width]
        # A finite log depth minus inf is -inf, clamped to 0; empty pixels (inf - x) are zeroed below.
        obscurance += (log_depth - neighbour).clamp(min=0)
    return torch.where(covered, obscurance, torch.zeros_like(obscurance))


def eye_dome_shade(depth: Tensor, *, strength: float, radius: int) -> Tensor:
    """``[H, W]`` factor in (0, 1] each pixel's colour is multiplied by: exp(-strength *
    obscurance); exactly 1 where no point is, where no neighbour is nearer, and everywhere
    when ``strength`` is 0."""
    if not (math.isfinite(strength) and strength >= 0):
        raise ValueError(f"strength must be a finite number >= 0, got {strength}")
    return torch.exp(-strength * eye_dome_obscurance(depth, radius))


def eye_dome_lighting(image: Tensor, depth: Tensor, *, strength: float, radius: int) -> Tensor:
    """``image`` [H, W, 3] uint8 shaded by :func:`eye_dome_shade` of its depth buffer
    ``depth`` [H, W] (as :func:`mapstream.render.raster.splat` returns both), rounded to the
    nearest value (strength 0: a copy of ``image``, bit for bit, as the shade is exactly 1)."""
    if image.shape[:2] != depth.shape or image.ndim != 3:
        raise ValueError(f"image [H, W, 3] and depth [H, W] expected, got {list(image.shape)}, {list(depth.shape)}")
    shade = eye_dome_shade(depth.to(image.device), strength=strength, radius=radius)
    return (image.double() * shade.double()[..., None]).round().clamp(0, 255).to(torch.uint8)


def _neighbour_offsets(radius: int) -> list[tuple[int, int]]:
    """(row, column) offsets of the 8 neighbours at Chebyshev distance ``radius`` along the
    axes and diagonals."""
    return [(dr * radius, dc * radius) for dr in (-1, 0, 1) for dc in (-1, 0, 1) if dr or dc]
