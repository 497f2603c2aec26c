"""Tests for mapstream.geometry.camera (SE(3) helpers, intrinsics, (un)projection)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import golden_case

from mapstream.geometry import (
    cam_points_from_depth,
    fov_from_intrinsics,
    intrinsics_from_fov,
    invert_se3,
    pixel_grid,
    pose_encoding_to_extri_intri,
    project_points,
    quat_to_mat,
    to_homogeneous,
    transform_points,
    unproject_depth,
)

BATCH_SHAPES = [(), (1,), (3,), (2, 2)]


def random_T(shape: tuple[int, ...], dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    R = quat_to_mat(torch.randn(*shape, 4, generator=g, dtype=dtype))
    t = torch.randn(*shape, 3, 1, generator=g, dtype=dtype)
    return torch.cat((R, t), dim=-1)


def make_K(shape: tuple[int, ...], H: int, W: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    fov_h = torch.full(shape, 1.1, dtype=dtype)
    fov_w = torch.full(shape, 1.3, dtype=dtype)
    return intrinsics_from_fov(fov_h, fov_w, (H, W))


@pytest.mark.parametrize("shape", BATCH_SHAPES)
@pytest.mark.parametrize("rows", [3, 4])
def test_invert_se3(shape, rows):
    T = random_T(shape, seed=1)
    T = to_homogeneous(T) if rows == 4 else T
    T_inv = invert_se3(T)
    assert T_inv.shape == T.shape
    eye = torch.eye(4, dtype=T.dtype).expand(*shape, 4, 4)
    torch.testing.assert_close(to_homogeneous(T) @ to_homogeneous(T_inv), eye)
    torch.testing.assert_close(invert_se3(T_inv), T)


def test_invert_se3_known_value():
    R = torch.tensor([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]])  # 90 deg about z
    T = torch.cat((R, torch.tensor([[1.0], [2], [3]])), dim=-1)
    expected = torch.tensor([[0.0, 1, 0, -2], [-1, 0, 0, 1], [0, 0, 1, -3]])
    torch.testing.assert_close(invert_se3(T), expected)


def test_to_homogeneous():
    T = random_T((2,))
    T44 = to_homogeneous(T)
    assert T44.shape == (2, 4, 4)
    torch.testing.assert_close(T44[..., :3, :], T)
    torch.testing.assert_close(T44[..., 3, :], torch.tensor([0.0, 0, 0, 1], dtype=T.dtype).expand(2, 4))
    assert to_homogeneous(T44) is T44


def test_transform_points_matches_homogeneous_matmul():
    T = random_T((3,), seed=2)
    p = torch.randn(3, 7, 3, dtype=torch.float64)
    ph = torch.cat((p, torch.ones(3, 7, 1, dtype=p.dtype)), dim=-1)
    expected = (to_homogeneous(T) @ ph.transpose(-1, -2)).transpose(-1, -2)[..., :3]
    torch.testing.assert_close(transform_points(T, p), expected)


def test_intrinsics_fov_round_trip():
    fov_h = torch.tensor([0.5, 1.0, 1.4], dtype=torch.float64)
    fov_w = torch.tensor([0.7, 1.2, 1.6], dtype=torch.float64)
    K = intrinsics_from_fov(fov_h, fov_w, (84, 140))
    torch.testing.assert_close(K[:, 1, 1], 42 / torch.tan(fov_h / 2))
    torch.testing.assert_close(K[:, 0, 0], 70 / torch.tan(fov_w / 2))
    torch.testing.assert_close(K[:, :2, 2], torch.tensor([70.0, 42.0], dtype=torch.float64).expand(3, 2))
    fh, fw = fov_from_intrinsics(K, (84, 140))
    torch.testing.assert_close(fh, fov_h)
    torch.testing.assert_close(fw, fov_w)


def test_pixel_grid():
    g = pixel_grid(2, 3, dtype=torch.float32)
    assert g.shape == (2, 3, 2)
    torch.testing.assert_close(g[1, 2], torch.tensor([2.0, 1.0]))  # (u, v) = (column, row)


def test_cam_points_known_values():
    # 90 deg FoV both ways on a 4x6 image: fx = 3, fy = 2, principal point (3, 2).
    K = intrinsics_from_fov(torch.tensor(math.pi / 2), torch.tensor(math.pi / 2), (4, 6))
    depth = torch.full((4, 6), 2.0)
    X = cam_points_from_depth(depth, K)
    assert X.shape == (4, 6, 3)
    torch.testing.assert_close(X[2, 3], torch.tensor([0.0, 0.0, 2.0]))  # principal point
    torch.testing.assert_close(X[0, 0], torch.tensor([-2.0, -2.0, 2.0]))  # (u-3)*2/3, (v-2)*2/2
    torch.testing.assert_close(X[3, 5], torch.tensor([4.0 / 3.0, 1.0, 2.0]))


def test_unproject_known_world_point():
    # Camera at (1, 2, 3) looking down world -x: its z axis is R[:, 2] = (-1, 0, 0).
    R = torch.tensor([[0.0, 0, -1], [0, 1, 0], [1, 0, 0]], dtype=torch.float64)
    T = torch.cat((R, torch.tensor([[1.0], [2], [3]], dtype=torch.float64)), dim=-1)
    one = torch.tensor(1.0, dtype=torch.float64)
    K = intrinsics_from_fov(one, one, (4, 6))
    pts = unproject_depth(torch.full((4, 6, 1), 5.0, dtype=torch.float64), K, T)
    torch.testing.assert_close(pts[2, 3], torch.tensor([-4.0, 2.0, 3.0], dtype=torch.float64))


@pytest.mark.parametrize("shape", BATCH_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("trailing_one", [False, True])
def test_unproject_then_project_returns_pixel_grid(shape, dtype, trailing_one):
    H, W = 6, 10
    g = torch.Generator().manual_seed(3)
    depth = (0.5 + torch.rand(*shape, H, W, generator=g, dtype=torch.float64)).to(dtype)
    K = make_K(shape, H, W, dtype)
    T = random_T(shape, dtype, seed=4)
    pts = unproject_depth(depth[..., None] if trailing_one else depth, K, T)
    assert pts.shape == (*shape, H, W, 3) and pts.dtype == dtype
    uv, z = project_points(pts.reshape(*shape, H * W, 3), K, T)
    assert uv.shape == (*shape, H * W, 2) and z.shape == (*shape, H * W)
    tol = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {}
    torch.testing.assert_close(uv, pixel_grid(H, W, dtype=dtype).reshape(H * W, 2).expand_as(uv), **tol)
    torch.testing.assert_close(z, depth.reshape(*shape, H * W), **tol)


def test_unproject_is_camera_points_moved_to_world():
    depth = torch.rand(2, 5, 7, dtype=torch.float64) + 1
    K, T = make_K((2,), 5, 7), random_T((2,), seed=5)
    X_cam = cam_points_from_depth(depth, K).reshape(2, 35, 3)
    torch.testing.assert_close(unproject_depth(depth, K, T).reshape(2, 35, 3), transform_points(T, X_cam))


def test_golden_depth_unproject_project():
    tensors, _ = golden_case("tiny_stream_plain")
    depth = tensors["depth"][0].double()  # [S, H, W, 1]
    S, H, W, _ = depth.shape
    T, K = pose_encoding_to_extri_intri(tensors["pose_enc"][0].double(), (H, W))
    pts = unproject_depth(depth, K, T)
    uv, z = project_points(pts.reshape(S, H * W, 3), K, T)
    torch.testing.assert_close(uv, pixel_grid(H, W, dtype=uv.dtype).reshape(1, H * W, 2).expand_as(uv))
    torch.testing.assert_close(z, depth.reshape(S, H * W))


def test_inputs_not_modified():
    depth, K, T = torch.rand(2, 3, 4) + 1, make_K((2,), 3, 4, torch.float32), random_T((2,), torch.float32)
    copies = [x.clone() for x in (depth, K, T)]
    pts = unproject_depth(depth, K, T)
    project_points(pts.reshape(2, 12, 3), K, T)
    invert_se3(T)
    to_homogeneous(T)
    assert all(torch.equal(a, b) for a, b in zip((depth, K, T), copies))


def test_bad_shapes_raise():
    K, T = make_K((2,), 3, 4), random_T((2,))
    with pytest.raises(ValueError, match=r"depth.*\[\*, H, W\].*\[2, 3, 4, 2\]"):
        unproject_depth(torch.ones(2, 3, 4, 2), K, T)
    with pytest.raises(ValueError, match=r"T_world_cam.*\[\*, 3, 4\].*\[2, 3, 3\]"):
        unproject_depth(torch.ones(2, 3, 4), K, T[..., :3])
    with pytest.raises(ValueError, match=r"K.*\[\*, 3, 3\].*\[2, 4, 4\]"):
        cam_points_from_depth(torch.ones(2, 3, 4), torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match=r"T.*\[2, 4, 3\]"):
        invert_se3(torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match=r"points.*\[\*, N, 3\].*\[3\]"):
        project_points(torch.ones(3), K[0], T[0])


@pytest.mark.cuda
def test_cuda_device_preserved():
    depth, K, T = torch.rand(2, 3, 4).cuda() + 1, make_K((2,), 3, 4).cuda(), random_T((2,)).cuda()
    pts = unproject_depth(depth.double(), K, T)
    assert pts.device == depth.device
    uv, z = project_points(pts.reshape(2, 12, 3), K, T)
    assert uv.device == depth.device and invert_se3(T).device == depth.device
