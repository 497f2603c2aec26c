"""Rotary position embeddings: the 2D image RoPE and the 3D video RoPE.

Both are parameter-free. Positions are integers; rotation tables are built from them on
demand (no fixed-length table), so there is no frame-count limit. Within the reference's
table range the numbers are the same as the reference's table lookups.

A rotation is represented by a `Rotary` pair of cos/sin tensors of shape [N, D/2], one
row per token and one column per rotated channel pair; `apply()` rotates q or k of shape
[..., N, D]. The two RoPEs differ in how channels are paired:

* 2D (frame blocks): the head dim is split into a y half and an x half; inside each half,
  channel j is paired with channel j + half/2 ("rotate half").
* 3D (global blocks): channels (2i, 2i+1) form pair i ("interleaved"); pairs are assigned to
  time, then height, then width frequencies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Rotary", "rope2d", "rope3d", "rope3d_angles", "rope3d_time_columns", "rope3d_time_inv_freq",
    "patch_positions_2d", "token_positions_3d",
]


@dataclass(frozen=True)
class Rotary:
    """cos/sin of the rotation angle of every (token, channel pair): [N, D/2] each."""

    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool
    """True: pairs are (2i, 2i+1). False: per-axis rotate-half pairing (2D RoPE)."""
    axes: int = 1
    """Number of independent rotate-half blocks the head dim is split into (2 for 2D RoPE)."""

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate x [..., N, D] (N matching the table's rows) and return a new tensor."""
        cos = self.cos.to(x.dtype)
        sin = self.sin.to(x.dtype)
        if self.interleaved:
            pairs = x.unflatten(-1, (-1, 2))
            a, b = pairs[..., 0], pairs[..., 1]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        # [..., N, axes, 2 (half), F]: channel j of an axis is paired with j + F.
        blocks = x.unflatten(-1, (self.axes, 2, -1))
        c = cos.unflatten(-1, (self.axes, -1))
        s = sin.unflatten(-1, (self.axes, -1))
        x1, x2 = blocks[..., 0, :], blocks[..., 1, :]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-2).flatten(-3)


def _inv_freq_f32(dim: int, base: float, device: torch.device) -> torch.Tensor:
    # Exponents in float32 as the reference computes them: base^(-2j/dim), j < dim/2.
    exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
    return 1.0 / (base**exponent)


def rope2d(positions: torch.Tensor, head_dim: int, frequency: float = 100.0) -> Rotary:
    """2D RoPE for integer (y, x) positions [N, 2].

    The first half of the head dim encodes y, the second half x; inside each half the
    angle of pair j is p * frequency^(-2j/(head_dim/2)). Angles are computed in float32.
    """
    half = head_dim // 2
    inv_freq = _inv_freq_f32(half, frequency, positions.device)  # [half/2]
    pos = positions.to(torch.float32)
    ang_y = pos[:, 0:1] * inv_freq  # [N, half/2]
    ang_x = pos[:, 1:2] * inv_freq
    angles = torch.cat((ang_y, ang_x), dim=-1)  # [N, head_dim/2]
    return Rotary(angles.cos(), angles.sin(), interleaved=False, axes=2)


def patch_positions_2d(grid_h: int, grid_w: int, num_special: int, device: torch.device) -> torch.Tensor:
    """(y, x) of every token of a frame: specials at (0, 0), patch (r, c) at (r + 1, c + 1).

    Returns int64 [num_special + grid_h * grid_w, 2], patches in row-major order.
    """
    rows = torch.arange(1, grid_h + 1, device=device)
    cols = torch.arange(1, grid_w + 1, device=device)
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).reshape(-1, 2)
    special = torch.zeros(num_special, 2, dtype=grid.dtype, device=device)
    return torch.cat((special, grid), dim=0)


def token_positions_3d(
    frame_indices: torch.Tensor, grid_h: int, grid_w: int, num_special: int
) -> torch.Tensor:
    """(t, h, w) of every token of the given frames, frames concatenated.

    Special token j of frame f sits at (f, j, j); patch (r, c) at (f, S + r, S + c) with
    S = num_special. Returns int64 [len(frame_indices) * (S + grid_h * grid_w), 3].
    """
    device = frame_indices.device
    special = torch.arange(num_special, device=device)
    rows = torch.arange(grid_h, device=device) + num_special
    cols = torch.arange(grid_w, device=device) + num_special
    rr, cc = torch.meshgrid(rows, cols, indexing="ij")
    hw = torch.cat(
        (torch.stack((special, special), dim=-1), torch.stack((rr.reshape(-1), cc.reshape(-1)), dim=-1)),
        dim=0,
    )  # [P, 2]
    per_frame = hw.shape[0]
    t = frame_indices.to(torch.int64).repeat_interleave(per_frame)[:, None]
    return torch.cat((t, hw.repeat(frame_indices.numel(), 1)), dim=-1)


def rope3d(positions: torch.Tensor, dims: tuple[int, int, int], theta: float = 10000.0) -> Rotary:
    """3D (video) RoPE for integer (t, h, w) positions [N, 3].

    Axis a with d_a channels has d_a/2 frequencies theta^(-2i/d_a); pairs are laid out as
    [time pairs, height pairs, width pairs]. Angles, cos and sin are computed in float64
    and rounded once to float32 (the reference's complex128 table, cast on use).
    """
    angles = rope3d_angles(positions, dims, theta)
    return Rotary(angles.cos().float(), angles.sin().float(), interleaved=True)


def _inv_freq_f64(dim: int, theta: float, device: torch.device) -> torch.Tensor:
    exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float64)[: dim // 2] / dim
    return 1.0 / (theta**exponent)


def rope3d_angles(positions: torch.Tensor, dims: tuple[int, int, int], theta: float = 10000.0) -> torch.Tensor:
    """Float64 rotation angles [N, sum(dims)/2] of the 3D RoPE (see `rope3d`)."""
    parts = []
    for axis, dim in enumerate(dims):
        inv_freq = _inv_freq_f64(dim, theta, positions.device)
        parts.append(positions[:, axis : axis + 1].to(torch.float64) * inv_freq)
    return torch.cat(parts, dim=-1)


def rope3d_time_inv_freq(dims: tuple[int, int, int], theta: float, device: torch.device) -> torch.Tensor:
    """The float64 inverse frequencies of `rope3d`'s time pairs (see `rope3d_time_columns`)."""
    return _inv_freq_f64(dims[0], theta, device)


def rope3d_time_columns(time_index: int | torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [dims[0] / 2] of the time pairs of `rope3d` at time `time_index`, from the
    time axis' inverse frequencies (`rope3d_time_inv_freq`, computed once by the caller).

    Every token of one frame shares its time, and the time pairs come first, so a frame's
    table is its first dims[0] / 2 columns filled with these and height/width columns that
    never change: a streaming step can update that much instead of rebuilding the table.
    Same arithmetic as `rope3d` (float64 angles, one rounding to float32). `time_index` may be
    a float64 scalar tensor on inv_freq's device, which a captured CUDA graph can read.
    """
    time = time_index if isinstance(time_index, torch.Tensor) else float(time_index)
    angles = inv_freq * time
    return angles.cos().float(), angles.sin().float()
