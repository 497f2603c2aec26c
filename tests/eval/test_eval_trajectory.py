"""ATE / RPE (checked against evo) and pose AUC."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from mapstream.eval.trajectory import aggregate_auc, ate, pose_auc, rpe
from mapstream.geometry.align import Sim3

evo_metrics = pytest.importorskip("evo.core.metrics")
evo_trajectory = pytest.importorskip("evo.core.trajectory")

TOL = 1e-9


def make_trajectories(n: int, seed: int, scale: float = 1.7) -> tuple[np.ndarray, np.ndarray, Sim3]:
    """(reference, noisy estimate moved by a known Sim(3), that Sim(3))."""
    rng = np.random.default_rng(seed)
    ref = np.tile(np.eye(4), (n, 1, 1))
    ref[:, :3, :3] = Rotation.random(n, random_state=seed).as_matrix()
    ref[:, :3, 3] = np.cumsum(rng.normal(scale=0.5, size=(n, 3)), axis=0)
    est = ref.copy()
    est[:, :3, :3] = Rotation.from_rotvec(rng.normal(scale=0.03, size=(n, 3))).as_matrix() @ ref[:, :3, :3]
    est[:, :3, 3] += rng.normal(scale=0.05, size=(n, 3))
    S = Sim3(Rotation.random(random_state=seed + 100).as_matrix(), rng.normal(size=3) * 4, scale)
    return ref, S.apply_poses(est), S


def evo_pair(ref: np.ndarray, est: np.ndarray, align: str):
    stamps = np.arange(len(ref), dtype=float)
    traj_ref = evo_trajectory.PoseTrajectory3D(poses_se3=list(ref), timestamps=stamps)
    traj_est = evo_trajectory.PoseTrajectory3D(poses_se3=list(est), timestamps=stamps)
    params = None
    if align != "none":
        params = traj_est.align(traj_ref, correct_scale=(align == "sim3"))
    return traj_ref, traj_est, params


def evo_stats(metric) -> dict[str, float]:
    return metric.get_all_statistics()


@pytest.mark.parametrize("align", ["sim3", "se3", "none"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ate_equals_evo(align: str, seed: int) -> None:
    ref, est, _ = make_trajectories(60, seed)
    traj_ref, traj_est, params = evo_pair(ref, est, align)
    ape = evo_metrics.APE(evo_metrics.PoseRelation.translation_part)
    ape.process_data((traj_ref, traj_est))
    ours = ate(est, ref, align=align)
    stats = evo_stats(ape)
    for key in ("rmse", "mean", "median", "std", "min", "max"):
        assert getattr(ours.stats, key) == pytest.approx(stats[key], abs=TOL), key
    np.testing.assert_allclose(ours.errors, ape.error, atol=TOL)
    if params is not None:
        r, t, s = params
        np.testing.assert_allclose(ours.alignment.R, r, atol=TOL)
        np.testing.assert_allclose(ours.alignment.t, t, atol=TOL)
        assert ours.alignment.s == pytest.approx(s, abs=TOL)


@pytest.mark.parametrize("delta, all_pairs", [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("align", ["sim3", "none"])
def test_rpe_equals_evo(delta: int, all_pairs: bool, align: str) -> None:
    ref, est, _ = make_trajectories(40, 7)
    traj_ref, traj_est, _ = evo_pair(ref, est, align)
    ours = rpe(est, ref, delta=delta, align=align, all_pairs=all_pairs)
    for relation, mine, errors in (
        (evo_metrics.PoseRelation.translation_part, ours.trans, ours.trans_errors),
        (evo_metrics.PoseRelation.rotation_angle_deg, ours.rot_deg, ours.rot_errors_deg),
    ):
        m = evo_metrics.RPE(relation, delta, evo_metrics.Unit.frames, all_pairs=all_pairs)
        m.process_data((traj_ref, traj_est))
        stats = evo_stats(m)
        for key in ("rmse", "mean", "median", "std", "min", "max"):
            assert getattr(mine, key) == pytest.approx(stats[key], abs=TOL), (relation, key)
        np.testing.assert_allclose(errors, m.error, atol=TOL)
    assert ours.pairs[:, 1].tolist() == m.delta_ids


def test_sim3_of_the_reference_has_zero_ate_and_is_recovered() -> None:
    ref, _, S = make_trajectories(25, 3, scale=0.04)
    moved = S.apply_poses(ref)
    result = ate(moved, ref, align="sim3")
    assert result.rmse < 1e-12
    np.testing.assert_allclose(result.alignment.inverse().matrix(), S.matrix(), atol=1e-9)
    assert result.alignment.s == pytest.approx(1 / 0.04)
    assert rpe(moved, ref, align="sim3").trans.rmse < 1e-12
    assert ate(moved, ref, align="se3").rmse > 0.1  # a rigid alignment cannot fix the scale


def test_degenerate_inputs_raise() -> None:
    ref, est, _ = make_trajectories(10, 4)
    with pytest.raises(ValueError, match="at least 3"):
        ate(est[:2], ref[:2], align="sim3")
    still = np.tile(np.eye(4), (6, 1, 1))
    with pytest.raises(ValueError, match="equal"):
        ate(still, ref[:6], align="sim3")
    with pytest.raises(ValueError, match="equal"):
        ate(ref[:6], still, align="se3")
    with pytest.raises(ValueError, match="different lengths"):
        ate(est, ref[:9])
    with pytest.raises(ValueError, match="different lengths"):
        rpe(est, ref[:9])
    with pytest.raises(ValueError, match="no frame pair"):
        rpe(est, ref, delta=10)
    with pytest.raises(ValueError, match="align must be"):
        ate(est, ref, align="scale")
    assert ate(est[:2], ref[:2], align="none").stats.count == 2


def rolled_trajectory(n: int, step_deg: float) -> tuple[np.ndarray, np.ndarray]:
    """Reference: camera moving along its optical axis; estimate: camera k rolled by k * step."""
    ref = np.tile(np.eye(4), (n, 1, 1))
    ref[:, 2, 3] = np.arange(n, dtype=float)
    est = ref.copy()
    est[:, :3, :3] = Rotation.from_euler("z", (np.arange(n) * step_deg)[:, None], degrees=True).as_matrix()
    return est, ref


def test_pose_auc_known_answer() -> None:
    est, ref = rolled_trajectory(5, 1.3)  # pair errors 1.3, 2.6, 3.9, 5.2 deg (4, 3, 2, 1 pairs)
    result = pose_auc(est, ref)
    assert result.num_pairs == 10
    np.testing.assert_allclose(np.sort(result.rot_errors_deg), np.repeat([1.3, 2.6, 3.9, 5.2], [4, 3, 2, 1]), atol=1e-9)
    np.testing.assert_allclose(result.trans_errors_deg, 0.0, atol=1e-6)
    assert result.auc[5] == pytest.approx((0 + 0.4 + 0.7 + 0.9 + 0.9) / 5)
    assert result.auc[3] == pytest.approx((0 + 0.4 + 0.7) / 3)
    assert result.auc[30] == pytest.approx((0 + 0.4 + 0.7 + 0.9 + 0.9 + 25 * 1.0) / 30)
    assert result.rot_acc[3] == pytest.approx(0.7)
    assert result.trans_acc[3] == 1.0

    perfect = pose_auc(ref[:3], ref[:3])
    assert all(v == 1.0 for v in perfect.auc.values())
    macro = aggregate_auc([result, perfect], mode="macro")
    micro = aggregate_auc([result, perfect], mode="micro")
    assert macro.auc[5] == pytest.approx((0.58 + 1.0) / 2)
    assert micro.auc[5] == pytest.approx((3 + 7 + 10 + 12 + 12) / 65)
    assert micro.num_pairs == 13


def test_pose_auc_is_sim3_invariant_and_folds_direction() -> None:
    ref, _, S = make_trajectories(12, 5)
    assert all(v == pytest.approx(1.0) for v in pose_auc(S.apply_poses(ref), ref).auc.values())
    backwards = ref.copy()
    backwards[:, :3, 3] *= -1  # every relative translation flips its sign (rotations kept)
    np.testing.assert_allclose(pose_auc(backwards, ref, fold_translation=True).trans_errors_deg, 0.0, atol=1e-5)
    np.testing.assert_allclose(pose_auc(backwards, ref, fold_translation=False).trans_errors_deg, 180.0, atol=1e-5)
    with pytest.raises(ValueError, match="at least 2"):
        pose_auc(ref[:1], ref[:1])
