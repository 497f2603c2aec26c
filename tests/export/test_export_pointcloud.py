"""PLY and GLB writers, read back with plyfile, trimesh and a minimal glTF parser."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from export_synthetic import FX, FY, H, N, PLANE_Z, W, expected_mask, make_recon, poses, world_point

from mapstream.export import CloudOptions, GlbStyle, PointSet, build_point_cloud, voxel_downsample, write_glb, write_ply

plyfile = pytest.importorskip("plyfile")
trimesh = pytest.importorskip("trimesh")


def _expected_colour(u: int, v: int, i: int) -> list[int]:
    return [6 * u, 9 * v, 50 * i + 5]


def test_ply_points_colours_and_filters(tmp_path: Path) -> None:
    recon = make_recon()
    path = write_ply(recon, tmp_path / "points.ply")
    assert path.read_bytes().startswith(b"ply\nformat binary_little_endian 1.0\n")
    ply = plyfile.PlyData.read(str(path))
    vertex = ply["vertex"].data
    assert [p.name for p in ply["vertex"].properties] == ["x", "y", "z", "red", "green", "blue"]
    assert vertex.dtype["x"] == np.dtype("<f4") and vertex.dtype["red"] == np.dtype("u1")
    assert len(vertex) == expected_mask(recon).sum()  # NaN, zero depth, conf <= 1.5 and sky dropped
    xyz = np.stack([vertex["x"], vertex["y"], vertex["z"]], -1).astype(np.float64)
    rgb = np.stack([vertex["red"], vertex["green"], vertex["blue"]], -1)
    np.testing.assert_allclose(xyz[:, 2], PLANE_Z, atol=1e-4)  # everything lies on the plane

    # Known pixels: expected world position computed independently, colour from the pattern.
    T, K = poses(), recon.K.astype(np.float64)
    for i, u, v in [(0, 0, 1), (1, 40, 27), (3, 21, 10), (2, 7, 5)]:
        assert expected_mask(recon)[i, v, u]
        target = world_point(T[i], K[i], u, v, float(recon.depth[i, v, u]))
        hit = np.argmin(np.linalg.norm(xyz - target, axis=1))
        np.testing.assert_allclose(xyz[hit], target, atol=1e-4)
        assert rgb[hit].tolist() == _expected_colour(u, v, i)

    mesh = trimesh.load(path)  # second independent reader
    np.testing.assert_allclose(np.asarray(mesh.vertices), xyz, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(mesh.colors)[:, :3], rgb)


def test_cloud_options() -> None:
    recon = make_recon()
    everything = build_point_cloud(recon, CloudOptions(conf_threshold=None, mask_sky=False))
    with np.errstate(invalid="ignore"):
        assert len(everything) == (np.isfinite(recon.depth) & (recon.depth > 0)).sum()
    no_sky = build_point_cloud(recon, CloudOptions(mask_sky=False))
    assert len(no_sky) == expected_mask(recon, use_sky=False).sum() > expected_mask(recon).sum()
    top_half = build_point_cloud(recon, CloudOptions(conf_threshold=None, conf_percentile=60))
    assert 0.3 < len(top_half) / len(build_point_cloud(recon, CloudOptions(conf_threshold=None))) < 0.5
    assert top_half.conf.min() >= 2.1 - 1e-6
    capped = build_point_cloud(recon, CloudOptions(max_points=100))
    assert len(capped) == 100 and np.all(np.diff(capped.frame) >= 0)
    again = build_point_cloud(recon, CloudOptions(max_points=100))
    np.testing.assert_array_equal(capped.xyz, again.xyz)  # seeded
    coarse = build_point_cloud(recon, CloudOptions(voxel_size=0.5))
    assert 0 < len(coarse) < len(no_sky) / 10 and coarse.frame is None
    np.testing.assert_allclose(coarse.xyz[:, 2], PLANE_Z, atol=1e-4)  # averages stay on the plane
    with pytest.raises(ValueError, match="conf_percentile"):
        CloudOptions(conf_percentile=120)
    with pytest.raises(ValueError, match="conf_threshold is NaN"):
        CloudOptions(conf_threshold=float("nan"))
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="voxel_size must be > 0 and finite"):
            CloudOptions(voxel_size=bad)


def test_black_and_white_backdrops_can_be_left_out() -> None:
    """drop_black / drop_white (the reference GLB writer's background filters): near-black
    pixels (R + G + B < 16) and near-white ones (every channel > 240) make no point, the
    others are untouched; the bounds are exact."""
    recon = make_recon()
    images = recon.images.copy()
    images[:, 0, :] = (5, 5, 5)  # sum 15: black
    images[:, 1, :] = (5, 5, 6)  # sum 16: not black
    images[:, 2, :] = (241, 241, 241)  # white
    images[:, 3, :] = (241, 241, 240)  # one channel at 240: not white
    recon = type(recon)(**{**{k: getattr(recon, k) for k in ("depth", "depth_conf", "T_world_cam", "K", "pose_enc",
                                                            "names", "sky_mask")}, "images": images})
    base = expected_mask(recon)
    for black, white, rows in [(True, False, [0]), (False, True, [2]), (True, True, [0, 2]), (False, False, [])]:
        cloud = build_point_cloud(recon, CloudOptions(drop_black=black, drop_white=white, max_points=None))
        want = base.copy()
        want[:, rows, :] = False
        assert len(cloud) == want.sum(), (black, white)
        assert not np.isin(cloud.uv[:, 1], rows).any()


def test_voxel_average() -> None:
    points = PointSet(
        xyz=np.array([[0.1, 0.1, 0.1], [0.3, 0.3, 0.3], [1.5, 0.2, 0.2]], np.float32),
        rgb=np.array([[0, 0, 0], [255, 101, 20], [7, 7, 7]], np.uint8),
        conf=np.array([1.0, 3.0, 2.0], np.float32),
    )
    out = voxel_downsample(points, 1.0)
    np.testing.assert_allclose(out.xyz, [[0.2, 0.2, 0.2], [1.5, 0.2, 0.2]], atol=1e-7)
    assert out.rgb.tolist() == [[128, 50, 10], [7, 7, 7]] and out.conf.tolist() == [2.0, 2.0]


def _gltf_line_colours(path: Path) -> dict[str, np.ndarray]:
    """Node name -> COLOR_0 of its first primitive, decoded from the GLB's JSON and BIN chunks."""
    data = path.read_bytes()
    magic, version, _ = struct.unpack_from("<4sII", data, 0)
    assert magic == b"glTF" and version == 2
    json_len, json_type = struct.unpack_from("<I4s", data, 12)
    assert json_type == b"JSON"
    gltf = json.loads(data[20:20 + json_len])
    bin_start = 20 + json_len + 8
    colours = {}
    for mesh in gltf["meshes"]:
        accessor = gltf["accessors"][mesh["primitives"][0]["attributes"]["COLOR_0"]]
        view = gltf["bufferViews"][accessor["bufferView"]]
        assert accessor["componentType"] == 5121 and accessor["type"] == "VEC4"  # uint8 RGBA
        start = bin_start + view.get("byteOffset", 0) + accessor.get("byteOffset", 0)
        colours[mesh["name"]] = np.frombuffer(data, np.uint8, accessor["count"] * 4, start).reshape(-1, 4)
    return colours


def test_glb_scene_axes_frustums_and_colours(tmp_path: Path) -> None:
    import matplotlib

    recon = make_recon()
    ply = plyfile.PlyData.read(str(write_ply(recon, tmp_path / "points.ply")))["vertex"].data
    path = write_glb(recon, tmp_path / "scene.glb")
    scene = trimesh.load(path, file_type="glb")
    assert isinstance(scene, trimesh.Scene)
    cloud = scene.geometry["points"]
    assert isinstance(cloud, trimesh.PointCloud) and len(cloud.vertices) == len(ply)
    xyz_cv = np.stack([ply["x"], ply["y"], ply["z"]], -1).astype(np.float64)
    # Documented axis map: glTF = (x, -y, -z) of the reconstruction's (OpenCV-style) world.
    np.testing.assert_allclose(np.asarray(cloud.vertices), xyz_cv * [1, -1, -1], atol=1e-5)
    ply_rgb = np.stack([ply["red"], ply["green"], ply["blue"]], -1)
    np.testing.assert_array_equal(np.asarray(cloud.colors)[:, :3], ply_rgb)
    for node in scene.graph.nodes_geometry:  # identity placement: geometry is in scene coordinates
        np.testing.assert_allclose(scene.graph[node][0], np.eye(4))

    cameras = sorted(name for name in scene.geometry if name.startswith("camera_"))
    assert cameras == [f"camera_{i:06d}" for i in range(N)]
    extent = np.linalg.norm(np.ptp(xyz_cv, axis=0))
    T = poses()
    for i, name in enumerate(cameras):
        vertices = np.unique(np.asarray(scene.geometry[name].vertices).round(6), axis=0)
        assert len(vertices) == 5  # apex + 4 image corners
        apex = T[i, :, 3] * [1, -1, -1]
        far = vertices[np.linalg.norm(vertices - apex, axis=1) > 1e-6]
        assert np.linalg.norm(vertices - apex, axis=1).min() < 1e-5
        depths = (far - apex) @ (T[i, :, 2] * [1, -1, -1])  # along the optical axis (+z_cam)
        np.testing.assert_allclose(depths, depths[0], rtol=1e-5)  # far rectangle is an image plane
        assert 0.005 * extent < depths[0] < 0.2 * extent  # in front, sized relative to the scene
        width = np.ptp(far @ (T[i, :, 0] * [1, -1, -1]))
        height = np.ptp(far @ (T[i, :, 1] * [1, -1, -1]))
        np.testing.assert_allclose(width / height, (W / FX) / (H / FY), rtol=1e-4)  # image aspect / focal
    # The first camera is identity: its image top (small v) must be UP (+y) in glTF.
    first = np.asarray(scene.geometry["camera_000000"].vertices)
    top = first[np.isclose(first[:, 1], first[:, 1].max())]
    assert top[:, 1].max() > 0 and np.all(top[:, 2] < 0)  # up, and in front (-z) for a glTF viewer

    colours = _gltf_line_colours(path)
    viridis = matplotlib.colormaps["viridis"]
    for i, t in [(0, 0.0), (N - 1, 1.0)]:
        expected = np.rint(np.asarray(viridis(t)) * 255).astype(np.uint8)
        assert np.all(colours[f"camera_{i:06d}"] == expected)
    assert "trajectory" in scene.geometry


def test_glb_frustums_can_be_given_their_depth_in_world_units(tmp_path: Path) -> None:
    recon = make_recon()
    scene = trimesh.load(write_glb(recon, tmp_path / "d.glb", frustum_depth=0.37), file_type="glb")
    T = poses()
    vertices = np.asarray(scene.geometry["camera_000002"].vertices)
    apex = T[2, :, 3] * [1, -1, -1]
    np.testing.assert_allclose(((vertices - apex) @ (T[2, :, 2] * [1, -1, -1])).max(), 0.37, rtol=1e-6)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="frustum_depth must be > 0"):
            write_glb(recon, tmp_path / "bad.glb", frustum_depth=bad)
    assert not (tmp_path / "bad.glb").exists()


def test_glb_in_the_reference_axes(tmp_path: Path) -> None:
    """GlbStyle(axes="reference"): every coordinate mapped by T_world_cam[0] · diag(1, -1, -1) ·
    Ry(180°), the reference's inverse(extrinsic[0]) · OpenGL flip · half turn about y; with the
    first camera at the origin that is (x, y, z) -> (-x, -y, z)."""
    from mapstream.export.glb import scene_transform

    recon = make_recon()
    plain = trimesh.load(write_glb(recon, tmp_path / "a.glb"), file_type="glb")
    ref = trimesh.load(write_glb(recon, tmp_path / "b.glb", style=GlbStyle(axes="reference")), file_type="glb")
    world = np.asarray(plain.geometry["points"].vertices) * [1, -1, -1]  # back to the world
    first = np.eye(4)
    first[:3] = recon.T_world_cam[0]
    want = (first @ np.diag([1.0, -1.0, -1.0, 1.0]) @ np.diag([-1.0, 1.0, -1.0, 1.0]))
    np.testing.assert_allclose(scene_transform(recon, "reference"), want)
    np.testing.assert_allclose(np.asarray(ref.geometry["points"].vertices), world @ want[:3, :3].T + want[:3, 3],
                               atol=1e-5)
    centres = recon.T_world_cam[:, :, 3].astype(np.float64)
    assert np.linalg.norm(np.asarray(ref.geometry["camera_000001"].vertices)
                          - (centres[1] @ want[:3, :3].T + want[:3, 3]), axis=1).min() < 1e-5
    if np.allclose(recon.T_world_cam[0], np.eye(4)[:3]):
        np.testing.assert_allclose(want, np.diag([-1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="axes must be 'gltf' or 'reference'"):
        GlbStyle(axes="opengl")  # type: ignore[arg-type]


def test_glb_with_no_points_still_has_cameras(tmp_path: Path) -> None:
    path = write_glb(make_recon(), tmp_path / "empty.glb", CloudOptions(conf_threshold=100.0))
    scene = trimesh.load(path, file_type="glb")
    assert "points" not in scene.geometry
    assert sum(name.startswith("camera_") for name in scene.geometry) == N
    empty = plyfile.PlyData.read(str(write_ply(make_recon(), tmp_path / "e.ply", CloudOptions(conf_threshold=100.0))))
    assert len(empty["vertex"].data) == 0


def test_one_rule_says_which_pixels_are_measured_for_files_and_the_live_view():
    """measured_pixels: finite depth > 0 and a finite confidence. The export cloud and the
    live view's frame points both start from it."""
    from mapstream.export.points import measured_pixels
    from mapstream.viewer.live import frame_points

    depth = np.array([[1.0, np.nan, 0.0], [-2.0, np.inf, 3.0]], np.float32)
    conf = np.array([[2.0, 2.0, 2.0], [2.0, 2.0, np.inf]], np.float32)
    np.testing.assert_array_equal(measured_pixels(depth, conf), [[True, False, False], [False, False, False]])
    conf[1, 2] = 2.0
    want = np.array([[True, False, False], [False, False, True]])
    np.testing.assert_array_equal(measured_pixels(depth, conf), want)
    xyz, rgb = frame_points(depth, conf, np.diag([1.0, 1.0, 1.0]), np.eye(4)[:3], np.zeros((2, 3, 3), np.uint8),
                            conf_threshold=1.5, max_points=10, seed=0)
    assert len(xyz) == want.sum() == 2
    np.testing.assert_allclose(xyz, [[0.0, 0.0, 1.0], [6.0, 3.0, 3.0]])


def test_a_cloud_that_keeps_few_of_the_measured_pixels_names_the_setting(caplog: pytest.LogCaptureFixture) -> None:
    """Confidences of 1.2 but at 3 pixels a frame: the default threshold 1.5 keeps under 1 %
    of the measured pixels, told with the setting to lower; a threshold of 1.0 keeps them all."""
    import dataclasses
    import logging

    recon = make_recon(sky=False)
    conf = np.full((N, H, W), 1.2, np.float32)
    conf[:, 5, 10:13] = 2.0
    recon = dataclasses.replace(recon, depth_conf=conf)
    measured = int(np.isfinite(recon.depth).sum() - (recon.depth == 0).sum())
    with caplog.at_level(logging.WARNING, logger="mapstream.export.points"):
        assert len(build_point_cloud(recon)) == 3 * N
    (warned,) = [r.getMessage() for r in caplog.records]
    assert f"keeps {100 * 3 * N / measured:.1f} % of the {measured} measured pixels" in warned
    assert "the confidence threshold 1.5 (--conf-threshold, CloudOptions.conf_threshold) leaves out 99.7 %" in warned
    assert "median confidence is 1.2" in warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mapstream.export.points"):
        assert len(build_point_cloud(recon, CloudOptions(conf_threshold=1.0))) == measured
    assert caplog.records == []
