"""COLMAP text model, read back by a strict parser of COLMAP's documented format (and pycolmap
when it is installed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_synthetic import N, expected_mask, make_recon
from scipy.spatial.transform import Rotation

from mapstream.export import CloudOptions, build_point_cloud, write_colmap

# COLMAP camera models and their parameter counts (https://colmap.github.io/cameras.html).
_MODEL_PARAMS = {"SIMPLE_PINHOLE": 3, "PINHOLE": 4, "SIMPLE_RADIAL": 4, "RADIAL": 5, "OPENCV": 8}


def _data_lines(path: Path) -> list[str]:
    lines = path.read_text().split("\n")
    assert lines[-1] == "", "file must end with a newline"
    return [line for line in lines[:-1] if not line.startswith("#")]


def parse_colmap_text(folder: Path) -> tuple[dict, dict, dict]:
    """Strict reader for cameras.txt, images.txt and points3D.txt; raises AssertionError on any
    deviation from the format (token counts, types, ids, references)."""
    cameras = {}
    for line in _data_lines(folder / "cameras.txt"):
        tokens = line.split(" ")
        camera_id, model, width, height = int(tokens[0]), tokens[1], int(tokens[2]), int(tokens[3])
        assert model in _MODEL_PARAMS and len(tokens) == 4 + _MODEL_PARAMS[model], line
        assert camera_id not in cameras and width > 0 and height > 0
        cameras[camera_id] = {"model": model, "w": width, "h": height, "params": [float(t) for t in tokens[4:]]}

    lines = (folder / "images.txt").read_text().split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    assert len(lines) % 2 == 0, "images.txt needs two lines per image"
    images = {}
    for header, observations in zip(lines[0::2], lines[1::2]):
        tokens = header.split(" ")
        assert len(tokens) == 10, header
        image_id, camera_id = int(tokens[0]), int(tokens[8])
        qvec, tvec = np.array(tokens[1:5], float), np.array(tokens[5:8], float)
        assert abs(np.linalg.norm(qvec) - 1) < 1e-9 and camera_id in cameras and image_id not in images
        obs = observations.split(" ") if observations else []
        assert len(obs) % 3 == 0, "POINTS2D must be (X, Y, POINT3D_ID) triplets"
        points2d = [(float(obs[k]), float(obs[k + 1]), int(obs[k + 2])) for k in range(0, len(obs), 3)]
        images[image_id] = {"q": qvec, "t": tvec, "camera_id": camera_id, "name": tokens[9], "points2d": points2d}

    points = {}
    for line in _data_lines(folder / "points3D.txt"):
        tokens = line.split(" ")
        assert len(tokens) >= 8 and (len(tokens) - 8) % 2 == 0, line
        point_id = int(tokens[0])
        rgb = [int(t) for t in tokens[4:7]]
        assert point_id not in points and all(0 <= c <= 255 for c in rgb)
        track = [(int(tokens[k]), int(tokens[k + 1])) for k in range(8, len(tokens), 2)]
        points[point_id] = {"xyz": np.array(tokens[1:4], float), "rgb": rgb, "error": float(tokens[7]), "track": track}
    for point_id, point in points.items():  # every track entry points back at this point
        for image_id, idx in point["track"]:
            assert images[image_id]["points2d"][idx][2] == point_id
    for image in images.values():
        for *_, point_id in image["points2d"]:
            assert point_id == -1 or point_id in points
    return cameras, images, points


def _pose_matrix(image: dict) -> np.ndarray:
    qw, qx, qy, qz = image["q"]
    return np.column_stack([Rotation.from_quat([qx, qy, qz, qw]).as_matrix(), image["t"]])


def test_colmap_model_is_consistent(tmp_path: Path) -> None:
    recon = make_recon()
    paths = write_colmap(recon, tmp_path / "sparse" / "0")
    assert sorted(p.name for p in paths.values()) == ["cameras.txt", "images.txt", "points3D.txt"]
    cameras, images, points = parse_colmap_text(tmp_path / "sparse" / "0")

    assert list(cameras) == [1]  # identical intrinsics -> one shared camera
    fx, fy, cx, cy = cameras[1]["params"]
    K = recon.K[0]
    assert cameras[1]["model"] == "PINHOLE" and (cameras[1]["w"], cameras[1]["h"]) == (42, 28)
    np.testing.assert_allclose([fx, fy, cx, cy], [K[0, 0], K[1, 1], K[0, 2] + 0.5, K[1, 2] + 0.5])

    assert sorted(images) == list(range(1, N + 1))
    assert [images[i + 1]["name"] for i in range(N)] == [f"img_{i:03d}.png" for i in range(N)]
    for i in range(N):
        np.testing.assert_allclose(_pose_matrix(images[i + 1]), recon.T_cam_world[i], atol=1e-6)  # world-to-camera

    assert len(points) == expected_mask(recon).sum()  # under the 100k default cap: every confident pixel
    observations = 0
    for image_id, image in images.items():
        R_t = _pose_matrix(image)
        for x, y, point_id in image["points2d"]:
            X = R_t[:, :3] @ points[point_id]["xyz"] + R_t[:, 3]
            assert X[2] > 0
            np.testing.assert_allclose([fx * X[0] / X[2] + cx, fy * X[1] / X[2] + cy], [x, y], atol=2e-3)
            u, v = int(x - 0.5), int(y - 0.5)  # COLMAP pixel centres are at +0.5
            assert points[point_id]["rgb"] == [6 * u, 9 * v, 50 * (image_id - 1) + 5]
            observations += 1
    assert observations == len(points)


def test_colmap_per_frame_cameras_subsample_and_empty_tracks(tmp_path: Path) -> None:
    recon = make_recon()
    recon.K[2, 0, 0] += 1.0
    write_colmap(recon, tmp_path / "a", CloudOptions(max_points=50))
    cameras, images, points = parse_colmap_text(tmp_path / "a")
    assert sorted(cameras) == [1, 2, 3, 4] and [images[i]["camera_id"] for i in images] == [1, 2, 3, 4]
    assert cameras[3]["params"][0] == pytest.approx(float(recon.K[2, 0, 0]))
    assert len(points) == 50

    voxels = build_point_cloud(recon, CloudOptions(voxel_size=0.5))
    write_colmap(recon, tmp_path / "b", points=voxels)
    _, images, points = parse_colmap_text(tmp_path / "b")
    assert len(points) == len(voxels) and all(not p["track"] for p in points.values())
    assert all(not image["points2d"] for image in images.values())


def test_pycolmap_reads_the_model(tmp_path: Path) -> None:
    pycolmap = pytest.importorskip("pycolmap")
    recon = make_recon()
    write_colmap(recon, tmp_path, CloudOptions(max_points=200))
    model = pycolmap.Reconstruction()
    model.read_text(str(tmp_path))
    assert (model.num_cameras(), model.num_images(), model.num_points3D()) == (1, N, 200)
    for image_id, image in model.images.items():
        cam_from_world = image.cam_from_world()
        np.testing.assert_allclose(cam_from_world.matrix(), recon.T_cam_world[image_id - 1], atol=1e-6)
        for point2d in image.points2D:
            if point2d.has_point3D():
                xyz = model.points3D[point2d.point3D_id].xyz
                np.testing.assert_allclose(image.project_point(xyz), point2d.xy, atol=2e-3)
