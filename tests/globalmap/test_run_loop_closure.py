"""`mapstream run --loop-closure` end to end on the tiny preset: what run.json records, outputs
unchanged when no loop closes, known poses as priors, and the refusals."""
import json

import numpy as np
import pytest

pytest.importorskip("gtsam")
pytest.importorskip("faiss")

from mapstream.cli.main import main  # noqa: E402
from mapstream.geometry import quat_to_mat  # noqa: E402
from mapstream.synthetic import render_sequence, write_sequence  # noqa: E402

import torch  # noqa: E402


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    seq = render_sequence(20, (56, 98), seed=21, arc=1.0)
    folder = write_sequence(seq, tmp_path_factory.mktemp("scene") / "gt", depth_format="npy")
    return seq, folder


def _run(folder, out, *extra) -> int:
    return main(["run", str(folder / "rgb"), "--out", str(out), "--model", "tiny", "--image-size", "98",
                 "--num-scale-frames", "2", "--formats", "npz", "tum", "--quiet", "--no-resume", *extra])


def _npz(out):
    with np.load(out / "predictions.npz") as data:
        return {k: data[k] for k in ("T_world_cam", "depth", "pose_enc")}


def test_with_no_loop_the_outputs_are_the_stream_and_run_json_records_the_map(scene, tmp_path):
    _, folder = scene
    assert _run(folder, tmp_path / "plain") == 0
    assert _run(folder, tmp_path / "map", "--loop-closure", "--map.min-similarity", "1.0") == 0
    plain, mapped = _npz(tmp_path / "plain"), _npz(tmp_path / "map")
    np.testing.assert_allclose(mapped["T_world_cam"], plain["T_world_cam"], atol=1e-5)
    np.testing.assert_allclose(mapped["depth"], plain["depth"], rtol=1e-5)
    record = json.loads((tmp_path / "map" / "run.json").read_text())["loop_closure"]
    assert record["stats"]["keyframes"] == 5  # frames 0, 4, 8, 12, 16
    assert record["stats"]["loops"] == 0 and record["loops"] == []
    assert json.loads((tmp_path / "plain" / "run.json").read_text())["loop_closure"] is None
    config = json.loads((tmp_path / "map" / "run.json").read_text())["config"]["options"]
    assert "'keyframe_every': 4" in config["map"]


def _write_tum(path, stamps, poses):
    from mapstream.geometry import mat_to_quat

    quats = mat_to_quat(torch.from_numpy(poses[:, :3, :3])).numpy()
    lines = [f"{t:.6f} " + " ".join(f"{v:.9f}" for v in (*T[:3, 3], *q)) for t, T, q in zip(stamps, poses, quats)]
    path.write_text("# timestamp tx ty tz qx qy qz qw\n" + "\n".join(lines) + "\n")


def test_known_poses_put_the_map_in_their_frame(scene, tmp_path):
    seq, folder = scene
    known = list(range(0, 20, 5))
    tum = tmp_path / "known.tum"
    _write_tum(tum, seq.timestamps[known], seq.T_world_cam[known])
    assert _run(folder, tmp_path / "run", "--loop-closure", "--map.min-similarity", "1.0",
                "--known-poses", str(tum)) == 0
    priors = json.loads((tmp_path / "run" / "run.json").read_text())["loop_closure"]["priors"]
    assert priors["known_poses"] == 4
    out = _npz(tmp_path / "run")
    # The known frames' corrected centres are where run.json says, near the known ones.
    gap = out["T_world_cam"][known, :, 3] - seq.T_world_cam[known, :3, 3]
    rms = float(np.sqrt((gap**2).sum(1).mean()))
    assert rms == pytest.approx(priors["rms_to_known"], rel=1e-3, abs=1e-4)
    # Untrained weights make poor odometry, but the map is in the known frame now, which
    # lies metres away from the stream's own (its first camera at the origin).
    assert rms < 0.5 < float(np.linalg.norm(seq.T_world_cam[0, :3, 3]))
    # Pose encodings follow the corrected poses.
    np.testing.assert_allclose(out["pose_enc"][:, :3], out["T_world_cam"][:, :, 3], atol=1e-5)
    R = quat_to_mat(torch.from_numpy(out["pose_enc"][:, 3:7].astype(np.float64))).numpy()
    np.testing.assert_allclose(R, out["T_world_cam"][:, :, :3], atol=1e-4)


def test_known_poses_without_the_map_or_without_matching_times_are_refused(scene, tmp_path, capsys):
    seq, folder = scene
    tum = tmp_path / "known.tum"
    _write_tum(tum, seq.timestamps[:3], seq.T_world_cam[:3])
    assert _run(folder, tmp_path / "a", "--known-poses", str(tum)) != 0
    assert "add --loop-closure" in capsys.readouterr().err
    _write_tum(tum, seq.timestamps[:3] + 1000.0, seq.T_world_cam[:3])
    assert _run(folder, tmp_path / "b", "--loop-closure", "--known-poses", str(tum)) != 0
    assert "none of its 3 timestamps" in capsys.readouterr().err
    tum.write_text("0.0 1 2 3\n")
    assert _run(folder, tmp_path / "c", "--loop-closure", "--known-poses", str(tum)) != 0
    assert "expected 8 values" in capsys.readouterr().err
