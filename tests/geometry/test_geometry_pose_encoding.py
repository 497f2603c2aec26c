"""Tests for mapstream.geometry.pose_encoding, including the golden post-processing."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import golden_case

from mapstream.geometry import (
    camera_matrices,
    extri_intri_to_pose_encoding,
    invert_se3,
    pose_encoding_to_extri_intri,
    quat_to_mat,
)

BATCH_SHAPES = [(), (1,), (4,), (2, 3)]
GOLDEN_CASES = ["tiny_stream_plain", "full_stream_plain", "tiny_stream_plain_fi", "full_stream_plain_fi"]


def random_pose_enc(
    shape: tuple[int, ...], dtype: torch.dtype = torch.float64, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, 3, generator=g, dtype=dtype) * 3
    q = torch.randn(*shape, 4, generator=g, dtype=dtype)
    fov = 0.3 + 1.5 * torch.rand(*shape, 2, generator=g, dtype=dtype)
    return torch.cat((t, q, fov), dim=-1)


@pytest.mark.parametrize("shape", BATCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_dtype(shape, dtype):
    pe = random_pose_enc(shape, dtype)
    T, K = pose_encoding_to_extri_intri(pe, (84, 140))
    assert T.shape == (*shape, 3, 4) and K.shape == (*shape, 3, 3)
    assert T.dtype == dtype and K.dtype == dtype
    pe2 = extri_intri_to_pose_encoding(T, K, (84, 140))
    assert pe2.shape == (*shape, 9) and pe2.dtype == dtype


def test_known_values():
    H, W = 80, 120
    fov_h, fov_w = 2 * math.atan(40 / 100), 2 * math.atan(60 / 150)
    pe = torch.tensor([1.0, -2.0, 3.0, 0.0, 0.0, 0.0, 1.0, fov_h, fov_w], dtype=torch.float64)
    T, K = pose_encoding_to_extri_intri(pe, (H, W))
    expected_T = torch.tensor([[1, 0, 0, 1], [0, 1, 0, -2], [0, 0, 1, 3]], dtype=torch.float64)
    expected_K = torch.tensor([[150, 0, 60], [0, 100, 40], [0, 0, 1]], dtype=torch.float64)
    torch.testing.assert_close(T, expected_T)
    torch.testing.assert_close(K, expected_K)


def test_camera_matrices_are_the_pose_its_inverse_and_the_intrinsics():
    pe = random_pose_enc((5,), seed=4)
    T_world_cam, T_cam_world, K = camera_matrices(pe, (30, 40))
    want_T, want_K = pose_encoding_to_extri_intri(pe, (30, 40))
    assert torch.equal(T_world_cam, want_T) and torch.equal(K, want_K)
    torch.testing.assert_close(T_cam_world, invert_se3(want_T))
    # [R | t] then its inverse: the identity on points.
    points = torch.randn(5, 7, 3, dtype=torch.float64)
    world = points @ T_world_cam[:, :, :3].transpose(1, 2) + T_world_cam[:, None, :, 3]
    back = world @ T_cam_world[:, :, :3].transpose(1, 2) + T_cam_world[:, None, :, 3]
    torch.testing.assert_close(back, points)


def test_translation_is_camera_centre_in_world():
    # Camera-to-world: the camera origin maps to t; its z axis (forward) is R[:, 2].
    pe = random_pose_enc((10,), seed=1)
    T, _ = pose_encoding_to_extri_intri(pe, (10, 10))
    torch.testing.assert_close(T[..., :, 3], pe[..., :3])
    torch.testing.assert_close(T[..., :3, :3], quat_to_mat(pe[..., 3:7]))


@pytest.mark.parametrize("shape", BATCH_SHAPES)
def test_round_trip_pose_enc(shape):
    pe = random_pose_enc(shape, seed=2)
    q = pe[..., 3:7] / pe[..., 3:7].norm(dim=-1, keepdim=True)
    q = torch.where(q[..., 3:] < 0, -q, q)
    pe_unit = torch.cat((pe[..., :3], q, pe[..., 7:]), dim=-1)
    T, K = pose_encoding_to_extri_intri(pe_unit, (112, 196))
    torch.testing.assert_close(extri_intri_to_pose_encoding(T, K, (112, 196)), pe_unit)


def test_round_trip_non_unit_quaternion_gives_normalised_quaternion():
    pe = random_pose_enc((32,), seed=3)
    pe[..., 3:7] *= 3.0
    T, K = pose_encoding_to_extri_intri(pe, (84, 140))
    pe2 = extri_intri_to_pose_encoding(T, K, (84, 140))
    q = pe[..., 3:7] / pe[..., 3:7].norm(dim=-1, keepdim=True)
    torch.testing.assert_close(pe2[..., 3:7], torch.where(q[..., 3:] < 0, -q, q))
    torch.testing.assert_close(pe2[..., :3], pe[..., :3])
    torch.testing.assert_close(pe2[..., 7:], pe[..., 7:])


def test_round_trip_accepts_4x4_and_shared_intrinsics():
    pe = random_pose_enc((5,), seed=4)
    pe[..., 7:] = pe[0, 7:]
    T, K = pose_encoding_to_extri_intri(pe, (84, 140))
    T44 = torch.cat((T, torch.tensor([0.0, 0, 0, 1], dtype=T.dtype).expand(5, 1, 4)), dim=-2)
    pe_a = extri_intri_to_pose_encoding(T, K, (84, 140))
    pe_b = extri_intri_to_pose_encoding(T44, K[0], (84, 140))  # K broadcast over frames
    torch.testing.assert_close(pe_b, pe_a)


def test_inputs_not_modified():
    pe = random_pose_enc((3,), seed=5)
    pe_copy = pe.clone()
    T, K = pose_encoding_to_extri_intri(pe, (10, 20))
    T_copy, K_copy = T.clone(), K.clone()
    extri_intri_to_pose_encoding(T, K, (10, 20))
    assert torch.equal(pe, pe_copy) and torch.equal(T, T_copy) and torch.equal(K, K_copy)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"pose_enc.*\[\*, 9\].*\[2, 7\]"):
        pose_encoding_to_extri_intri(torch.zeros(2, 7), (10, 10))
    with pytest.raises(ValueError, match="image_hw"):
        pose_encoding_to_extri_intri(torch.zeros(9), (10, 0))
    with pytest.raises(ValueError, match=r"T_world_cam.*\[3, 3\]"):
        extri_intri_to_pose_encoding(torch.zeros(3, 3), torch.eye(3), (10, 10))
    with pytest.raises(ValueError, match=r"K.*\[\*, 3, 3\].*\[2, 2\]"):
        extri_intri_to_pose_encoding(torch.zeros(3, 4), torch.eye(2), (10, 10))


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_postprocess(name):
    """``post.intrinsic`` is K; ``post.extrinsic_c2w`` is the INVERSE of our T_world_cam.

    The golden file follows the reference helper's docstring (which calls [R | t]
    "camera-from-world", so its inverse would be "c2w"); by the convention of the whole
    reference pipeline (MODEL.md section 12) [R | t] is camera-to-world, and the stored
    tensor is the demo's ``extrinsic`` = world-to-camera = ``invert_se3(T_world_cam)``.
    """
    tensors, _ = golden_case(name)
    image_hw = tensors["images_u8"].shape[-2:]
    T_world_cam, K = pose_encoding_to_extri_intri(tensors["pose_enc"], image_hw)
    torch.testing.assert_close(K, tensors["post.intrinsic"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(invert_se3(T_world_cam), tensors["post.extrinsic_c2w"], rtol=1e-4, atol=1e-4)
    # Guard the finding: the stored tensor is not [R | t] itself.
    assert not torch.allclose(T_world_cam, tensors["post.extrinsic_c2w"], rtol=1e-4, atol=1e-4)
    # And it round-trips back to the (normalised) pose encoding.
    pe = extri_intri_to_pose_encoding(T_world_cam, K, image_hw)
    q = tensors["pose_enc"][..., 3:7]
    q = q / q.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(pe[..., 3:7], torch.where(q[..., 3:] < 0, -q, q), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pe[..., 7:], tensors["pose_enc"][..., 7:], rtol=1e-4, atol=1e-5)
