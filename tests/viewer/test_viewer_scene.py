"""The viewer's scene logic without a server: point pool, selection, frames, cameras, framing."""
from __future__ import annotations

import math

import numpy as np
import pytest
from viewer_synthetic import CONF_MAX, FX, FY, H, INVALID_PIXELS, N, PLANE_Z, SKY_ROWS, W, make_recon

from mapstream.viewer.scene import (
    PRESET_DISTANCE,
    VIEW_PRESETS,
    build_point_pool,
    downscale_image,
    frame_indices,
    frustum_params,
    rotation_to_wxyz,
    scene_axes,
    scene_framing,
    select_points,
    trajectory_colors,
    view_preset,
    visible_cameras,
    visible_frames,
)


def quaternion_matrix(wxyz: np.ndarray) -> np.ndarray:
    """Rotation matrix of a unit quaternion (an independent formula for the round trip)."""
    w, x, y, z = wxyz
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def test_pool_holds_every_valid_pixel_unprojected_with_its_colour() -> None:
    recon = make_recon()
    pool = build_point_pool(recon)
    assert len(pool) == pool.num_valid == N * H * W - INVALID_PIXELS
    assert np.all(np.diff(pool.frame) >= 0) and pool.num_frames == N
    np.testing.assert_allclose(pool.xyz[:, 2], PLANE_Z, atol=1e-6)
    # Frame 2's pixel (u, v) = (5, 9): X = (u - W/2) z / fx + 0.2 (camera 2 sits at x = 0.2).
    index = pool.frame_slice(2).start + 9 * W + 5
    np.testing.assert_allclose(
        pool.xyz[index], [(5 - W / 2) * PLANE_Z / FX + 0.2, (9 - H / 2) * PLANE_Z / FY, PLANE_Z], atol=1e-6
    )
    np.testing.assert_array_equal(pool.rgb[index], recon.images[2, 9, 5])
    assert pool.conf[index] == recon.depth_conf[2, 9, 5]
    assert pool.has_sky_mask and pool.sky.sum() == N * SKY_ROWS * W - 1  # frame 1's (0, 0) has depth 0
    assert sorted(pool.rank.tolist()) == list(range(len(pool)))


def test_pool_cap_is_a_seeded_deterministic_subsample() -> None:
    recon = make_recon()
    full = build_point_pool(recon)
    first, again = build_point_pool(recon, max_points=1000, seed=3), build_point_pool(recon, max_points=1000, seed=3)
    other = build_point_pool(recon, max_points=1000, seed=4)
    assert len(first) == 1000 and first.num_valid == len(full)
    for name in ("xyz", "rgb", "conf", "sky", "frame", "rank"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    assert not np.array_equal(first.xyz, other.xyz)
    full_rows = {tuple(row) for row in np.column_stack([full.frame, full.xyz]).tolist()}
    assert all(tuple(row) in full_rows for row in np.column_stack([first.frame, first.xyz]).tolist())
    assert np.all(np.bincount(first.frame, minlength=N) > 250)  # uniform: about 333 per frame
    with pytest.raises(ValueError, match="max_points"):
        build_point_pool(recon, max_points=0)


def test_threshold_is_strictly_greater() -> None:
    pool = build_point_pool(make_recon())
    assert (pool.conf == 1.0).sum() == N - 1  # pixel (0, 0), valid in frames 0 and 2
    assert select_points(pool, 1.0).sum() == len(pool) - (N - 1)
    value = float(pool.conf[1234])
    mask = select_points(pool, value)
    assert not mask[pool.conf == value].any() and mask[pool.conf > value].all() and not mask[pool.conf < value].any()
    assert not select_points(pool, CONF_MAX).any()


def test_sky_toggle_removes_exactly_the_sky_points() -> None:
    pool = build_point_pool(make_recon())
    kept = select_points(pool, 0.0, hide_sky=True)
    np.testing.assert_array_equal(kept, ~pool.sky)
    no_sky = build_point_pool(make_recon(sky=False))
    assert not no_sky.has_sky_mask and select_points(no_sky, 0.0, hide_sky=True).all()


def test_downsample_is_nested_and_deterministic() -> None:
    pool = build_point_pool(make_recon())
    by2, by4 = select_points(pool, 0.0, downsample=2), select_points(pool, 0.0, downsample=4)
    assert by2.sum() == math.ceil(len(pool) / 2) and by4.sum() == math.ceil(len(pool) / 4)
    assert np.all(by2[by4])
    np.testing.assert_array_equal(by4, select_points(build_point_pool(make_recon()), 0.0, downsample=4))
    with pytest.raises(ValueError, match="downsample"):
        select_points(pool, 0.0, downsample=0)


def test_frame_modes_and_filtering() -> None:
    np.testing.assert_array_equal(visible_frames(4, 1, "up to t"), [True, True, False, False])
    np.testing.assert_array_equal(visible_frames(4, 1, "only t"), [False, True, False, False])
    assert visible_frames(4, 1, "all").all()
    with pytest.raises(ValueError, match="outside"):
        visible_frames(4, 4, "only t")
    with pytest.raises(ValueError, match="frame mode"):
        visible_frames(4, 0, "every")  # type: ignore[arg-type]
    pool = build_point_pool(make_recon())
    mask = select_points(pool, 3.0)
    index = frame_indices(pool, mask, visible_frames(N, 1, "only t"))
    assert np.all(pool.frame[index] == 1) and np.all(pool.conf[index] > 3.0)
    assert len(index) == (mask & (pool.frame == 1)).sum() > 0
    upto = frame_indices(pool, mask, visible_frames(N, 1, "up to t"))
    assert set(np.unique(pool.frame[upto])) == {0, 1}


def test_trajectory_colors() -> None:
    colors = trajectory_colors(5)
    assert colors.shape == (5, 3) and colors.dtype == np.uint8
    np.testing.assert_array_equal(colors[0], [68, 1, 84])
    np.testing.assert_array_equal(colors[-1], [253, 231, 37])
    assert trajectory_colors(1).shape == (1, 3)


@pytest.mark.parametrize("seed", range(6))
def test_rotation_to_wxyz_round_trip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    R = q * np.sign(np.linalg.det(q))
    if seed == 0:
        R = np.diag([1.0, -1.0, -1.0])  # 180 degrees: the trace < 0 branch
    wxyz = rotation_to_wxyz(R)
    assert wxyz[0] >= 0 and abs(np.linalg.norm(wxyz) - 1) < 1e-12
    np.testing.assert_allclose(quaternion_matrix(wxyz), R, atol=1e-9)


def test_frustum_params_and_framing() -> None:
    recon = make_recon()
    fov, aspect, wxyz, position = frustum_params(recon, 2)
    assert fov == pytest.approx(2 * math.atan(H / 2 / FY)) and aspect == pytest.approx(W / H)
    np.testing.assert_allclose(wxyz, [1, 0, 0, 0])
    np.testing.assert_allclose(position, [0.2, 0, 0], atol=1e-7)
    framing = scene_framing(recon, build_point_pool(recon))
    np.testing.assert_allclose(framing.up, [0, -1, 0])
    assert framing.center[2] == pytest.approx(PLANE_Z) and 1 < framing.extent < 4
    assert framing.camera_position[2] < 0  # behind the first camera, looking at the plane
    assert framing.point_size == pytest.approx(PLANE_Z / FY)
    capped = scene_framing(recon, build_point_pool(recon, max_points=len(build_point_pool(recon)) // 4))
    assert capped.point_size == pytest.approx(2 * PLANE_Z / FY, rel=0.01)


def test_view_presets_on_the_synthetic_scene() -> None:
    """Cameras at x = 0.1 i look down +z with y down: forward = +z, up = -y, right = +x."""
    recon = make_recon()
    framing = scene_framing(recon, build_point_pool(recon))
    center, d = np.array([0.1, -0.05, PLANE_Z]), PRESET_DISTANCE * framing.extent
    np.testing.assert_allclose(framing.center, center, atol=1e-6)
    forward, right, up = scene_axes(recon, framing)
    np.testing.assert_allclose(np.stack([forward, right, up]), [[0, 0, 1], [1, 0, 0], [0, -1, 0]], atol=1e-12)
    expected = {
        # Behind and above the first camera (y is down), looking at the scene centre.
        "overview": ([0, -0.15 * framing.extent, -0.3 * framing.extent], center, [0, -1, 0]),
        "front": (center + [0, 0, -d], center, [0, -1, 0]),
        "back": (center + [0, 0, d], center, [0, -1, 0]),
        "left": (center + [-d, 0, 0], center, [0, -1, 0]),
        "right": (center + [d, 0, 0], center, [0, -1, 0]),
        "top": (center + [0, -d, 0], center, [0, 0, 1]),
        "first camera": ([0, 0, 0], [0, 0, PLANE_Z], [0, -1, 0]),
        "current camera": ([0.2, 0, 0], [0.2, 0, PLANE_Z], [0, -1, 0]),
    }
    assert set(expected) == set(VIEW_PRESETS)
    for name, (position, look_at, up_vector) in expected.items():
        got = view_preset(recon, framing, name, frame=2)
        assert all(v.dtype == np.float64 and v.shape == (3,) for v in got), name
        for value, want in zip(got, (position, look_at, up_vector)):
            np.testing.assert_allclose(value, want, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(view_preset(recon, framing, "current camera", frame=1)[0], [0.1, 0, 0], atol=1e-7)
    with pytest.raises(ValueError, match="unknown view"):
        view_preset(recon, framing, "bottom")
    with pytest.raises(ValueError, match="outside"):
        view_preset(recon, framing, "current camera", frame=N)


def test_view_presets_follow_the_scene_frame() -> None:
    """The same scene in another world frame (rotated and moved): every preset direction and
    up vector turn with it, so "front" still looks along the first camera's axis."""
    recon = make_recon()
    c, s = math.cos(0.7), math.sin(0.7)
    R = np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]) @ np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    moved = make_recon()
    moved.T_world_cam[:, :, :3] = R @ recon.T_world_cam[:, :, :3]
    moved.T_world_cam[:, :, 3] = recon.T_world_cam[:, :, 3] @ R.T + [5.0, -1.0, 2.0]
    framing, moved_framing = (scene_framing(r, build_point_pool(r)) for r in (recon, moved))
    for name in ("front", "back", "left", "right", "top"):
        p, look, up = view_preset(recon, framing, name)
        p2, look2, up2 = view_preset(moved, moved_framing, name)
        np.testing.assert_allclose(look2, moved_framing.center)
        np.testing.assert_allclose((p2 - look2) / moved_framing.extent, R @ (p - look) / framing.extent, atol=1e-6)
        np.testing.assert_allclose(up2, R @ up, atol=1e-6)
    position, look_at, up = view_preset(moved, moved_framing, "current camera", frame=1)
    np.testing.assert_allclose(position, moved.T_world_cam[1, :, 3], atol=1e-6)
    np.testing.assert_allclose(up, -moved.T_world_cam[1, :, 1], atol=1e-6)
    axis = (look_at - position) / np.linalg.norm(look_at - position)
    np.testing.assert_allclose(axis, moved.T_world_cam[1, :, 2], atol=1e-6)


def test_scene_axes_when_the_first_camera_looks_straight_down() -> None:
    """Its optical axis has no horizontal part: forward falls back to the top of its image."""
    recon = make_recon()
    down = np.array([[1, 0, 0], [0, 0, 1], [0, -1, 0]], np.float32)  # z_cam = +y (down), y_cam = -z
    recon.T_world_cam[0, :, :3] = down
    recon.T_world_cam[1, :, :3] = np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]], np.float32)  # y_cam = +z
    framing = scene_framing(recon, build_point_pool(recon))
    np.testing.assert_allclose(framing.up, [0, -1, 0], atol=1e-6)  # mean y: (-z + z + y) / 3
    forward, right, up = scene_axes(recon, framing)
    np.testing.assert_allclose(np.stack([forward, right, up]), [[0, 0, 1], [1, 0, 0], [0, -1, 0]], atol=1e-6)


def test_camera_subsampling() -> None:
    up_to_7 = visible_frames(10, 7, "up to t")
    np.testing.assert_array_equal(np.flatnonzero(visible_cameras(up_to_7, 7, 3)), [0, 3, 6, 7])
    np.testing.assert_array_equal(np.flatnonzero(visible_cameras(visible_frames(10, 4, "all"), 4, 3)), [0, 3, 4, 6, 9])
    np.testing.assert_array_equal(np.flatnonzero(visible_cameras(up_to_7, 7, 1)), np.arange(8))
    np.testing.assert_array_equal(np.flatnonzero(visible_cameras(visible_frames(10, 5, "only t"), 5, 2)), [5])
    with pytest.raises(ValueError, match="camera subsampling"):
        visible_cameras(up_to_7, 7, 0)


def test_downscale_image_longest_side() -> None:
    image = np.arange(500 * 700 * 3, dtype=np.int64).reshape(500, 700, 3)
    small = downscale_image(image, 320)  # stride 3: 700 / 3 -> 234 columns
    assert small.shape == (167, 234, 3)
    np.testing.assert_array_equal(small, image[::3, ::3])
    assert downscale_image(image[:, :640], 320).shape == (250, 320, 3)  # exactly halved
    assert downscale_image(image[:320, :200], 320).shape == (320, 200, 3)  # fits already
    with pytest.raises(ValueError, match="max_side"):
        downscale_image(image, 0)
