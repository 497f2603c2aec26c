"""Procedural posed RGB-D sequences: geometry consistency, valid poses, determinism, files."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mapstream.geometry import project_points, unproject_depth
from mapstream.synthetic import load_sequence, make_scene, render_sequence, write_sequence
from mapstream.synthetic.sequence import world_from_room

HW = (84, 140)


@pytest.fixture(scope="module")
def seq():
    return render_sequence(num_frames=8, image_hw=HW, seed=3)


def bilinear(image: np.ndarray, uv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear samples of ``image`` [H, W] at pixel coordinates ``uv`` [M, 2], and whether the
    four neighbours are affine (``a + d = b + c``: one plane, for an inverse-depth image)."""
    u0, v0 = np.floor(uv[:, 0]).astype(int), np.floor(uv[:, 1]).astype(int)
    fu, fv = uv[:, 0] - u0, uv[:, 1] - v0
    a, b = image[v0, u0], image[v0, u0 + 1]
    c, d = image[v0 + 1, u0], image[v0 + 1, u0 + 1]
    affine = np.abs(a + d - b - c) < 1e-6 * np.abs(a)
    return (a * (1 - fu) + b * fu) * (1 - fv) + (c * (1 - fu) + d * fu) * fv, affine


@pytest.mark.parametrize("i, j", [(0, 1), (2, 6), (7, 4)])
def test_depth_is_consistent_across_views(seq, i: int, j: int) -> None:
    """Unproject frame i's depth, project into frame j: the depth matches j's where visible."""
    H, W = HW
    depth = torch.from_numpy(seq.depth.astype(np.float64))
    K, T = torch.from_numpy(seq.K), torch.from_numpy(seq.T_world_cam)
    points = unproject_depth(depth[i], K[i], T[i]).reshape(1, -1, 3)
    uv, z = project_points(points, K[j][None], T[j][None])
    uv, z = uv[0].numpy(), z[0].numpy()
    inside = (z > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < W - 1) & (uv[:, 1] >= 0) & (uv[:, 1] < H - 1)
    assert inside.mean() > 0.3, "the two views should overlap"
    # Inverse depth is affine in (u, v) on a plane, so its bilinear interpolation is exact
    # where the four neighbouring pixels see one plane (most pixels: walls and boxes).
    inv_seen, planar = bilinear(1.0 / seq.depth[j].astype(np.float64), uv[inside])
    assert planar.mean() > 0.6
    rel = (1.0 / inv_seen[planar] - z[inside][planar]) / z[inside][planar]
    visible = np.abs(rel) < 1e-3
    assert visible.mean() > 0.75
    assert np.mean(np.abs(rel[visible]) < 1e-6) > 0.9  # exact up to float32 storage (curved spheres aside)
    # Every other point is hidden behind a nearer surface in view j: "holes" (j sees farther than
    # the point) only appear where a 2x2 neighbourhood straddles a silhouette edge.
    assert np.mean(rel > 1e-3) < 0.01


@pytest.mark.parametrize("i, j", [(0, 3), (5, 1)])
def test_depth_matches_exact_ray_casts(seq, i: int, j: int) -> None:
    """Frame i's points seen from camera j: the first hit along j's ray is the point or nearer."""
    K, T = torch.from_numpy(seq.K), torch.from_numpy(seq.T_world_cam)
    points = unproject_depth(torch.from_numpy(seq.depth[i].astype(np.float64)), K[i], T[i]).reshape(1, -1, 3)
    uv, z = project_points(points, K[j][None], T[j][None])
    uv, z = uv[0].numpy(), z[0].numpy()
    front = z > 0.1
    T_room_cam = np.linalg.inv(world_from_room(seq.seed)) @ seq.T_world_cam[j]
    Kj = seq.K[j]
    rays_cam = np.stack(((uv[front, 0] - Kj[0, 2]) / Kj[0, 0], (uv[front, 1] - Kj[1, 2]) / Kj[1, 1],
                         np.ones(front.sum())), axis=1)
    rays = rays_cam @ T_room_cam[:3, :3].T  # camera z = 1: the ray parameter is the depth
    hit, _ = make_scene(seq.seed).cast(np.broadcast_to(T_room_cam[:3, 3], rays.shape), rays)
    rel = (hit - z[front]) / z[front]
    assert (rel < 1e-5).all()  # nothing is seen behind a surface point (float32 depth, grazing angles)
    assert np.mean(np.abs(rel) < 1e-6) > 0.6  # and most points are seen (float32 depth)


def test_poses_are_valid_se3_and_intrinsics_centred(seq) -> None:
    T = seq.T_world_cam
    R = T[:, :3, :3]
    np.testing.assert_allclose(R @ np.swapaxes(R, 1, 2), np.tile(np.eye(3), (len(T), 1, 1)), atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(R), 1.0, atol=1e-12)
    np.testing.assert_array_equal(T[:, 3], np.tile([0.0, 0.0, 0.0, 1.0], (len(T), 1)))
    steps = np.linalg.norm(np.diff(T[:, :3, 3], axis=0), axis=1)
    assert steps.min() > 0.05 and steps.max() < 0.5  # moving smoothly
    centred = T[:, :3, 3] - T[:, :3, 3].mean(0)
    assert np.linalg.svd(centred, compute_uv=False)[1] > 1e-3  # not collinear: Sim(3) alignable
    H, W = HW
    np.testing.assert_allclose(seq.K[:, :2, 2], np.tile([W / 2, H / 2], (len(T), 1)))
    assert seq.rgb.shape == (8, H, W, 3) and seq.rgb.dtype == np.uint8
    assert seq.depth.shape == (8, H, W) and (seq.depth > 0.3).all()  # closed room: every ray hits
    assert seq.rgb.std() > 20  # textured


def test_rendering_is_deterministic_and_fast(seq) -> None:
    start = time.perf_counter()
    again = render_sequence(num_frames=8, image_hw=HW, seed=3)
    assert time.perf_counter() - start < 5.0
    np.testing.assert_array_equal(again.rgb, seq.rgb)
    np.testing.assert_array_equal(again.depth, seq.depth)
    np.testing.assert_array_equal(again.T_world_cam, seq.T_world_cam)
    other = render_sequence(num_frames=2, image_hw=HW, seed=4)
    assert not np.array_equal(other.rgb, seq.rgb[:2])


def test_written_sequence_loads_back(seq, tmp_path: Path) -> None:
    out = write_sequence(seq, tmp_path / "scene" / "gt", depth_format="npy")
    assert {p.name for p in out.iterdir()} >= {"traj.txt", "intrinsics.txt", "rgb", "depth"}
    assert len(list((out / "rgb").glob("*.png"))) == len(seq)
    back = load_sequence(tmp_path / "scene")
    np.testing.assert_array_equal(back.rgb, seq.rgb)
    np.testing.assert_array_equal(back.depth, seq.depth)
    np.testing.assert_allclose(back.T_world_cam, seq.T_world_cam, atol=1e-11)
    np.testing.assert_allclose(back.K, seq.K, atol=1e-9)
    np.testing.assert_allclose(back.timestamps, seq.timestamps)
    assert back.names == seq.names
