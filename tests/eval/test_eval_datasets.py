"""Dataset readers and writers: TUM RGB-D, the benchmark layout, depth files, run predictions."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.spatial.transform import Rotation

from mapstream.eval.datasets import (
    TUM_INTRINSICS,
    canonical_timestamp,
    find_scenes,
    read_benchmark_scene,
    read_sequence,
    read_tum_sequence,
    write_benchmark_scene,
)
from mapstream.eval.depth_io import exr_available, read_depth, write_depth
from mapstream.eval.predictions import read_predictions, write_predictions


def make_tum(root: Path) -> Path:
    """A tiny fake TUM sequence: 6 RGB frames at 30 Hz, poses at 100 Hz starting late, depth 10 ms off."""
    root.mkdir(parents=True)
    t0 = 1305031102.175304
    rgb_t = t0 + np.arange(6) / 30
    (root / "rgb").mkdir()
    (root / "depth").mkdir()
    lines = ["# color images", "# file: 'x.bag'", "# timestamp filename"]
    lines += [f"{t:.6f} rgb/{t:.6f}.png" for t in rgb_t]
    (root / "rgb.txt").write_text("\n".join(lines) + "\n")
    depth_lines = ["# depth maps"]
    for k, t in enumerate(rgb_t + 0.01):
        depth_lines.append(f"{t:.6f} depth/{t:.6f}.png")
        Image.fromarray(np.full((4, 5), 5000 * (k + 1), np.uint16)).save(root / f"depth/{t:.6f}.png")
    (root / "depth.txt").write_text("\n".join(depth_lines) + "\n")
    gt_t = np.arange(rgb_t[0] + 0.07, rgb_t[-1] + 0.1, 0.01)  # the first two RGB frames have no pose
    q = Rotation.from_euler("z", 90, degrees=True).as_quat()  # x y z w
    gt_lines = ["# ground truth trajectory", "# timestamp tx ty tz qx qy qz qw"]
    gt_lines += [f"{t:.4f} {t - t0:.4f} 2.0 3.0 {q[0]:.6f} {q[1]:.6f} {q[2]:.6f} {q[3]:.6f}" for t in gt_t]
    (root / "groundtruth.txt").write_text("\n".join(gt_lines) + "\n")
    return root


def test_tum_reader(tmp_path: Path) -> None:
    root = make_tum(tmp_path / "rgbd_dataset_freiburg1_xyz")
    seq = read_tum_sequence(root, camera="auto")
    assert len(seq) == 4  # frames 0 and 1 are more than 0.02 s before the first pose
    assert seq.frame_names[0] == f"{1305031102.175304 + 2 / 30:.6f}"
    np.testing.assert_allclose(seq.T_world_cam[:, :3, 3], np.c_[seq.timestamps - 1305031102.175304,
                                                                np.full(4, 2.0), np.full(4, 3.0)], atol=0.006)
    np.testing.assert_allclose(seq.T_world_cam[0, :3, :3], [[0, -1, 0], [1, 0, 0], [0, 0, 1]], atol=1e-6)
    fx, fy, cx, cy = TUM_INTRINSICS["freiburg1"]
    np.testing.assert_allclose(seq.K[0], [[fx, 0, cx], [0, fy, cy], [0, 0, 1]])
    assert seq.image_hw == (480, 640)
    np.testing.assert_allclose(seq.load_depth(0), 3.0)  # frame 2's depth map: 15000 / 5000
    assert read_tum_sequence(root).K[0, 0, 0] == 525.0  # the default camera
    assert read_sequence(root).name == root.name
    with pytest.raises(ValueError, match="camera"):
        read_tum_sequence(root, camera="kinect")


def random_depth() -> np.ndarray:
    depth = np.random.default_rng(0).uniform(0.3, 20.0, size=(7, 9)).astype(np.float32)
    depth[0, 0] = 0.0
    depth[1, 1] = np.nan  # invalid -> stored as 0
    return depth


@pytest.mark.parametrize("fmt", ["npy", "png", "exr"])
def test_depth_files_round_trip(tmp_path: Path, fmt: str) -> None:
    if fmt == "exr" and not exr_available():
        pytest.skip("no EXR backend (OpenEXR or PyAV)")
    depth = random_depth()
    back = read_depth(write_depth(tmp_path / f"d.{fmt}", depth))
    assert back.dtype == np.float32 and back.shape == depth.shape
    expected = np.nan_to_num(depth, nan=0.0)
    if fmt == "png":
        np.testing.assert_allclose(back, expected, atol=0.5e-3)  # millimetres
    else:
        np.testing.assert_array_equal(back, expected)


def test_exr_backends_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by one backend are read exactly by the other (both write a ZIP'd Y channel)."""
    pytest.importorskip("OpenEXR")
    pytest.importorskip("av")
    import mapstream.eval.depth_io as depth_io

    depth = np.nan_to_num(random_depth(), nan=0.0)
    write_depth(tmp_path / "openexr.exr", depth)
    with monkeypatch.context() as m:
        m.setattr(depth_io, "_openexr", lambda: None)
        assert depth_io.exr_backend() == "pyav"
        np.testing.assert_array_equal(read_depth(tmp_path / "openexr.exr"), depth)
        write_depth(tmp_path / "pyav.exr", depth)
    np.testing.assert_array_equal(read_depth(tmp_path / "pyav.exr"), depth)


def test_missing_exr_backend_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mapstream.eval.depth_io as depth_io

    monkeypatch.setattr(depth_io, "_module", lambda name: None)
    assert not exr_available()
    with pytest.raises(RuntimeError, match="pip install openexr"):
        write_depth(tmp_path / "d.exr", np.ones((2, 2)))


def test_benchmark_layout_round_trip(tmp_path: Path) -> None:
    n, hw = 3, (6, 8)
    rng = np.random.default_rng(1)
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, :3, :3] = Rotation.random(n, random_state=2).as_matrix()
    T[:, :3, 3] = rng.normal(size=(n, 3))
    K = np.array([[10.0, 0, 4], [0, 11.0, 3], [0, 0, 1]])
    rgb = rng.integers(0, 255, size=(n, *hw, 3), dtype=np.uint8)
    depth = rng.uniform(1, 5, size=(n, *hw)).astype(np.float32)
    ts = np.array([0.0, 0.1, 12.3456789])
    write_benchmark_scene(tmp_path / "scene" / "gt", ts, T, K, hw, rgb=rgb, depth=depth, depth_format="npy")
    text = (tmp_path / "scene" / "gt" / "intrinsics.txt").read_text()
    assert text.startswith("#") and len(text.splitlines()) == n + 1
    assert (tmp_path / "scene" / "gt" / "rgb" / "000000012.345679.png").is_file()
    for path in (tmp_path / "scene", tmp_path / "scene" / "gt"):
        seq = read_benchmark_scene(path)
        assert seq.name == "scene" and len(seq) == n
        assert seq.frame_names == [canonical_timestamp(t) for t in ts]
        np.testing.assert_allclose(seq.T_world_cam, T, atol=1e-11)
        np.testing.assert_allclose(seq.K, np.repeat(K[None], n, 0))
        assert seq.image_hw == hw
        np.testing.assert_array_equal(seq.load_rgb(2), rgb[2])
        np.testing.assert_array_equal(seq.load_depth(1), depth[1])
    assert list(find_scenes(tmp_path)) == ["scene"]
    assert list(find_scenes(tmp_path / "scene")) == ["scene"]
    with pytest.raises(FileNotFoundError, match="no sequence"):
        find_scenes(tmp_path / "scene" / "gt" / "rgb")


def test_predictions_contract(tmp_path: Path) -> None:
    n = 4
    T = np.tile(np.eye(4), (n, 1, 1))
    T[:, :3, :3] = Rotation.random(n, random_state=3).as_matrix()
    T[:, :3, 3] = np.arange(3 * n).reshape(n, 3)
    K = np.repeat(np.array([[20.0, 0, 8], [0, 20.0, 6], [0, 0, 1]])[None], n, 0)
    depth = np.ones((n, 12, 16), np.float32)
    names = [f"frame_{i:03d}.png" for i in range(n)]
    write_predictions(tmp_path / "run", names=names, T_world_cam=T, K=K, depth=depth)
    assert (tmp_path / "run" / "trajectory_tum.txt").is_file()
    pred = read_predictions(tmp_path / "run")
    assert pred.names == names and pred.image_hw == (12, 16) and len(pred) == n
    np.testing.assert_allclose(pred.T_world_cam, T, atol=1e-5)

    # A run that only stored T_cam_world is inverted.
    with np.load(tmp_path / "run" / "predictions.npz") as z:
        data = {k: z[k] for k in z.files if k != "T_world_cam"}
    np.savez(tmp_path / "other.npz", **data)
    np.testing.assert_allclose(read_predictions(tmp_path / "other.npz").T_world_cam, T, atol=1e-5)

    del data["names"]
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(ValueError, match="names"):
        read_predictions(tmp_path / "bad.npz")
    with pytest.raises(FileNotFoundError, match="predictions.npz"):
        read_predictions(tmp_path / "nowhere")


@pytest.mark.parametrize("fmt", ["npy", "png"])
def test_eval_writers_interrupted_keep_the_previous_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """Every eval writer goes through a temp file: a write that fails half-way leaves the
    previous complete file (and no temp file) where a reader or a resumed run looks."""
    import mapstream.eval.predictions as predictions_module
    from mapstream.eval.runner import write_json_atomic

    n, hw = 2, (4, 6)
    T = np.tile(np.eye(4), (n, 1, 1))
    K = np.array([[5.0, 0, 3], [0, 5.0, 2], [0, 0, 1]])
    depth = np.full((n, *hw), 2.0, np.float32)
    rgb = np.zeros((n, *hw, 3), np.uint8)
    scene = tmp_path / "scene"
    write_benchmark_scene(scene, np.array([0.0, 0.5]), T, K, hw, rgb=rgb, depth=depth, depth_format=fmt)
    write_predictions(tmp_path / "run", names=["a", "b"], T_world_cam=T, K=np.repeat(K[None], n, 0), depth=depth)
    write_json_atomic(tmp_path / "eval.json", {"ate": 1.0})
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    def fail(target, *args, **kwargs):
        """A writer that gets half-way: some bytes written to its target, then an error."""
        if hasattr(target, "write"):
            target.write(b"half" if "b" in getattr(target, "mode", "b") else "half")
        else:
            Path(target).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", fail)
    monkeypatch.setattr(Image.Image, "save", lambda self, target, *a, **k: fail(target))
    monkeypatch.setattr(predictions_module.np, "savez", fail)
    with pytest.raises(OSError, match="disk full"):
        write_benchmark_scene(scene, np.array([0.0, 0.5]), T, K, hw, rgb=rgb + 1, depth=depth * 2, depth_format=fmt)
    with pytest.raises(OSError, match="disk full"):
        write_depth(scene / "depth" / f"000000000.000000.{fmt}", depth[0] * 3)
    with pytest.raises(OSError, match="disk full"):
        write_predictions(tmp_path / "run", names=["c", "d"], T_world_cam=T, K=np.repeat(K[None], n, 0), depth=depth)
    monkeypatch.setattr("json.dump", lambda data, handle, **kwargs: fail(handle))
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(tmp_path / "eval.json", {"ate": 2.0})

    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after.keys() == before.keys(), "a temp file was left behind or a file went missing"
    changed = [p for p in before if after[p] != before[p]]
    # (traj.txt and intrinsics.txt were written again before the failing image write, with
    # the same poses and timestamps, so they read as before too.)
    assert changed == []
