"""End-to-end evaluation on synthetic scenes: oracle runs, JSON, table, CLI body, matching."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from mapstream.eval.datasets import read_benchmark_scene
from mapstream.eval.predictions import write_predictions
from mapstream.eval.runner import eval_main, evaluate, format_table, match_frames
from mapstream.geometry.align import Sim3
from mapstream.synthetic import render_sequence, write_sequence

HW = (84, 140)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A synthetic scene in the benchmark layout: (sequence, its folder)."""
    seq = render_sequence(num_frames=8, image_hw=HW, seed=5)
    root = tmp_path_factory.mktemp("data") / "room_a"
    write_sequence(seq, root / "gt")  # EXR when a backend is installed, else .npy
    return seq, root


def oracle_run(seq, run_dir: Path, S: Sim3 | None = None, names: list[str] | None = None) -> Path:
    """Ground truth written as a run's predictions.npz, optionally moved by a Sim(3)."""
    T = seq.T_world_cam if S is None else S.apply_poses(seq.T_world_cam)
    depth = seq.depth if S is None else seq.depth * S.s
    names = names if names is not None else [f"{n}.png" for n in seq.names]
    write_predictions(run_dir, names=names, T_world_cam=T, K=seq.K, depth=depth)
    return run_dir


def assert_perfect(metrics: dict) -> None:
    assert metrics["trajectory"]["ate"] < 1e-6
    assert metrics["trajectory"]["rpe_rot_deg"] < 1e-4
    assert all(metrics["pose_auc"][f"auc@{t}"] == 1.0 for t in (3, 5, 15, 30))
    assert metrics["depth"]["abs_rel"] < 1e-6 and metrics["depth"]["delta_1"] == 1.0
    assert metrics["points"]["chamfer"] < 1e-5
    assert metrics["points"]["f1"] == 1.0


def test_oracle_run_scores_perfectly(scene, tmp_path: Path) -> None:
    seq, root = scene
    run = oracle_run(seq, tmp_path / "run")
    report = evaluate(run, root, out=tmp_path / "eval.json")
    (s,) = report.scenes
    assert s.name == "room_a" and s.match == "name" and s.num_frames == len(seq) and not s.errors
    assert_perfect(s.metrics)
    data = json.loads((tmp_path / "eval.json").read_text())
    groups = data["scenes"]["room_a"]["metrics"]
    assert set(groups) == {"trajectory", "pose_auc", "depth", "points"}
    assert all("align" in g for g in groups.values())  # the alignment next to every number
    assert groups["trajectory"]["align"] == "sim3" and groups["depth"]["align"] == "median per frame"
    assert data["aggregate"]["trajectory"]["ate"] < 1e-6


def test_oracle_under_a_sim3_scores_perfectly_after_alignment(scene, tmp_path: Path) -> None:
    seq, root = scene
    S = Sim3(Rotation.random(random_state=1).as_matrix(), np.array([3.0, -1.0, 0.5]), 0.25)
    run = oracle_run(seq, tmp_path / "run", S)
    report = evaluate(run, root, icp=True)
    metrics = report.scenes[0].metrics
    assert_perfect(metrics)
    assert metrics["trajectory"]["alignment"]["scale"] == pytest.approx(4.0, rel=1e-5)
    assert metrics["depth"]["mean_scale"] == pytest.approx(4.0, rel=1e-5)
    rigid = evaluate(run, root, align="se3", points=False).scenes[0].metrics
    assert rigid["trajectory"]["ate"] > 0.1 and rigid["trajectory"]["align"] == "se3"


def test_prediction_at_a_lower_resolution(scene, tmp_path: Path) -> None:
    """A prediction without a run.json (an oracle, another tool) is taken as an aspect-keeping
    resize of the photo, centre-cropped to the prediction's shape."""
    seq, root = scene
    K = seq.K.copy()  # half resolution: pixel u_low <-> pixel 2 u_low + 1 at full resolution
    K[:, :2, :2] /= 2
    K[:, :2, 2] = (K[:, :2, 2] - 1) / 2
    write_predictions(tmp_path / "run", names=[f"{n}.png" for n in seq.names], T_world_cam=seq.T_world_cam,
                      K=K, depth=seq.depth[:, 1::2, 1::2])
    m = evaluate(tmp_path / "run", root, voxel_size=0).scenes[0].metrics  # 0: no voxel grid
    assert "no run.json" in m["depth"]["gt_resize"] and m["depth"]["abs_rel"] < 1e-6
    assert m["points"]["accuracy"] < 1e-5 and m["points"]["precision"] == 1.0  # a subset of the GT pixels
    assert m["points"]["num_pred"] == m["points"]["num_gt"] // 4

    K = seq.K.copy()  # a centre crop of 14 columns on each side (another aspect ratio)
    K[:, 0, 2] -= 14
    write_predictions(tmp_path / "crop", names=seq.names, T_world_cam=seq.T_world_cam, K=K,
                      depth=seq.depth[:, :, 14:-14])
    m = evaluate(tmp_path / "crop", root, voxel_size=0).scenes[0].metrics
    assert "centre crop" in m["depth"]["gt_resize"] and m["depth"]["abs_rel"] < 1e-6
    assert m["points"]["accuracy"] < 1e-5


def test_dataset_of_scenes_is_aggregated(scene, tmp_path: Path) -> None:
    seq_a, root_a = scene
    seq_b = render_sequence(num_frames=6, image_hw=HW, seed=6)
    data = tmp_path / "dataset"
    write_sequence(seq_a, data / "room_a" / "gt", depth_format="npy")
    write_sequence(seq_b, data / "room_b" / "gt", depth_format="png")
    runs = tmp_path / "runs"
    oracle_run(seq_a, runs / "room_a")
    noisy = seq_b.T_world_cam.copy()
    noisy[:, :3, 3] += np.random.default_rng(0).normal(scale=0.05, size=(len(noisy), 3))
    write_predictions(runs / "room_b", names=seq_b.names, T_world_cam=noisy, K=seq_b.K, depth=seq_b.depth)
    write_sequence(seq_b, data / "room_c" / "gt", depth_format="npy")  # no run for this one
    report = evaluate(runs, data, points=False)
    assert [s.name for s in report.scenes] == ["room_a", "room_b", "room_c"]
    assert "no run folder" in report.scenes[2].errors["scene"] and not report.scenes[2].metrics
    ate_b = report.scenes[1].metrics["trajectory"]["ate"]
    assert ate_b > 0.01
    agg = report.aggregate
    assert agg["trajectory"]["num_scenes"] == 2 and agg["trajectory"]["ate"] == pytest.approx(ate_b / 2, rel=1e-3)
    assert agg["depth"]["abs_rel"] < 2e-4  # room_b's depth went through 16-bit millimetre PNGs
    assert agg["pose_auc_macro"]["auc@30"] == pytest.approx(
        np.mean([s.metrics["pose_auc"]["auc@30"] for s in report.scenes[:2]]))
    assert agg["pose_auc_micro"]["num_pairs"] == 28 + 15
    table = format_table(report)
    for word in ("Trajectory", "Pose AUC", "Depth", "room_a", "room_b", "mean", "micro"):
        assert word in table


def test_eval_main(scene, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seq, root = scene
    run = oracle_run(seq, tmp_path / "run")
    shown: list[str] = []
    assert eval_main(str(run), str(root), None, "sim3", emit=shown.append) == 0
    assert (run / "eval.json").is_file() and "ATE" in shown[0]
    with caplog.at_level(logging.INFO, logger="mapstream.eval.runner"):
        assert eval_main(str(run), str(root), str(tmp_path / "x" / "out.json"), "se3") == 0
    assert "Trajectory [align: se3]" in caplog.text
    assert json.loads((tmp_path / "x" / "out.json").read_text())["settings"]["align"] == "se3"
    assert eval_main(str(tmp_path / "missing"), str(root), None, "sim3") == 2
    assert eval_main(str(run), str(root), str(tmp_path / "y.json"), "affine") == 2
    assert "align must be" in caplog.text
    # A predictions file cut short (a copy interrupted): told with its path, not a traceback.
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "predictions.npz").write_bytes((run / "predictions.npz").read_bytes()[:200])
    with caplog.at_level(logging.ERROR, logger="mapstream.eval.runner"):
        assert eval_main(str(cut), str(root), None, "sim3") == 2
    assert f"{cut / 'predictions.npz'} is damaged or not a predictions file" in caplog.text


def test_degenerate_trajectory_is_reported_not_fatal(scene, tmp_path: Path) -> None:
    seq, root = scene
    still = np.repeat(seq.T_world_cam[:1], len(seq), 0)
    write_predictions(tmp_path / "run", names=seq.names, T_world_cam=still, K=seq.K, depth=seq.depth)
    s = evaluate(tmp_path / "run", root).scenes[0]
    assert "equal" in s.errors["trajectory"] and "points" in s.errors
    assert s.metrics["depth"]["abs_rel"] < 1e-6
    assert "trajectory not computed" in format_table(evaluate(tmp_path / "run", root, points=False))


def test_frame_matching(scene) -> None:
    _, root = scene
    gt = read_benchmark_scene(root)
    names = [f"images/{n}.jpg" for n in gt.frame_names]
    pi, gi, how = match_frames(names[::-1], gt)
    assert how == "name" and (gi == np.arange(len(gt))[::-1]).all() and (pi == np.arange(len(gt))).all()
    stamps = [f"{t + 0.004:.3f}" for t in gt.timestamps[2:5]]
    pi, gi, how = match_frames(stamps, gt)
    assert how == "timestamp" and gi.tolist() == [2, 3, 4]
    pi, gi, how = match_frames([f"f{i}" for i in range(len(gt))], gt)
    assert how == "index"
    pi, gi, how = match_frames(["a", "b"], gt, pred_timestamps=gt.timestamps[[5, 1]] - 0.003)
    assert how == "timestamp" and gi.tolist() == [5, 1]
    with pytest.raises(ValueError, match="cannot match"):
        match_frames(["a", "b"], gt)
    with pytest.raises(ValueError, match="by timestamp"):
        match_frames(["a", "b"], gt, mode="timestamp")


def test_oracle_through_the_exporter(scene, tmp_path: Path) -> None:
    """Ground truth saved by the run exporter (``Reconstruction.save_npz``) scores perfectly."""
    reconstruction = pytest.importorskip("mapstream.export.reconstruction")
    seq, root = scene
    n = len(seq)
    recon = reconstruction.Reconstruction(
        images=seq.rgb, depth=seq.depth, depth_conf=np.full_like(seq.depth, 2.0), T_world_cam=seq.T_world_cam,
        K=seq.K, pose_enc=np.zeros((n, 9), np.float32), names=[f"{name}.png" for name in seq.names],
    )
    recon.save_npz(tmp_path / "run" / "predictions.npz")
    report = evaluate(tmp_path / "run", root)
    assert report.scenes[0].match == "name"
    assert_perfect(report.scenes[0].metrics)


def test_timestamp_matching_uses_the_runs_own_times_not_numbered_file_names(scene, tmp_path: Path) -> None:
    """A run of ``000000.png``, ``000001.png``... at 10 fps: its times are 0.0, 0.1... s (as the
    ground truth's), so `--match timestamp` pairs every frame; the names read as seconds would
    pair one."""
    reconstruction = pytest.importorskip("mapstream.export.reconstruction")
    seq, root = scene
    n = len(seq)
    recon = reconstruction.Reconstruction(
        images=seq.rgb, depth=seq.depth, depth_conf=np.full_like(seq.depth, 2.0), T_world_cam=seq.T_world_cam,
        K=seq.K, pose_enc=np.zeros((n, 9), np.float32), names=[f"{i:06d}.png" for i in range(n)], fps=10.0,
    )
    recon.save_npz(tmp_path / "run" / "predictions.npz")
    (s,) = evaluate(tmp_path / "run", root, match="timestamp").scenes
    assert s.match == "timestamp" and s.num_frames == n
    assert_perfect(s.metrics)


def test_timestamp_matching_warns_when_most_frames_do_not_pair(scene, caplog: pytest.LogCaptureFixture) -> None:
    _, root = scene
    gt = read_benchmark_scene(root)
    stamps = gt.timestamps + np.where(np.arange(len(gt)) < 2, 0.0, 0.05)  # 2 of 8 within 0.02 s
    names = [f"f{i}" for i in range(len(gt))]
    with caplog.at_level(logging.WARNING, logger="mapstream.eval.matching"):
        pi, gi, how = match_frames(names, gt, mode="timestamp", pred_timestamps=stamps)
    assert how == "timestamp" and gi.tolist() == [0, 1]
    assert "only 2 of 8 predicted frames" in caplog.text and "--max-dt" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mapstream.eval.matching"):
        match_frames(names, gt, mode="timestamp", pred_timestamps=gt.timestamps)
    assert caplog.text == ""


def test_the_cloud_is_placed_by_the_poses_where_a_short_path_leaves_the_centres_loose(scene, tmp_path: Path) -> None:
    # Exact orientations and depth, camera centres off by about 10 cm (a streamed model's ATE
    # on such rooms): the 8 centres along a short arc fit a rotation about the arc that swings
    # the far walls by half a metre; the orientations fix it.
    seq, root = scene
    T = seq.T_world_cam.copy()
    T[:, :3, 3] += np.random.default_rng(1).normal(scale=0.1, size=(len(seq), 3))
    write_predictions(tmp_path / "run", names=[f"{n}.png" for n in seq.names], T_world_cam=T, K=seq.K, depth=seq.depth)
    by_poses = evaluate(tmp_path / "run", root).scenes[0].metrics["points"]
    by_centres = evaluate(tmp_path / "run", root, points_align="trajectory").scenes[0].metrics["points"]
    assert by_poses["align"] == "sim3 (poses)" and by_centres["align"] == "sim3 (trajectory)"
    assert by_poses["chamfer"] < 0.05 and by_centres["chamfer"] > 0.5
    with pytest.raises(ValueError, match="points_align must be one of"):
        evaluate(tmp_path / "run", root, points_align="icp")
    from mapstream.cli.main import main

    assert main(["eval", str(tmp_path / "run"), "--gt", str(root), "--points-align", "trajectory"]) == 0
    written = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert written["scenes"]["room_a"]["metrics"]["points"]["chamfer"] == pytest.approx(by_centres["chamfer"])
