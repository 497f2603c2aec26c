"""Rotation conversions between quaternions and 3x3 matrices.

Quaternions are stored scalar-LAST, ``(x, y, z, w)``, as in the pose encoding
(MODEL.md section 12). All functions are batched over arbitrary leading dimensions,
keep the input's device and dtype, and never modify their inputs.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["quat_to_mat", "mat_to_quat"]


def check_trailing_shape(x: Tensor, trailing: Sequence[int], name: str) -> None:
    """Raise ``ValueError`` unless ``x`` has shape ``[*, *trailing]``.

    Args:
        x: tensor to check.
        trailing: the required sizes of the last ``len(trailing)`` dimensions.
        name: argument name used in the error message.
    """
    n = len(trailing)
    if x.ndim < n or tuple(x.shape[x.ndim - n :]) != tuple(trailing):
        expected = "[*, " + ", ".join(str(s) for s in trailing) + "]"
        raise ValueError(f"{name} must have shape {expected}, got {list(x.shape)}")


def quat_to_mat(q: Tensor) -> Tensor:
    """Rotation matrix of a quaternion in ``(x, y, z, w)`` order (scalar last).

    The quaternion need not be unit length: with ``s = 2 / |q|^2`` the formula

        R = [[1 - s(y²+z²), s(xy - zw),   s(xz + yw)  ],
             [s(xy + zw),   1 - s(x²+z²), s(yz - xw)  ],
             [s(xz - yw),   s(yz + xw),   1 - s(x²+y²)]]

    gives the rotation of ``q / |q|`` (so ``q`` and ``c * q`` map to the same matrix for
    any non-zero ``c``). This is how the model's raw, un-normalised quaternion output
    is interpreted. A zero quaternion gives non-finite values.

    Args:
        q: quaternions, shape ``[*, 4]``, order ``(x, y, z, w)``.

    Returns:
        Rotation matrices, shape ``[*, 3, 3]``, same dtype and device as ``q``.
    """
    check_trailing_shape(q, (4,), "q")
    x, y, z, w = q.unbind(-1)
    s = 2.0 / (q * q).sum(-1)
    rows = (
        1.0 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w),
        s * (x * y + z * w), 1.0 - s * (x * x + z * z), s * (y * z - x * w),
        s * (x * z - y * w), s * (y * z + x * w), 1.0 - s * (x * x + y * y),
    )
    return torch.stack(rows, dim=-1).reshape(*q.shape[:-1], 3, 3)


def _sqrt_nonneg(x: Tensor) -> Tensor:
    """``sqrt(max(0, x))`` with a zero (not infinite) gradient where ``x <= 0``."""
    positive = x > 0
    safe = torch.where(positive, x, torch.ones_like(x))
    return torch.where(positive, torch.sqrt(safe), torch.zeros_like(x))


def mat_to_quat(R: Tensor) -> Tensor:
    """Quaternion ``(x, y, z, w)`` of a rotation matrix, with ``w >= 0``.

    Algorithm (MODEL.md section 12): the four magnitudes
    ``|w|, |x|, |y|, |z| = 0.5 * sqrt(max(0, [1+m00+m11+m22, 1+m00-m11-m22,
    1-m00+m11-m22, 1-m00-m11+m22]))`` (up to the factor 1/2) are computed, each one yields
    a candidate quaternion from the off-diagonal entries, and the candidate of the largest
    magnitude (best conditioned) is kept. Candidate denominators are floored at 0.1 so
    the discarded candidates stay finite. The result is NOT renormalised: for an exact
    rotation it is unit length up to rounding; for a non-orthonormal input it is whatever
    the selected candidate gives. Finally ``q`` is replaced by ``-q`` where ``w < 0``.

    Args:
        R: rotation matrices, shape ``[*, 3, 3]``.

    Returns:
        Quaternions, shape ``[*, 4]``, order ``(x, y, z, w)``, ``w >= 0``, same dtype and
        device as ``R``.
    """
    check_trailing_shape(R, (3, 3), "R")
    m = R.reshape(*R.shape[:-2], 9).unbind(-1)
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = m

    # Twice the magnitudes of (w, x, y, z).
    q_abs = _sqrt_nonneg(
        torch.stack(
            (
                1.0 + m00 + m11 + m22,
                1.0 + m00 - m11 - m22,
                1.0 - m00 + m11 - m22,
                1.0 - m00 - m11 + m22,
            ),
            dim=-1,
        )
    )
    qw2, qx2, qy2, qz2 = (q_abs * q_abs).unbind(-1)
    # Row k equals 4 * q_k * (w, x, y, z) with q_k the k-th of (w, x, y, z).
    candidates = torch.stack(
        (
            torch.stack((qw2, m21 - m12, m02 - m20, m10 - m01), dim=-1),
            torch.stack((m21 - m12, qx2, m10 + m01, m02 + m20), dim=-1),
            torch.stack((m02 - m20, m10 + m01, qy2, m12 + m21), dim=-1),
            torch.stack((m10 - m01, m20 + m02, m21 + m12, qz2), dim=-1),
        ),
        dim=-2,
    )
    candidates = candidates / (2.0 * q_abs.clamp(min=0.1)).unsqueeze(-1)

    best = q_abs.argmax(dim=-1)  # first maximum on ties
    index = best[..., None, None].expand(*best.shape, 1, 4)
    q_wxyz = torch.gather(candidates, -2, index).squeeze(-2)
    q_xyzw = torch.cat((q_wxyz[..., 1:], q_wxyz[..., :1]), dim=-1)
    return torch.where(q_xyzw[..., 3:] < 0, -q_xyzw, q_xyzw)
