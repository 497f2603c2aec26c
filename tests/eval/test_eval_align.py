"""Umeyama SE(3) / Sim(3) alignment (mapstream.geometry.align)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from mapstream.geometry.align import Sim3, align_trajectories, as_pose4, umeyama


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
