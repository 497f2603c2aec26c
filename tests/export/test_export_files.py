"""TUM trajectory, nerfstudio dataset, depth PNGs, summary figure and export_all, each read back
with an independent reader (numpy, json, PIL, scipy)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from export_synthetic import H, N, W, expected_mask, make_recon, poses, world_point
from PIL import Image
from scipy.spatial.transform import Rotation

from mapstream.export import (
    ALL_FORMATS,
    export_all,
    summary_figure,
    write_depth_maps,
    write_nerfstudio,
    write_summary_figure,
    write_tum,
)


def test_tum_round_trip(tmp_path: Path) -> None:
    recon = make_recon()
    path = write_tum(recon, tmp_path / "traj.txt")
    assert path.read_text().startswith("# timestamp tx ty tz qx qy qz qw")
    rows = np.loadtxt(path, comments="#")
    assert rows.shape == (N, 8)
    np.testing.assert_allclose(rows[:, 0], np.arange(N) / 10.0, atol=1e-9)
    np.testing.assert_allclose(rows[:, 1:4], recon.T_world_cam[:, :, 3], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(rows[:, 4:], axis=1), 1.0, atol=1e-8)
    np.testing.assert_allclose(Rotation.from_quat(rows[:, 4:]).as_matrix(), poses()[:, :, :3], atol=1e-6)
    assert np.all(rows[:, 7] >= 0)
    keyframes = np.loadtxt(write_tum(recon, tmp_path / "kf.txt", keyframes_only=True))
    np.testing.assert_array_equal(keyframes, rows[recon.keyframe])


def _project_nerfstudio(frame: dict, point: np.ndarray) -> np.ndarray:
    """nerfstudio's camera model: OpenGL camera-to-world, pixel centres at +0.5."""
    c2w = np.array(frame["transform_matrix"])
    x, y, z = (np.linalg.inv(c2w) @ np.append(point, 1.0))[:3]
    assert z < 0  # in front of an OpenGL camera
    return np.array([frame["fl_x"] * x / -z + frame["cx"], frame["fl_y"] * -y / -z + frame["cy"]])


def test_nerfstudio_dataset(tmp_path: Path) -> None:
    recon = make_recon()
    path = write_nerfstudio(recon, tmp_path / "ns", ply_file_path="points.ply")
    data = json.loads(path.read_text())
    assert data["camera_model"] == "OPENCV" and data["ply_file_path"] == "points.ply"
    assert len(data["frames"]) == N
    T, K = poses(), recon.K.astype(np.float64)
    for i, frame in enumerate(data["frames"]):
        assert (frame["w"], frame["h"]) == (W, H)
        c2w = np.array(frame["transform_matrix"])
        assert c2w.shape == (4, 4) and np.allclose(c2w[3], [0, 0, 0, 1])
        np.testing.assert_allclose(c2w[:3, 3], T[i, :, 3], atol=1e-6)
        image = np.asarray(Image.open(tmp_path / "ns" / frame["file_path"]))
        np.testing.assert_array_equal(image, recon.images[i])
        for u, v in [(0, 0), (30, 20), (41, 27)]:  # a known 3D point seen at pixel (u, v)
            point = world_point(T[i], K[i], u, v, float(recon.depth[i, 5, 5]))
            np.testing.assert_allclose(_project_nerfstudio(frame, point), [u + 0.5, v + 0.5], atol=1e-3)
    mask = np.asarray(Image.open(tmp_path / "ns" / data["frames"][3]["mask_path"]))
    assert mask.dtype == np.uint8 and (mask == 0).sum() == 3 * W and np.all(mask[:3] == 0) and np.all(mask[3:] == 255)

    no_sky = json.loads(write_nerfstudio(make_recon(sky=False), tmp_path / "ns2").read_text())
    assert all("mask_path" not in f for f in no_sky["frames"]) and "ply_file_path" not in no_sky


def test_depth_pngs_are_exact_millimetres(tmp_path: Path) -> None:
    recon = make_recon()
    recon.depth[0, 5, 7] = 70.0  # beyond 65.535 -> saturates
    recon.depth[0, 5, 8] = 1e-4  # rounds to 0 mm but is valid -> 1
    out = write_depth_maps(recon, tmp_path)
    assert out == {"depth": tmp_path / "depth", "depth_preview": tmp_path / "depth_preview"}
    for i in range(N):
        image = Image.open(tmp_path / "depth" / f"img_{i:03d}.png")
        assert image.mode in ("I;16", "I") and image.size == (W, H)
        mm = np.asarray(image).astype(np.int64)
        with np.errstate(invalid="ignore"):
            valid = np.isfinite(recon.depth[i]) & (recon.depth[i] > 0) & ~recon.sky_mask[i]
        expected = np.where(valid, np.clip(np.rint(np.nan_to_num(recon.depth[i]) * 1000.0), 1, 65535), 0)
        np.testing.assert_array_equal(mm, expected)
        preview = np.asarray(Image.open(tmp_path / "depth_preview" / f"img_{i:03d}.png"))
        assert preview.shape == (H, W, 3) and preview.dtype == np.uint8
        assert np.all(preview[~valid] == 0) and np.all(preview[valid].max(-1) > 0)
    mm0 = np.asarray(Image.open(tmp_path / "depth" / "img_000.png"))
    assert mm0[5, 7] == 65535 and mm0[5, 8] == 1
    assert np.asarray(Image.open(tmp_path / "depth" / "img_001.png"))[0, 0] == 0  # NaN
    assert np.all(np.asarray(Image.open(tmp_path / "depth" / "img_002.png"))[0] == 0)  # zero depth


def test_summary_figure(tmp_path: Path) -> None:
    recon = make_recon()
    figure = summary_figure(recon, num_samples=3)
    top = figure.axes[0]
    keyframes = [c for c in top.collections if c.get_label() == "keyframes"]
    assert len(keyframes) == 1
    np.testing.assert_allclose(keyframes[0].get_offsets(), recon.T_world_cam[recon.keyframe][:, [0, 2], 3])
    assert top.get_xlabel() == "x" and top.get_ylabel() == "z"
    path = write_summary_figure(recon, tmp_path / "summary.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 400 and image.height > 200
        assert len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0)) > 50  # not blank


def test_export_all_writes_every_format(tmp_path: Path) -> None:
    recon = make_recon()
    written = export_all(recon, tmp_path / "out")
    out = tmp_path / "out"
    assert set(written) == {"npz", "tum", "ply", "glb", "depth", "depth_preview", "images", "colmap",
                            "nerfstudio", "masks", "summary"}  # masks: nerfstudio's, with the sky mask
    assert all(p.exists() for p in written.values())
    assert recon.sky_mask is not None
    assert sorted(p.name for p in written["masks"].iterdir()) == sorted(p.name for p in written["images"].iterdir())
    assert written["colmap"] == out / "sparse" / "0" and written["nerfstudio"] == out / "transforms.json"
    images_txt = (out / "sparse" / "0" / "images.txt").read_text().split("\n")
    names = [line.split(" ")[-1] for line in images_txt if line and not line.startswith("#")][0::2]
    assert all((out / "images" / name).exists() for name in names)  # COLMAP and nerfstudio share images/
    transforms = json.loads((out / "transforms.json").read_text())
    assert all((out / f["file_path"]).exists() for f in transforms["frames"])
    assert transforms["ply_file_path"] == "points.ply"
    for frame in transforms["frames"]:  # nerfstudio depth: 16-bit PNG, mm (unit scale 1e-3)
        depth = np.asarray(Image.open(out / frame["depth_file_path"]))
        assert depth.shape == (frame["h"], frame["w"]) and depth.dtype == np.uint16
    with np.load(out / "predictions.npz") as data:
        np.testing.assert_array_equal(data["depth"], recon.depth)
    assert not list(out.rglob(".*tmp-*"))  # no temp file left anywhere
    assert len(list((out / "depth").iterdir())) == N

    only = export_all(recon, tmp_path / "only", formats=["tum", "ply"], conf_threshold=2.5)
    assert set(only) == {"tum", "ply"} and sorted(p.name for p in (tmp_path / "only").iterdir()) == [
        "points.ply", "trajectory_tum.txt"]
    import plyfile

    count = len(plyfile.PlyData.read(str(only["ply"]))["vertex"].data)
    assert count == expected_mask(recon, threshold=2.5).sum()
    with pytest.raises(ValueError, match=r"unknown export formats \['obj'\]"):
        export_all(recon, tmp_path / "x", formats=["obj"])
    assert set(ALL_FORMATS) <= set(written)

    # The frames alone, as the model saw them (the reference demo's --export_preprocessed), lossless.
    images = export_all(recon, tmp_path / "images_only", formats=["images"])
    assert set(images) == {"images"} and sorted(p.name for p in (tmp_path / "images_only").iterdir()) == ["images"]
    files = sorted(images["images"].iterdir())
    assert len(files) == N
    np.testing.assert_array_equal(np.asarray(Image.open(files[0]).convert("RGB")), recon.images[0])


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_the_runs_table_of_what_each_format_writes_is_export_alls(tmp_path: Path, fmt: str) -> None:
    """`mapstream run` removes what a run stopped while exporting may have written from its
    formats' names (`pipeline.outputs.FORMAT_OUTPUTS`): each format writes exactly those entries
    (masks only with sky masks)."""
    from mapstream.pipeline.outputs import FORMAT_OUTPUTS as table
    assert set(table) == set(ALL_FORMATS)
    for sky, recon in (("with", make_recon()), ("without", make_recon(sky=False))):
        out = tmp_path / sky
        written = export_all(recon, out, formats=[fmt])
        entries = {str(Path(p).relative_to(out)) for p in written.values()}
        expected = {e for e in table[fmt] if e != "masks" or recon.sky_mask is not None}
        assert entries == expected, (fmt, sky)
        assert {p.name for p in out.iterdir()} == {e.split("/")[0] for e in expected}, (fmt, sky)


def test_export_all_counts_its_outputs_on_a_bar_when_asked(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """progress=True: one bar over the writing steps (the point cloud is one, built once for
    PLY and GLB); the default stays silent off a terminal, and the files are the same."""
    recon = make_recon()
    export_all(recon, tmp_path / "quiet", formats=["tum", "ply", "glb"])
    assert capfd.readouterr().err == ""
    export_all(recon, tmp_path / "shown", formats=["tum", "ply", "glb"], progress=True)
    err = capfd.readouterr().err
    assert "export" in err and "4/4" in err  # tum, point cloud, ply, glb
    for name in ("trajectory_tum.txt", "points.ply"):
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "shown" / name).read_bytes()


def test_export_all_single_frame_without_sky(tmp_path: Path) -> None:
    recon = make_recon(sky=False).select([2])
    written = export_all(recon, tmp_path, formats=["tum", "glb", "colmap", "nerfstudio", "summary"])
    assert np.loadtxt(written["tum"]).shape == (8,)
    assert len(json.loads(written["nerfstudio"].read_text())["frames"]) == 1
    assert (tmp_path / "images" / "img_002.png").exists() and (tmp_path / "summary.png").exists()
    assert "ply_file_path" not in json.loads(written["nerfstudio"].read_text())


def test_mapstream_export_writes_a_runs_outputs_again_without_the_model(tmp_path: Path, capsys, monkeypatch) -> None:
    """`mapstream export RUN` re-exports from predictions.npz: another threshold reaches the
    PLY; in the run folder itself predictions.npz is left as it is; into another folder it is
    copied too; bad options are refused before the run is read."""
    import plyfile

    import mapstream.viewer as viewer
    from mapstream.cli.main import main

    recon = make_recon()
    run = tmp_path / "run"
    export_all(recon, run, formats=["npz", "ply"])
    npz_before = (run / "predictions.npz").read_bytes()
    assert main(["export", str(run), "--formats", "ply", "tum", "--conf-threshold", "2.5", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == f"{N} frames from {run / 'predictions.npz'} -> {run}: ply, tum"
    count = len(plyfile.PlyData.read(str(run / "points.ply"))["vertex"].data)
    assert count == expected_mask(recon, threshold=2.5).sum()
    assert (run / "predictions.npz").read_bytes() == npz_before

    assert main(["export", str(run), "--quiet"]) == 0  # every format but the file being read
    assert "npz" not in capsys.readouterr().out.split(": ")[-1].split(", ")
    assert (run / "predictions.npz").read_bytes() == npz_before and (run / "scene.glb").is_file()

    other = tmp_path / "other"
    assert main(["export", str(run), "--out", str(other), "--formats", "npz", "ply", "--quiet",
                 "--drop-white-background"]) == 0
    capsys.readouterr()
    with np.load(other / "predictions.npz") as data:
        np.testing.assert_array_equal(data["depth"], recon.depth)

    part = tmp_path / "part"
    assert main(["export", str(run), "--out", str(part), "--formats", "tum", "--frames", "1:4:2", "--quiet"]) == 0
    capsys.readouterr()
    rows = np.loadtxt(part / "trajectory_tum.txt", ndmin=2)  # frames 1 and 3, with their own times
    np.testing.assert_allclose(rows[:, 0], recon.timestamps[[1, 3]])
    np.testing.assert_allclose(rows[:, 1:4], recon.T_world_cam[[1, 3], :, 3], atol=1e-6)
    assert main(["export", str(run), "--out", str(part), "--frames", "10:", "--quiet"]) == 2
    assert f"--frames 10:: selects none of the run's {N} frames" in capsys.readouterr().err

    # A folder a run (or another export) is writing to is refused, as `mapstream run` refuses it.
    from mapstream.pipeline.folder_lock import lock_run_folder

    with lock_run_folder(run):
        assert main(["export", str(run), "--formats", "tum", "--quiet"]) == 2
    assert f"is writing to {run}" in capsys.readouterr().err
    assert main(["export", str(run), "--formats", "tum", "--quiet"]) == 0
    capsys.readouterr()

    monkeypatch.setattr(viewer, "load_run", lambda *a: pytest.fail("the run was read"))
    for bad, message in [(["--formats", "obj"], "unknown export formats ['obj']"),
                         (["--frames", "a:b"], "--frames 'a:b': expected START:STOP"),
                         (["--frames", "::-1"], "the step must be a positive integer"),
                         (["--conf-threshold", "nan"], "--conf-threshold is NaN"),
                         (["--voxel-size", "0"], "--voxel-size must be > 0")]:
        assert main(["export", str(run), "--quiet", *bad]) == 2
        assert message in capsys.readouterr().err


def test_frame_ranges_read_as_python_slices() -> None:
    from mapstream.cli._frames import frame_slice

    assert frame_slice("0:100") == slice(0, 100, None) and frame_slice("50:") == slice(50, None, None)
    assert frame_slice("::2") == slice(None, None, 2) and frame_slice("-30:") == slice(-30, None, None)
    for bad in ("5", "1:2:3:4", "x:", "1.5:3", "::0"):
        with pytest.raises(ValueError, match="--frames"):
            frame_slice(bad)
