"""The viewer's "Export" folder, driven through its handles without a browser: "export GLB"
writes exactly what the page shows, "screenshot" saves a (fake) browser's render as PNG."""
from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
from viewer_fakes import RenderingClient, wait_for
from viewer_synthetic import CONF_MAX, make_recon

from mapstream.cli.main import main as cli_main
from mapstream.export import GlbStyle
from mapstream.export.glb import OPENCV_TO_GLTF, write_glb
from mapstream.export.glb_style import SPHERE_RADIUS_FRACTION, adjust_colours

pytest.importorskip("viser")
trimesh = pytest.importorskip("trimesh")
Image = pytest.importorskip("PIL.Image")

from mapstream.viewer import ViewerApp, ViewerOptions  # noqa: E402
from mapstream.viewer.actions import FALLBACK_RENDER_HW  # noqa: E402
from mapstream.viewer.controls import TRAJECTORY_TUBE_FRACTION, glb_style  # noqa: E402


def camera_names(scene: object) -> list[str]:
    return sorted(name for name in scene.geometry if name.startswith("camera_"))  # type: ignore[attr-defined]


def test_export_glb_writes_what_the_page_shows(tmp_path: Path, free_port: int) -> None:
    recon = make_recon(n=5)
    options = ViewerOptions(conf_threshold=3.0, downsample=2)
    with ViewerApp(recon, options, port=free_port, output_dir=tmp_path) as app:
        handles, pool = app.handles, app.pool
        assert handles is not None and handles.glb_path.value == str(tmp_path / "view.glb")
        handles.frame.value = 3  # "up to t": frames 0..3
        handles.camera_every.value = 2  # frustums 0, 2 and 3 (frame t)
        handles.export_glb.value = True  # a click
        shown = (pool.conf > 3.0) & ~pool.sky & (pool.rank % 2 == 0) & (pool.frame <= 3)
        assert shown.sum() == app.shown_point_count > 500
        scene = trimesh.load(tmp_path / "view.glb", file_type="glb")
        cloud = scene.geometry["points"]
        # Same points in the same order, through the GLB's documented axis map (x, -y, -z).
        np.testing.assert_allclose(
            np.asarray(cloud.vertices), pool.xyz[shown].astype(np.float64) @ OPENCV_TO_GLTF.T, atol=1e-6
        )
        np.testing.assert_array_equal(np.asarray(cloud.colors)[:, :3], pool.rgb[shown])
        assert camera_names(scene) == ["camera_000000", "camera_000002", "camera_000003"]
        assert "trajectory" in scene.geometry
        assert f"wrote `{tmp_path / 'view.glb'}`: {shown.sum():,} points, 3 cameras" in handles.status.content
        # The frustums are as deep as the page draws them, "camera size" included.
        def frustum_depth(scene: object) -> float:
            vertices = np.asarray(scene.geometry["camera_000000"].vertices)  # type: ignore[attr-defined]
            apex = recon.T_world_cam[0, :, 3].astype(np.float64) @ OPENCV_TO_GLTF.T
            axis = recon.T_world_cam[0, :, 2].astype(np.float64) @ OPENCV_TO_GLTF.T
            return float(np.max((vertices - apex) @ axis))

        assert frustum_depth(scene) == pytest.approx(handles.frustums[0].scale, rel=1e-5)
        handles.camera_size.value = 2.5
        handles.export_glb.value = True
        scene = trimesh.load(tmp_path / "view.glb", file_type="glb")
        assert frustum_depth(scene) == pytest.approx(handles.frustums[0].scale, rel=1e-5)
        assert handles.frustums[0].scale == pytest.approx(2.5 * 0.03 * app.framing.extent)

        # Other controls, another path typed in the field (its folder is created).
        handles.conf_threshold.value = 1.0
        handles.hide_sky.value = False
        handles.downsample.value = "1"
        handles.frame_mode.value = "only t"
        handles.show_cameras.value = False  # no frustum, no trajectory on the page: none in the file
        handles.glb_path.value = str(tmp_path / "more" / "t3.glb")
        handles.export_glb.value = True
        scene = trimesh.load(tmp_path / "more" / "t3.glb", file_type="glb")
        shown = (pool.conf > 1.0) & (pool.frame == 3)
        np.testing.assert_allclose(
            np.asarray(scene.geometry["points"].vertices), pool.xyz[shown].astype(np.float64) @ OPENCV_TO_GLTF.T,
            atol=1e-6,
        )
        assert camera_names(scene) == [] and "trajectory" not in scene.geometry

        # Failures are reported on the page and the server keeps serving.
        handles.glb_path.value = str(tmp_path / "view.glb" / "under_a_file.glb")
        assert app.export_glb() is None
        assert f"GLB export to `{tmp_path / 'view.glb' / 'under_a_file.glb'}` failed" in handles.status.content
        handles.conf_threshold.value = CONF_MAX  # above every point
        assert app.shown_point_count == 0
        assert app.export_glb(tmp_path / "empty.glb") is None
        assert "nothing is shown" in handles.status.content and not (tmp_path / "empty.glb").exists()
        handles.glb_path.value = "  "
        assert app.export_glb() is None and "enter a file path" in handles.status.content
        with urllib.request.urlopen(app.url, timeout=10) as response:
            assert response.status == 200
    with ViewerApp(recon, port=free_port) as app:  # no run folder: the current directory
        assert app.handles is not None
        assert (app.handles.glb_path.value, app.handles.png_path.value) == ("view.glb", "screenshot.png")


def test_export_glb_in_the_folders_style(tmp_path: Path, free_port: int) -> None:
    """The "Export" folder's style controls reach the file: spheres of the chosen share of the
    scene extent around the shown points in their (paled) colours, tubes for the trajectory
    and the frustums; untouched, they draw points and lines."""
    recon = make_recon(n=4)
    with ViewerApp(recon, ViewerOptions(conf_threshold=3.0), port=free_port, output_dir=tmp_path) as app:
        handles, pool, extent = app.handles, app.pool, app.framing.extent
        assert handles is not None
        assert glb_style(handles, extent) == GlbStyle(sphere_radius=SPHERE_RADIUS_FRACTION * extent)
        handles.export_glb.value = True  # untouched controls: points and lines, as before
        scene = trimesh.load(tmp_path / "view.glb", file_type="glb")
        assert isinstance(scene.geometry["points"], trimesh.PointCloud)
        assert isinstance(scene.geometry["trajectory"], trimesh.path.Path3D)

        handles.glb_points.value = "spheres"
        handles.glb_sphere_radius.value = 0.5  # % of the extent
        handles.glb_tubes.value = True
        handles.glb_opacity.value = 0.5
        handles.export_glb.value = True
        shown = (pool.conf > 3.0) & ~pool.sky
        n = int(shown.sum())
        assert 0 < n == app.shown_point_count
        assert f"wrote `{tmp_path / 'view.glb'}`: {n:,} spheres, {len(recon)} cameras" in handles.status.content
        scene = trimesh.load(tmp_path / "view.glb", file_type="glb", process=False)
        spheres = scene.geometry["points"]
        assert isinstance(spheres, trimesh.Trimesh) and len(spheres.vertices) == n * 12  # icosahedra
        vertices = np.asarray(spheres.vertices).reshape(n, 12, 3)
        centres = pool.xyz[shown].astype(np.float64) @ OPENCV_TO_GLTF.T
        np.testing.assert_allclose(np.linalg.norm(vertices - centres[:, None], axis=-1), 0.005 * extent, rtol=1e-4)
        colours = np.asarray(spheres.visual.vertex_attributes["color"]).reshape(n, 12, 4)[..., :3]
        np.testing.assert_array_equal(colours, np.repeat(adjust_colours(pool.rgb[shown], opacity=0.5)[:, None], 12, 1))
        tube = scene.geometry["trajectory"]
        assert isinstance(tube, trimesh.Trimesh) and isinstance(scene.geometry["camera_000000"], trimesh.Trimesh)
        rings = np.asarray(tube.vertices).reshape(len(recon) - 1, 2, -1, 3)
        apexes = recon.T_world_cam[:, :, 3].astype(np.float64) @ OPENCV_TO_GLTF.T
        np.testing.assert_allclose(  # rings about the camera centres, at the trajectory's tube radius
            np.linalg.norm(rings[:, 0] - apexes[:-1, None], axis=-1), TRAJECTORY_TUBE_FRACTION * extent, rtol=1e-4
        )


def test_cli_passes_the_run_folder_for_exports(tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    make_recon().save_npz(tmp_path / "predictions.npz")
    seen: list[object] = []
    start = ViewerApp.start

    def recording_start(self: ViewerApp) -> ViewerApp:
        seen.append(self.output_dir)
        return start(self)

    monkeypatch.setattr(ViewerApp, "start", recording_start)
    for run in (tmp_path, tmp_path / "predictions.npz"):
        assert cli_main(["view", str(run), "--no-block", "--port", str(free_port)]) == 0
    assert seen == [tmp_path, tmp_path]


def test_write_glb_draws_the_selected_cameras_only(tmp_path: Path) -> None:
    recon = make_recon()
    for cameras, expected in (([1], [1]), (np.array([True, False, True]), [0, 2]), ([], []), (None, [0, 1, 2])):
        scene = trimesh.load(write_glb(recon, tmp_path / "scene.glb", cameras=cameras), file_type="glb")
        assert camera_names(scene) == [f"camera_{i:06d}" for i in expected]
        assert "trajectory" in scene.geometry  # through every camera centre, as before
    scene = trimesh.load(write_glb(recon, tmp_path / "one.glb", cameras=[1]), file_type="glb")
    apex = recon.T_world_cam[1, :, 3].astype(np.float64) @ OPENCV_TO_GLTF.T  # frame 1's frustum, not frame 0's
    assert np.linalg.norm(np.asarray(scene.geometry["camera_000001"].vertices) - apex, axis=1).min() < 1e-6


def test_screenshot_saves_the_first_browser_render(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ViewerApp(make_recon(), port=free_port, output_dir=tmp_path) as app:
        handles = app.handles
        assert handles is not None and app.server is not None
        assert handles.png_path.value == str(tmp_path / "screenshot.png")
        assert app.screenshot() is None
        assert "screenshot: no browser is connected" in handles.status.content
        assert not (tmp_path / "screenshot.png").exists()

        image = np.random.default_rng(0).integers(0, 256, (4, 6, 4), dtype=np.uint8)  # RGBA, as viser's PNG
        first, later = RenderingClient(image), RenderingClient(np.zeros((4, 6, 4), np.uint8))
        monkeypatch.setattr(app.server, "get_clients", lambda: {7: later, 2: first})
        thread = app.screenshot()
        assert thread is not None
        thread.join(timeout=30)
        # The render ran on that background thread, at the browser's canvas size, losslessly.
        assert [call[:3] for call in first.calls] == [(4, 6, "png")] and first.calls[0][3] is thread
        assert later.calls == []
        np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "screenshot.png")), image)
        assert f"wrote `{tmp_path / 'screenshot.png'}`" in handles.status.content

        # The button, with another path in the field.
        target = tmp_path / "shots" / "b.png"
        handles.png_path.value = str(target)
        handles.screenshot.value = True  # a click
        wait_for(lambda: f"wrote `{target}`" in handles.status.content, "the button's screenshot")
        np.testing.assert_array_equal(np.asarray(Image.open(target)), image)

        # One at a time: a second request while the browser has not answered is refused.
        first.release.clear()
        pending = app.screenshot(tmp_path / "c.png")
        assert pending is not None
        assert app.screenshot(tmp_path / "d.png") is None and "not finished" in handles.status.content
        first.release.set()
        pending.join(timeout=30)
        assert (tmp_path / "c.png").exists() and not (tmp_path / "d.png").exists()

        # The size presets: a height with the canvas's aspect (4 x 6 here), or the canvas.
        handles.screenshot_size.value = "720p"
        app.screenshot(tmp_path / "big.png").join(timeout=30)  # type: ignore[union-attr]
        assert first.calls[-1][:3] == (720, 1080, "png")
        handles.screenshot_size.value = "canvas"

        # A browser that has not reported its canvas size yet gets the fallback size.
        first.camera.image_height = first.camera.image_width = 0
        app.screenshot(tmp_path / "e.png").join(timeout=30)  # type: ignore[union-attr]
        assert first.calls[-1][:2] == FALLBACK_RENDER_HW

        # A render that fails (a tab that never draws) is reported, and nothing is written.
        first.error = TimeoutError("no frame from the browser")
        app.screenshot(tmp_path / "f.png").join(timeout=30)  # type: ignore[union-attr]
        assert f"screenshot to `{tmp_path / 'f.png'}` failed: no frame from the browser" in handles.status.content
        assert not (tmp_path / "f.png").exists() and app.server is not None
