"""Umeyama SE(3) / Sim(3) alignment (mapstream.geometry.align)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from mapstream.geometry.align import Sim3, align_poses, align_trajectories, as_pose4, umeyama


def random_sim3(seed: int, scale: float = 2.5) -> Sim3:
    rng = np.random.default_rng(seed)
    return Sim3(Rotation.random(random_state=seed).as_matrix(), rng.normal(size=3) * 3, scale)


def random_poses(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix()
    T[:, :3, 3] = np.cumsum(rng.normal(size=(n, 3)), axis=0)
    return T


@pytest.mark.parametrize("with_scale", [True, False])
def test_umeyama_recovers_known_transform(with_scale: bool) -> None:
    S = random_sim3(1, scale=2.5 if with_scale else 1.0)
    src = np.random.default_rng(0).normal(size=(20, 3))
    found = umeyama(src, S.apply_points(src), with_scale=with_scale)
    np.testing.assert_allclose(found.R, S.R, atol=1e-12)
    np.testing.assert_allclose(found.t, S.t, atol=1e-12)
    assert found.s == pytest.approx(S.s, abs=1e-12)
    assert np.linalg.det(found.R) == pytest.approx(1.0)


def test_umeyama_accepts_torch_and_weights() -> None:
    S = random_sim3(2)
    src = np.random.default_rng(1).normal(size=(30, 3))
    dst = S.apply_points(src)
    dst[0] += 100.0  # an outlier with zero weight is ignored
    w = np.ones(30)
    w[0] = 0.0
    found = umeyama(torch.from_numpy(src).float(), torch.from_numpy(dst), weights=torch.from_numpy(w))
    np.testing.assert_allclose(found.matrix(), S.matrix(), atol=1e-5)  # float32 source points


def test_trajectory_alignment_recovers_applied_sim3() -> None:
    T = random_poses(10, 3)
    S = random_sim3(4, scale=0.3)
    S_ref_est = align_trajectories(S.apply_poses(T), T, "sim3")
    np.testing.assert_allclose(S_ref_est.matrix(), S.inverse().matrix(), atol=1e-10)
    np.testing.assert_allclose(S_ref_est.apply_poses(S.apply_poses(T)), T, atol=1e-10)
    assert align_trajectories(T, T, "none").s == 1.0


def test_sim3_algebra() -> None:
    A, B = random_sim3(5), random_sim3(6, scale=0.7)
    p = np.random.default_rng(2).normal(size=(7, 3))
    np.testing.assert_allclose(A.compose(B).apply_points(p), A.apply_points(B.apply_points(p)), atol=1e-12)
    np.testing.assert_allclose(A.inverse().apply_points(A.apply_points(p)), p, atol=1e-12)
    C = Sim3.from_matrix(A.matrix())
    np.testing.assert_allclose(C.matrix(), A.matrix(), atol=1e-12)
    # Poses move rigidly: rotation part stays orthonormal, centres follow apply_points.
    T = A.apply_poses(random_poses(4, 7))
    R = T[:, :3, :3]
    np.testing.assert_allclose(R @ np.swapaxes(R, 1, 2), np.tile(np.eye(3), (4, 1, 1)), atol=1e-12)
    assert as_pose4(T[:, :3]).shape == (4, 4, 4)


@pytest.mark.parametrize(
    "src, match",
    [
        (np.random.default_rng(0).normal(size=(2, 3)), "at least 3"),
        (np.ones((5, 3)), "all source points"),
        (np.outer(np.arange(5.0), [1.0, 2.0, 3.0]), "collinear"),
        (np.array([[0, 0, 0], [1, 0, 0], [np.nan, 0, 1.0]]), "NaN"),
    ],
)
def test_umeyama_degenerate_inputs_raise(src: np.ndarray, match: str) -> None:
    dst = src + 1.0
    with pytest.raises(ValueError, match=match):
        umeyama(src, dst)


def test_alignment_argument_errors() -> None:
    T = random_poses(5, 0)
    with pytest.raises(ValueError, match="different lengths"):
        align_trajectories(T, T[:4], "sim3")
    with pytest.raises(ValueError, match="align must be"):
        align_trajectories(T, T, "affine")
    with pytest.raises(ValueError, match="same shape"):
        umeyama(np.zeros((4, 3)), np.zeros((5, 3)))


@pytest.mark.parametrize("mode", ["sim3", "se3"])
def test_align_poses_recovers_a_known_transform_and_agrees_with_the_centres_alignment(mode: str) -> None:
    S = random_sim3(4, scale=2.5 if mode == "sim3" else 1.0)
    est = random_poses(12, 5)
    ref = S.apply_poses(est)
    found = align_poses(est, ref, mode)
    np.testing.assert_allclose(found.R, S.R, atol=1e-12)
    np.testing.assert_allclose(found.t, S.t, atol=1e-10)
    assert found.s == pytest.approx(S.s, rel=1e-12)
    centres = align_trajectories(est, ref, mode)
    np.testing.assert_allclose(found.matrix(), centres.matrix(), atol=1e-9)
    none = align_poses(est, ref, "none")
    assert np.array_equal(none.R, np.eye(3)) and np.array_equal(none.t, np.zeros(3)) and none.s == 1.0


def test_align_poses_fixes_the_rotation_that_collinear_centres_leave_undetermined() -> None:
    S = random_sim3(6, scale=0.4)
    est = random_poses(6, 7)
    est[:, :3, 3] = np.linspace(0, 1, 6)[:, None] * np.array([1.0, 2.0, -0.5])  # a straight path
    ref = S.apply_poses(est)
    with pytest.raises(ValueError, match="collinear"):
        align_trajectories(est, ref, "sim3")
    found = align_poses(torch.from_numpy(est), ref)
    np.testing.assert_allclose(found.apply_poses(est), ref, atol=1e-10)
    assert found.s == pytest.approx(0.4, rel=1e-12)


def test_align_poses_takes_the_nearest_rotation_to_noisy_orientations() -> None:
    # Orientations each off by a few degrees about random axes: the found rotation lies within
    # that noise of the true one, and the scale still comes from the centres.
    S = random_sim3(8, scale=1.7)
    est = random_poses(40, 9)
    ref = S.apply_poses(est)
    noise = Rotation.random(40, random_state=10).as_rotvec()
    noise *= np.radians(3.0) / np.linalg.norm(noise, axis=1, keepdims=True)
    ref[:, :3, :3] = Rotation.from_rotvec(noise).as_matrix() @ ref[:, :3, :3]
    found = align_poses(est, ref)
    assert np.degrees(Rotation.from_matrix(found.R.T @ S.R).magnitude()) < 1.5
    assert found.s == pytest.approx(1.7, rel=0.05)


def test_align_poses_refuses_what_fixes_no_scale() -> None:
    est = random_poses(5, 11)
    with pytest.raises(ValueError, match="all equal"):
        align_poses(np.repeat(est[:1], 5, 0), est)
    backwards = est.copy()
    backwards[:, :3, 3] *= -1.0  # the same orientations, the centres mirrored through the origin
    with pytest.raises(ValueError, match="runs against the reference"):
        align_poses(est, backwards)
    with pytest.raises(ValueError, match="different lengths"):
        align_poses(est, est[:3])
    with pytest.raises(ValueError, match="at least one pose"):
        align_poses(est[:0], est[:0])
    with pytest.raises(ValueError, match="align must be one of"):
        align_poses(est, est, "affine")
    assert align_poses(np.repeat(est[:1], 5, 0), est, "se3").s == 1.0  # rigid: no scale to fix
