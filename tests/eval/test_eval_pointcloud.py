"""Point-cloud metrics, voxel downsampling and ICP."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from mapstream.eval.pointcloud import icp, pointcloud_metrics, voxel_downsample
from mapstream.geometry.align import Sim3


def plane(n: int = 40, spacing: float = 0.01) -> np.ndarray:
    u, v = np.meshgrid(np.arange(n) * spacing, np.arange(n) * spacing, indexing="ij")
    return np.stack((u.ravel(), v.ravel(), np.zeros(u.size)), axis=1)


def bumpy_surface(n: int = 50) -> np.ndarray:
    """A non-symmetric surface, so that ICP has a unique answer."""
    u, v = np.meshgrid(np.linspace(-1, 1, n), np.linspace(-1, 1, n), indexing="ij")
    z = 0.3 * np.sin(3 * u) * np.cos(2 * v) + 0.2 * u * v + 0.1 * u**2
    return np.stack((u.ravel(), v.ravel(), z.ravel()), axis=1)


def test_identical_and_offset_clouds() -> None:
    P = plane()
    same = pointcloud_metrics(P, P, threshold=0.02)
    assert (same.accuracy, same.completeness, same.chamfer) == (0.0, 0.0, 0.0)
    assert (same.precision, same.recall, same.f1) == (1.0, 1.0, 1.0)

    lifted = P + [0.0, 0.0, 0.03]  # 3 cm along the normal: every nearest neighbour is the twin point
    m = pointcloud_metrics(lifted, P, threshold=0.05)
    assert m.accuracy == pytest.approx(0.03) and m.completeness == pytest.approx(0.03)
    assert m.chamfer == pytest.approx(0.03) and m.f1 == 1.0
    far = pointcloud_metrics(lifted, P, threshold=0.02)
    assert (far.precision, far.recall, far.f1) == (0.0, 0.0, 0.0)


def test_partial_prediction_hurts_recall_only() -> None:
    G = plane()
    P = G[G[:, 0] < 0.195]  # the half x < 0.2
    m = pointcloud_metrics(P, G, threshold=0.005)
    assert m.accuracy == 0.0 and m.precision == 1.0
    assert m.recall == pytest.approx(0.5)
    assert m.f1 == pytest.approx(2 * 0.5 / 1.5)
    assert m.completeness > 0.0


def test_voxel_downsample_centroids() -> None:
    pts = np.array([[0.01, 0.01, 0.01], [0.03, 0.03, 0.03], [0.11, 0.0, 0.0], [np.nan, 0, 0]])
    out = voxel_downsample(pts, 0.1)
    np.testing.assert_allclose(out, [[0.02, 0.02, 0.02], [0.11, 0.0, 0.0]])
    dense = bumpy_surface(100)
    assert len(voxel_downsample(dense, 0.05)) < len(dense) / 4
    m = pointcloud_metrics(dense, dense, voxel_size=0.05)
    assert m.chamfer == 0.0 and m.voxel_size == 0.05
    with pytest.raises(ValueError, match="voxel_size"):
        voxel_downsample(dense, 0.0)


@pytest.mark.parametrize("with_scale", [False, True])
def test_icp_recovers_a_small_motion(with_scale: bool) -> None:
    G = bumpy_surface()
    S = Sim3(Rotation.from_rotvec([0.02, -0.03, 0.025]).as_matrix(), np.array([0.02, -0.01, 0.015]),
             1.03 if with_scale else 1.0)
    P = S.inverse().apply_points(G)
    result = icp(P, G, max_dist=0.2, max_iters=100, with_scale=with_scale)
    np.testing.assert_allclose(result.transform.matrix(), S.matrix(), atol=1e-6)
    assert result.rmse < 1e-6 and result.fitness == 1.0
    refined = pointcloud_metrics(P, G, threshold=0.01, icp_refine=True, icp_max_dist=0.2, icp_with_scale=with_scale)
    assert refined.chamfer < 1e-6 and refined.f1 == 1.0
    assert pointcloud_metrics(P, G, threshold=0.01).chamfer > 1e-3


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="shape"):
        pointcloud_metrics(np.zeros((4, 2)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="no finite"):
        pointcloud_metrics(np.full((4, 3), np.nan), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="threshold"):
        pointcloud_metrics(np.zeros((4, 3)), np.zeros((4, 3)), threshold=0)
