"""Tests for mapstream.geometry.rotation (quat_to_mat, mat_to_quat)."""
from __future__ import annotations

import math

import pytest
import torch

from mapstream.geometry import mat_to_quat, quat_to_mat

BATCH_SHAPES = [(), (1,), (5,), (2, 3)]


def random_quat(shape: tuple[int, ...], dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, 4, generator=g, dtype=dtype)
    return q / q.norm(dim=-1, keepdim=True)


def axis_angle_quat(axis: tuple[float, float, float], angle: float) -> torch.Tensor:
    a = torch.tensor(axis, dtype=torch.float64)
    a = a / a.norm()
    return torch.cat((a * math.sin(angle / 2), torch.tensor([math.cos(angle / 2)], dtype=torch.float64)))


# 90 degree rotations about x, y, z (right-handed, active).
ROT90 = {
    (1.0, 0.0, 0.0): [[1, 0, 0], [0, 0, -1], [0, 1, 0]],
    (0.0, 1.0, 0.0): [[0, 0, 1], [0, 1, 0], [-1, 0, 0]],
    (0.0, 0.0, 1.0): [[0, -1, 0], [1, 0, 0], [0, 0, 1]],
}


@pytest.mark.parametrize("shape", BATCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtype(shape, dtype):
    q = random_quat(shape, dtype)
    R = quat_to_mat(q)
    assert R.shape == (*shape, 3, 3) and R.dtype == dtype
    q2 = mat_to_quat(R)
    assert q2.shape == (*shape, 4) and q2.dtype == dtype


def test_identity():
    q = torch.tensor([0.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(quat_to_mat(q), torch.eye(3))
    torch.testing.assert_close(mat_to_quat(torch.eye(3)), q)


@pytest.mark.parametrize("axis", list(ROT90))
def test_90_degree_rotations(axis):
    q = axis_angle_quat(axis, math.pi / 2)
    expected = torch.tensor(ROT90[axis], dtype=torch.float64)
    torch.testing.assert_close(quat_to_mat(q), expected)
    torch.testing.assert_close(mat_to_quat(expected), q)


@pytest.mark.parametrize("axis", list(ROT90))
def test_180_degree_rotation_has_zero_w(axis):
    R = torch.tensor(ROT90[axis], dtype=torch.float64)
    q = mat_to_quat(R @ R)
    torch.testing.assert_close(q, axis_angle_quat(axis, math.pi).abs(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("angle", [math.pi - 1e-3, math.pi - 1e-7, 1e-7])
def test_best_conditioned_candidate_near_singular_angles(angle):
    g = torch.Generator().manual_seed(7)
    axes = torch.randn(50, 3, generator=g, dtype=torch.float64)
    axes = axes / axes.norm(dim=-1, keepdim=True)
    half = torch.tensor(angle / 2, dtype=torch.float64)
    q = torch.cat((axes * torch.sin(half), torch.cos(half).expand(50, 1)), dim=-1)
    torch.testing.assert_close(mat_to_quat(quat_to_mat(q)), q, atol=1e-12, rtol=0)


def test_against_scipy():
    Rotation = pytest.importorskip("scipy.spatial.transform").Rotation
    q = random_quat((64,), seed=1)
    expected = torch.from_numpy(Rotation.from_quat(q.numpy()).as_matrix())  # scipy: xyzw
    torch.testing.assert_close(quat_to_mat(q), expected)


@pytest.mark.parametrize("scale", [0.1, 3.0, -2.5])
def test_non_unit_quaternion_is_the_rotation_of_q_over_norm(scale):
    q = random_quat((16,), seed=2)
    R = quat_to_mat(q * scale)
    torch.testing.assert_close(R, quat_to_mat(q))
    torch.testing.assert_close(R @ R.transpose(-1, -2), torch.eye(3, dtype=R.dtype).expand_as(R))
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(16, dtype=R.dtype))


def test_non_unit_quaternion_matches_spec_formula():
    # s = 2 / |q|^2 entries, written out for one hand-picked quaternion.
    x, y, z, w = 1.0, -2.0, 0.5, 3.0
    s = 2 / (x * x + y * y + z * z + w * w)
    expected = torch.tensor(
        [
            [1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w)],
            [s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w)],
            [s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y)],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(quat_to_mat(torch.tensor([x, y, z, w], dtype=torch.float64)), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_trip_mat_quat_mat(dtype):
    q = random_quat((1000,), seed=3).to(dtype)
    R = quat_to_mat(q)
    q2 = mat_to_quat(R)
    torch.testing.assert_close(quat_to_mat(q2), R)
    # Same rotation, sign fixed so that w >= 0.
    torch.testing.assert_close(q2, torch.where(q[..., 3:] < 0, -q, q))


def test_sign_convention_w_non_negative():
    q = random_quat((500,), seed=4)
    q = torch.where(q[..., 3:] > 0, -q, q)  # all w <= 0 on input
    q2 = mat_to_quat(quat_to_mat(q))
    assert (q2[..., 3] >= 0).all()
    torch.testing.assert_close(q2, -q)


def test_no_renormalisation():
    # diag(0.9, 0.9, 0.9): best candidate is w with |w| = sqrt(1 + 2.7) / 2, not 1.
    q = mat_to_quat(0.9 * torch.eye(3, dtype=torch.float64))
    expected = torch.tensor([0.0, 0.0, 0.0, math.sqrt(3.7) / 2], dtype=torch.float64)
    torch.testing.assert_close(q, expected)


def test_unit_norm_for_rotations():
    q = mat_to_quat(quat_to_mat(random_quat((200,), seed=5)))
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(200, dtype=q.dtype))


def test_gradients_are_finite_at_identity():
    R = torch.eye(3, dtype=torch.float64).repeat(2, 1, 1).requires_grad_(True)
    mat_to_quat(R).sum().backward()
    assert torch.isfinite(R.grad).all()


def test_inputs_not_modified():
    q = random_quat((4,), seed=6) * 2
    q_copy = q.clone()
    R = quat_to_mat(q)
    R_copy = R.clone()
    mat_to_quat(R)
    assert torch.equal(q, q_copy) and torch.equal(R, R_copy)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\[\*, 4\].*\[2, 3\]"):
        quat_to_mat(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\[\*, 3, 3\].*\[3, 4\]"):
        mat_to_quat(torch.zeros(3, 4))


@pytest.mark.cuda
def test_cuda_device_preserved():
    q = random_quat((8,)).cuda()
    R = quat_to_mat(q)
    assert R.device == q.device and mat_to_quat(R).device == q.device
