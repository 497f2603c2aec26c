"""The GLB's style: colour adjustments (exact values), spheres and tubes read back with trimesh,
the default style's unchanged output, validation, `export_all` and `mapstream export` flags."""
from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from export_synthetic import N, make_recon

from mapstream.export import GlbStyle, build_point_cloud, export_all, write_glb
from mapstream.export.glb import FRUSTUM_EDGES, OPENCV_TO_GLTF, frustum_corners, scene_extent
from mapstream.export.glb_style import (
    SPHERE_RADIUS_FRACTION,
    TUBE_SIDES,
    adjust_colours,
    sphere_instances,
    tube_segments,
)
from mapstream.export.points import subsample

trimesh = pytest.importorskip("trimesh")
pytest.importorskip("matplotlib")

ICOSAHEDRON_VERTICES = 12
"""Vertices of a detail-0 sphere (an icosahedron); 42 at detail 1."""


def _load(path: Path):
    # process=False: trimesh would otherwise merge vertices that coincide and reorder nothing else.
    return trimesh.load(path, file_type="glb", process=False)


def _gltf_json(path: Path) -> dict:
    """The JSON chunk of a GLB file."""
    data = path.read_bytes()
    (length,) = struct.unpack("<I", data[12:16])
    return json.loads(data[20:20 + length])


def _vertex_colours(path: Path) -> dict[str, np.ndarray]:
    """Mesh name -> the uint8 RGBA COLOR_0 of its first primitive, read from the GLB's chunks
    (trimesh does not load the colours of LINES back)."""
    data, tree = path.read_bytes(), _gltf_json(path)
    bin_start = 20 + struct.unpack("<I", data[12:16])[0] + 8
    colours = {}
    for mesh in tree["meshes"]:
        accessor = tree["accessors"][mesh["primitives"][0]["attributes"]["COLOR_0"]]
        start = bin_start + tree["bufferViews"][accessor["bufferView"]].get("byteOffset", 0)
        colours[mesh["name"]] = np.frombuffer(data, np.uint8, accessor["count"] * 4, start).reshape(-1, 4)
    return colours


def _to_gltf(xyz: np.ndarray) -> np.ndarray:
    return np.asarray(xyz, np.float64) @ OPENCV_TO_GLTF.T


def _distance_to_segments(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``[P, S]`` distances of each point to each closed segment, computed directly."""
    axis = ends - starts
    t = np.einsum("psk,sk->ps", points[:, None] - starts[None], axis) / np.maximum((axis**2).sum(1), 1e-300)
    nearest = starts[None] + np.clip(t, 0, 1)[..., None] * axis[None]
    return np.linalg.norm(points[:, None] - nearest, axis=-1)


# -- colours --------------------------------------------------------------------------------------
def test_colour_adjustments_exact_values() -> None:
    rgb = np.array([[0, 0, 0], [255, 255, 255], [100, 0, 200], [255, 0, 0]], np.uint8)
    # Opacity blends toward white, rounding halves up: 0.5 * 0 + 127.5 -> 128, 50 + 127.5 -> 178.
    np.testing.assert_array_equal(
        adjust_colours(rgb, opacity=0.5), [[128, 128, 128], [255, 255, 255], [178, 128, 228], [255, 128, 128]]
    )
    # Saturation 0: the Rec. 601 grey (0.299 R + 0.587 G + 0.114 B) in every channel.
    primaries = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30]], np.uint8)
    np.testing.assert_array_equal(  # 76.245, 149.685, 29.07, 18.15
        adjust_colours(primaries, saturation=0), [[76] * 3, [150] * 3, [29] * 3, [18] * 3]
    )
    # Saturation 2 around grey 124.2: 275.8 clips to 255, 75.8 -> 76, -24.2 clips to 0.
    np.testing.assert_array_equal(adjust_colours(np.array([[200, 100, 50]], np.uint8), saturation=2), [[255, 76, 0]])
    # Brightness multiplies and clips: 2 x 200 = 400 -> 255; halves round up: 1.5 -> 2, 2.5 -> 3.
    np.testing.assert_array_equal(adjust_colours(np.array([[100, 200, 30]], np.uint8), brightness=2), [[200, 255, 60]])
    np.testing.assert_array_equal(adjust_colours(np.array([[3, 5, 255]], np.uint8), brightness=0.5), [[2, 3, 128]])
    # Order: saturation, brightness, then opacity: red -> 76.245 -> 152.49 -> 0.5 * 152.49 + 127.5 = 203.745.
    np.testing.assert_array_equal(
        adjust_colours(np.array([[255, 0, 0]], np.uint8), opacity=0.5, saturation=0, brightness=2), [[204] * 3]
    )
    # The defaults leave every colour as it is.
    every = np.random.default_rng(0).integers(0, 256, (5000, 3), dtype=np.uint8)
    unchanged = adjust_colours(every)
    assert unchanged.dtype == np.uint8
    np.testing.assert_array_equal(unchanged, every)


# -- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "words"), [
    ({"points": "cubes"}, "points must be 'points' or 'spheres'"),
    ({"sphere_radius": 0.0}, "sphere_radius must be > 0"),
    ({"sphere_radius": float("inf")}, "sphere_radius must be > 0 and finite"),
    ({"trajectory_radius": -1.0}, "trajectory_radius must be > 0"),
    ({"frustum_radius": float("nan")}, "frustum_radius must be > 0"),
    ({"max_spheres": 0}, "max_spheres must be >= 1"),
    ({"sphere_detail": 2}, "sphere_detail must be 0"),
    ({"opacity": 0.0}, "opacity must be in (0, 1]"),
    ({"opacity": 1.5}, "opacity must be in (0, 1]"),
    ({"opacity": float("nan")}, "opacity must be in (0, 1]"),
    ({"saturation": -0.5}, "saturation must be >= 0"),
    ({"brightness": float("inf")}, "brightness must be >= 0 and finite"),
])
def test_style_refuses_bad_values(change: dict, words: str) -> None:
    with pytest.raises(ValueError) as err:
        GlbStyle(**change)
    assert str(err.value).startswith(words)


# -- default ----------------------------------------------------------------------------------------
def test_default_style_draws_points_and_lines(tmp_path: Path) -> None:
    """The default style draws a POINTS primitive with the cloud's own colours and LINES for
    frustums and trajectory (what the writer drew before styles: checked by hand against it,
    byte for byte, when styles came); settings that only shape spheres change nothing while
    the points are points."""
    recon = make_recon()
    before = write_glb(recon, tmp_path / "plain.glb").read_bytes()
    assert write_glb(recon, tmp_path / "styled.glb", style=GlbStyle()).read_bytes() == before
    unused = GlbStyle(sphere_radius=0.3, max_spheres=5, sphere_detail=1, seed=7)
    assert write_glb(recon, tmp_path / "unused.glb", style=unused).read_bytes() == before

    tree = _gltf_json(tmp_path / "plain.glb")
    modes = {mesh["name"]: {p["mode"] for p in mesh["primitives"]} for mesh in tree["meshes"]}
    assert modes.pop("points") == {0}  # POINTS
    assert set(modes) == {f"camera_{i:06d}" for i in range(N)} | {"trajectory"}
    assert all(mode == {1} for mode in modes.values())  # LINES
    cloud = build_point_cloud(recon)
    np.testing.assert_array_equal(np.asarray(_load(tmp_path / "plain.glb").geometry["points"].colors)[:, :3], cloud.rgb)


def test_colour_settings_change_the_points_only(tmp_path: Path) -> None:
    recon = make_recon()
    style = GlbStyle(opacity=0.5, saturation=0.0, brightness=1.5)
    pale = _vertex_colours(write_glb(recon, tmp_path / "pale.glb", style=style))
    plain = _vertex_colours(write_glb(recon, tmp_path / "plain.glb"))
    expected = adjust_colours(build_point_cloud(recon).rgb, opacity=0.5, saturation=0.0, brightness=1.5)
    np.testing.assert_array_equal(pale.pop("points")[:, :3], expected)
    plain.pop("points")
    assert set(pale) == set(plain) and all(np.array_equal(pale[name], plain[name]) for name in plain)


# -- spheres ----------------------------------------------------------------------------------------
def test_points_as_spheres(tmp_path: Path) -> None:
    recon = make_recon()
    cloud = build_point_cloud(recon)
    path = write_glb(recon, tmp_path / "spheres.glb", points=cloud, style=GlbStyle(points="spheres", opacity=0.5))
    spheres = _load(path).geometry["points"]
    assert isinstance(spheres, trimesh.Trimesh)
    n = len(cloud)
    assert n > 1000 and spheres.vertices.shape == (n * ICOSAHEDRON_VERTICES, 3) and len(spheres.faces) == n * 20
    # Default radius: SPHERE_RADIUS_FRACTION of the scene extent; every vertex of sphere i lies
    # at that radius from point i (in the GLB's axes).
    radius = SPHERE_RADIUS_FRACTION * scene_extent(cloud, recon.T_world_cam[:, :, 3])
    vertices = np.asarray(spheres.vertices).reshape(n, ICOSAHEDRON_VERTICES, 3)
    distances = np.linalg.norm(vertices - _to_gltf(cloud.xyz)[:, None], axis=-1)
    np.testing.assert_allclose(distances, radius, rtol=1e-4)
    # Each sphere wears its point's colour (here blended halfway toward white).
    colours = np.asarray(spheres.visual.vertex_attributes["color"]).reshape(n, ICOSAHEDRON_VERTICES, 4)
    np.testing.assert_array_equal(colours[..., :3], np.broadcast_to(adjust_colours(cloud.rgb, opacity=0.5)[:, None],
                                                                    (n, ICOSAHEDRON_VERTICES, 3)))
    assert np.all(colours[..., 3] == 255)
    # Outward normals, and a non-metallic material (a metallic one renders nearly black).
    np.testing.assert_allclose(
        np.asarray(spheres.vertex_normals).reshape(n, ICOSAHEDRON_VERTICES, 3),
        (vertices - _to_gltf(cloud.xyz)[:, None]) / radius, atol=1e-3,
    )
    tree = _gltf_json(path)
    (mesh,) = [m for m in tree["meshes"] if m["name"] == "points"]
    assert mesh["primitives"][0]["mode"] == 4  # TRIANGLES
    material = tree["materials"][mesh["primitives"][0]["material"]]["pbrMetallicRoughness"]
    assert material["metallicFactor"] == 0.0


def test_sphere_radius_and_detail(tmp_path: Path) -> None:
    recon = make_recon()
    cloud = build_point_cloud(recon).take(np.arange(50))
    style = GlbStyle(points="spheres", sphere_radius=0.03, sphere_detail=1)
    spheres = _load(write_glb(recon, tmp_path / "round.glb", points=cloud, style=style)).geometry["points"]
    vertices = np.asarray(spheres.vertices).reshape(50, 42, 3)
    np.testing.assert_allclose(np.linalg.norm(vertices - _to_gltf(cloud.xyz)[:, None], axis=-1), 0.03, rtol=1e-4)


def test_max_spheres_is_a_seeded_subsample(tmp_path: Path) -> None:
    recon = make_recon()
    cloud = build_point_cloud(recon)
    style = GlbStyle(points="spheres", sphere_radius=0.01, max_spheres=100)
    first = write_glb(recon, tmp_path / "a.glb", points=cloud, style=style).read_bytes()
    assert write_glb(recon, tmp_path / "b.glb", points=cloud, style=style).read_bytes() == first  # deterministic
    centres = np.asarray(_load(tmp_path / "a.glb").geometry["points"].vertices).reshape(100, -1, 3).mean(axis=1)
    kept = subsample(cloud, 100, seed=0)  # the same draw, order kept
    np.testing.assert_allclose(centres, _to_gltf(kept.xyz), atol=1e-5)
    other = write_glb(recon, tmp_path / "c.glb", points=cloud, style=replace(style, seed=1))
    assert other.read_bytes() != first


def test_sphere_instances_layout() -> None:
    unit = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    arrays = sphere_instances(np.array([[0.0, 0, 0], [5, 5, 5]]), np.array([255, 0, 0], np.uint8), 2.0,
                              unit, np.array([[0, 1, 2]]))
    np.testing.assert_array_equal(arrays.vertices, [[2, 0, 0], [0, 2, 0], [0, 0, 2], [7, 5, 5], [5, 7, 5], [5, 5, 7]])
    np.testing.assert_array_equal(arrays.faces, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(arrays.colours, np.tile([255, 0, 0, 255], (6, 1)))


# -- tubes ------------------------------------------------------------------------------------------
def test_trajectory_and_frustums_as_tubes(tmp_path: Path) -> None:
    recon = make_recon()
    style = GlbStyle(trajectory_radius=0.02, frustum_radius=0.005)
    path = write_glb(recon, tmp_path / "tubes.glb", style=style)
    scene = _load(path)
    centres = _to_gltf(recon.T_world_cam[:, :, 3])

    tube = scene.geometry["trajectory"]
    assert isinstance(tube, trimesh.Trimesh) and len(tube.vertices) == (N - 1) * 2 * TUBE_SIDES
    # Segment i's vertices: a ring about centre i and one about centre i + 1, all at the radius
    # from that segment.
    rings = np.asarray(tube.vertices).reshape(N - 1, 2, TUBE_SIDES, 3)
    for i in range(N - 1):
        distance = _distance_to_segments(rings[i].reshape(-1, 3), centres[i:i + 1], centres[i + 1:i + 2])
        np.testing.assert_allclose(distance, 0.02, rtol=1e-4)
        np.testing.assert_allclose(rings[i].mean(axis=1), centres[i:i + 2], atol=1e-6)
    assert np.all(np.asarray(tube.visual.vertex_attributes["color"]) == [128, 128, 128, 255])

    cloud = build_point_cloud(recon)
    depth = 0.04 * scene_extent(cloud, recon.T_world_cam[:, :, 3])
    corners = _to_gltf(frustum_corners(recon, depth).reshape(-1, 3)).reshape(N, 5, 3)
    line_colours = _vertex_colours(write_glb(recon, tmp_path / "lines.glb"))
    for i in range(N):
        frustum = scene.geometry[f"camera_{i:06d}"]
        assert len(frustum.vertices) == len(FRUSTUM_EDGES) * 2 * TUBE_SIDES
        edges = corners[i][FRUSTUM_EDGES]
        distance = _distance_to_segments(np.asarray(frustum.vertices), edges[:, 0], edges[:, 1])
        assert distance.min(axis=1).max() <= 0.005 * (1 + 1e-4)  # within the radius of an edge
        colour = line_colours[f"camera_{i:06d}"][0]  # the line's colormap colour
        assert np.all(np.asarray(frustum.visual.vertex_attributes["color"]) == colour)
    assert isinstance(scene.geometry["points"], trimesh.PointCloud)  # the points are still points


def test_tube_faces_point_outward_and_a_zero_length_segment_is_finite() -> None:
    starts = np.array([[0.0, 0, 0], [1, 1, 1], [2, 0, 0]])
    ends = np.array([[0.0, 0, 3], [1, 1, 1], [2, 4, 1]])
    arrays = tube_segments(starts, ends, np.array([1, 2, 3], np.uint8), 0.5)
    assert np.all(np.isfinite(arrays.vertices)) and arrays.colours.shape == (3 * 2 * TUBE_SIDES, 4)
    triangles = arrays.vertices[arrays.faces]
    normal = np.cross(triangles[:, 1] - triangles[:, 0], triangles[:, 2] - triangles[:, 0])
    segment = np.repeat(np.arange(3), 2 * TUBE_SIDES)  # the segment of each face (2 * sides faces each)
    axis = (ends - starts)[segment]
    centroid = triangles.mean(axis=1)
    t = np.einsum("fk,fk->f", centroid - starts[segment], axis) / np.maximum((axis**2).sum(1), 1e-300)
    outward = centroid - (starts[segment] + t[:, None] * axis)
    real = segment != 1  # the zero-length segment's faces have no area
    assert np.all(np.einsum("fk,fk->f", normal[real], outward[real]) > 0)
    np.testing.assert_allclose(np.linalg.norm(arrays.normals, axis=1), 1.0)


# -- export_all and the command line ---------------------------------------------------------------
def test_export_all_passes_the_style_to_the_glb(tmp_path: Path) -> None:
    recon = make_recon()
    style = GlbStyle(points="spheres", sphere_radius=0.01, max_spheres=300, trajectory_radius=0.01)
    written = export_all(recon, tmp_path, formats=["glb"], glb_style=style)
    scene = _load(written["glb"])
    assert len(scene.geometry["points"].vertices) == 300 * ICOSAHEDRON_VERTICES
    assert isinstance(scene.geometry["trajectory"], trimesh.Trimesh)


def test_mapstream_export_glb_flags(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    """The flags reach scene.glb; bad values are refused, naming the flag, before the run is read."""
    import mapstream.viewer as viewer
    from mapstream.cli.main import main

    recon = make_recon()
    run = tmp_path / "run"
    export_all(recon, run, formats=["npz"])
    out = tmp_path / "styled"
    assert main(["export", str(run), "--out", str(out), "--formats", "glb", "--quiet", "--max-points", "500",
                 "--glb-points", "spheres", "--glb-sphere-radius", "0.02", "--glb-max-spheres", "200",
                 "--glb-trajectory-radius", "0.01", "--glb-frustum-radius", "0.004", "--glb-opacity", "0.5"]) == 0
    capsys.readouterr()
    scene = _load(out / "scene.glb")
    spheres = scene.geometry["points"]
    assert len(spheres.vertices) == 200 * ICOSAHEDRON_VERTICES
    vertices = np.asarray(spheres.vertices).reshape(200, ICOSAHEDRON_VERTICES, 3)
    np.testing.assert_allclose(np.linalg.norm(vertices - vertices.mean(axis=1, keepdims=True), axis=-1), 0.02,
                               rtol=1e-4)
    assert np.all(np.asarray(spheres.visual.vertex_attributes["color"])[:, :3] >= 128)  # halfway to white
    assert all(isinstance(scene.geometry[name], trimesh.Trimesh) for name in ("trajectory", "camera_000000"))

    monkeypatch.setattr(viewer, "load_run", lambda *a: pytest.fail("the run was read"))
    for bad, message in [(["--glb-opacity", "0"], "--glb-opacity must be in (0, 1]"),
                         (["--glb-sphere-radius", "-1"], "--glb-sphere-radius must be > 0"),
                         (["--glb-max-spheres", "0"], "--glb-max-spheres must be >= 1"),
                         (["--glb-sphere-detail", "3"], "--glb-sphere-detail must be 0"),
                         (["--glb-saturation", "nan"], "--glb-saturation must be >= 0"),
                         (["--glb-trajectory-radius", "inf"], "--glb-trajectory-radius must be > 0")]:
        assert main(["export", str(run), "--quiet", *bad]) == 2
        assert f"error: {message}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # not a choice: the parser refuses it
        main(["export", str(run), "--quiet", "--glb-points", "cubes"])
    assert exit_info.value.code == 2 and "--glb-points" in capsys.readouterr().err

