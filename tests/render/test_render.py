"""The flythrough renderer: splatting, the virtual camera's path, the video and its command."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mapstream.geometry.camera import project_points
from mapstream.render import PathStyle, RenderOptions, camera_path, look_at, pinhole, render_flythrough, smooth, splat

pytest.importorskip("av")

from render_synthetic import BLUE, GREEN, RED, decode, forward_camera, plane_run, straight_run  # noqa: E402


def test_splat_draws_the_nearest_point_and_nothing_behind_or_outside() -> None:
    K, T = forward_camera()
    assert K[0, 0] == K[1, 1] == pytest.approx(2.5) and (K[0, 2], K[1, 2]) == (3.0, 2.0)
    points = torch.tensor([[0, 0, 2.0], [0, 0, 1.0], [0.5, 0, 1.0], [0, 0, -1.0], [10.0, 0, 1.0], [0, -0.8, 1.0]])
    colors = torch.tensor([RED, GREEN, BLUE, RED, RED, BLUE], dtype=torch.uint8)
    image = splat(points, colors, K, T, (5, 7), background=(7, 7, 7))
    expected = np.full((5, 7, 3), 7, np.uint8)
    expected[2, 3] = GREEN  # nearer than the red point on the same ray
    expected[2, 4] = BLUE  # u = 2.5 * 0.5 + 3 = 4.25
    expected[0, 3] = BLUE  # v = 2.5 * -0.8 + 2 = 0: above the centre (y down)
    np.testing.assert_array_equal(image.numpy(), expected)  # behind the camera and off-image: not drawn


def test_splat_radius_covers_a_square_and_equal_depths_go_to_the_first_point() -> None:
    K, T = forward_camera()
    points = torch.tensor([[0, 0, 1.0], [0, 0, 1.0]])
    image = splat(points, torch.tensor([RED, GREEN], dtype=torch.uint8), K, T, (5, 7), radius=1)
    drawn = (image.numpy() != 0).any(-1)
    assert drawn.sum() == 9 and drawn[1:4, 2:5].all()
    assert (image.numpy()[drawn] == RED).all()
    empty = splat(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.uint8), K, T, (5, 7), background=(1, 2, 3))
    assert (empty.numpy() == (1, 2, 3)).all()
    with pytest.raises(ValueError, match="radius"):
        splat(points, torch.tensor([RED, GREEN], dtype=torch.uint8), K, T, (5, 7), radius=-1)


def test_look_at_puts_the_target_at_the_centre_and_up_at_the_top() -> None:
    eye, target, up = np.array([1.0, -2.0, -3.0]), np.array([0.5, 0.0, 4.0]), np.array([0.0, -1.0, 0.0])
    T = look_at(eye, target, up)
    R = T[:, :3].numpy()
    np.testing.assert_allclose(R.T @ R, np.eye(3), atol=1e-12)
    assert np.linalg.det(R) == pytest.approx(1.0)
    K = pinhole(101, 201, 60.0)
    probe = torch.tensor(np.stack([target, target + 0.5 * up]))
    uv, z = project_points(probe, K, T)
    np.testing.assert_allclose(uv[0].numpy(), [100.0, 50.0], atol=1e-9)  # the target: the image centre
    assert uv[1, 1] < uv[0, 1] and z[0] > 0  # a point above it: higher in the image
    with pytest.raises(ValueError, match="parallel"):
        look_at([0, 0, 0], [0, 5, 0], [0, -1, 0])


def test_the_virtual_camera_follows_from_behind_and_above_or_looks_down_from_high() -> None:
    poses, up = straight_run(), np.array([0.0, -1.0, 0.0])
    follow = camera_path(poses, extent=4.0, up=up, style=PathStyle(mode="follow", smooth_frames=0))
    # eye = centre - forward * back * E + up * height * E; looking at centre + forward * ahead * E
    np.testing.assert_allclose(follow[:, :, 3], poses[:, :, 3] + [0.0, -0.12 * 4, -0.25 * 4], atol=1e-12)
    for view, pose in zip(follow, poses):
        direction = pose[:, 3] + [0, 0, 1.0] - view[:, 3]
        np.testing.assert_allclose(view[:, 2], direction / np.linalg.norm(direction), atol=1e-12)
        assert view[:, 1] @ up < 0  # image down = world down
    bird = camera_path(poses, extent=4.0, up=up, style=PathStyle(mode="birdeye", smooth_frames=0))
    np.testing.assert_allclose(bird[:, :, 3], poses[:, :, 3] + [0.0, -0.8 * 4, -0.2 * 4], atol=1e-12)
    assert (bird[:, :, 2] @ up < -0.9).all()  # looking down
    overview = (np.array([1.0, -1.0, -5.0]), np.array([1.0, 0.0, 2.0]))
    static = camera_path(poses, extent=4.0, up=up, style=PathStyle(mode="static"), overview=overview)
    np.testing.assert_array_equal(static, np.repeat(static[:1], len(poses), axis=0))
    np.testing.assert_allclose(static[0, :, 3], overview[0])
    with pytest.raises(ValueError, match="mode"):
        PathStyle(mode="orbit")


def test_smoothing_keeps_steady_motion_and_removes_shake() -> None:
    steady = np.arange(40.0)[:, None] * [0.5, 0.0, 0.1]
    np.testing.assert_allclose(smooth(steady, 3.0)[12:-12], steady[12:-12], atol=1e-9)
    shaky = steady + np.where(np.arange(40) % 2, 0.2, -0.2)[:, None]
    assert np.abs(smooth(shaky, 3.0) - steady)[12:-12].max() < 1e-3
    np.testing.assert_array_equal(smooth(shaky, 0.0), shaky)
    assert smooth(np.arange(5.0), 10.0).shape == (5,)  # a kernel longer than the path


def test_the_flythrough_is_a_video_of_the_cloud_growing(tmp_path: Path) -> None:
    recon = plane_run()
    options = RenderOptions(mode="static", height=60, inset=False, radius=1)
    path = render_flythrough(recon, tmp_path / "fly.mp4", options, device="cpu", progress=False)
    frames = decode(path)
    assert len(frames) == len(recon) and frames[0].shape == (60, 80, 3)  # the frames' 4:3 aspect
    assert [p.name for p in tmp_path.iterdir()] == ["fly.mp4"]  # no temp file left
    lit = [(f.astype(int).sum(-1) > 150) for f in frames]
    assert lit[-1].sum() > lit[0].sum() > 0  # more of the plane each frame (frames 0..t)
    red = (frames[-1][..., 0] > 150) & (frames[-1][..., 1] < 100)
    green = (frames[-1][..., 1] > 150) & (frames[-1][..., 0] < 100)
    assert red.sum() > 50 and green.sum() > 50


def test_an_interrupted_render_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mapstream.render.flythrough as flythrough

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return splat(*args, **kwargs)

    monkeypatch.setattr(flythrough, "splat", failing)
    (tmp_path / "fly.mp4").write_bytes(b"an earlier render")
    with pytest.raises(KeyboardInterrupt):
        render_flythrough(plane_run(), tmp_path / "fly.mp4", RenderOptions(height=32), progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["fly.mp4"]
    assert (tmp_path / "fly.mp4").read_bytes() == b"an earlier render"


def test_render_options_refuse_what_cannot_be_drawn() -> None:
    for bad, message in [({"height": 4}, "height"), ({"fps": 0}, "fps"), ({"background": "grey"}, "background"),
                         ({"radius": -1}, "radius"), ({"mode": "orbit"}, "mode"), ({"fov": 180}, "fov"),
                         ({"every": 0}, "every")]:
        with pytest.raises(ValueError, match=message):
            RenderOptions(**bad)


def test_mapstream_render_writes_the_video_into_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mapstream.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    plane_run(n=3).save_npz(run / "predictions.npz")
    assert main(["render", str(run), "--height", "48", "--quiet", "--device", "cpu", "--mode", "birdeye"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'flythrough.mp4'} (3 frames at 10 FPS)"
    assert len(decode(run / "flythrough.mp4")) == 3
    assert main(["render", str(run), "--out", str(tmp_path / "short.mp4"), "--every", "2", "--height", "48",
                 "--quiet", "--device", "cpu"]) == 0  # frames 0 and 2 (the last)
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'short.mp4'} (2 frames at 10 FPS)"
    assert len(decode(tmp_path / "short.mp4")) == 2
    assert main(["render", str(run), "--out", str(tmp_path / "part.mp4"), "--frames", "1:", "--height", "48",
                 "--quiet", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'part.mp4'} (2 frames at 10 FPS)"
    assert main(["render", str(tmp_path / "nowhere"), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["render", str(run), "--device", "tpu", "--quiet"]) == 2
    assert "--device tpu" in capsys.readouterr().err


def test_mapstream_render_checks_its_options_before_reading_the_run(tmp_path, capsys, monkeypatch) -> None:
    """A bad output name or option is reported before the run is read (which may be large),
    with what to pass instead."""
    import mapstream.viewer as viewer
    from mapstream.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    plane_run(n=2).save_npz(run / "predictions.npz")
    monkeypatch.setattr(viewer, "load_run", lambda *a: pytest.fail("the run was read"))
    assert main(["render", str(run), "--out", str(tmp_path / "video"), "--quiet"]) == 2
    assert "must end in .mp4, .mkv, .mov (e.g. video.mp4)" in capsys.readouterr().err
    assert main(["render", str(run), "--fps", "0", "--quiet"]) == 2
    assert "fps must be in (0, 240]" in capsys.readouterr().err
    assert not list(tmp_path.glob("video*"))


def test_the_trajectory_overlay_grows_linearly_with_the_frames() -> None:
    """The trail is sampled once for the whole run and each frame draws a prefix of it: its
    memory is linear in the frames (it was a copy per frame, quadratic)."""
    from mapstream.render.flythrough import _overlays

    recon = plane_run(n=40)
    (points, colors), frusta, per_segment = _overlays(recon, 1.0, "cpu")
    assert points.shape == (39 * per_segment, 3) and colors.shape == points.shape
    assert len(frusta) == 40 and all(f[0].shape == (8 * 48, 3) for f in frusta)
    np.testing.assert_allclose(points[0].numpy(), recon.T_world_cam[0, :, 3])
    np.testing.assert_allclose(points[per_segment - 1].numpy(), recon.T_world_cam[1, :, 3], atol=1e-6)


def test_mapstream_render_pivot_turns_as_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mapstream.render.flythrough as flythrough
    from mapstream.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    plane_run(n=3).save_npz(run / "predictions.npz")
    styles = []
    real = flythrough.camera_path

    def recording_path(*args, style, **kwargs):
        styles.append(style)
        return real(*args, style=style, **kwargs)

    monkeypatch.setattr(flythrough, "camera_path", recording_path)
    assert main(["render", str(run), "--height", "32", "--quiet", "--device", "cpu", "--mode", "pivot",
                 "--turns", "-0.5"]) == 0
    assert [(s.mode, s.turns) for s in styles] == [("pivot", -0.5)]
    with pytest.raises(ValueError, match="turns must be a finite number"):
        RenderOptions(mode="pivot", turns=float("inf"))
