"""Reconstruction: validation, derived fields, selection and the predictions.npz round trip."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from export_synthetic import H, N, W, make_recon, poses

from mapstream.export import NPZ_KEYS, Reconstruction


def _fields(recon: Reconstruction) -> dict:
    return dict(
        images=recon.images, depth=recon.depth, depth_conf=recon.depth_conf, T_world_cam=recon.T_world_cam,
        K=recon.K, pose_enc=recon.pose_enc, names=recon.names, keyframe=recon.keyframe,
    )


def test_fields_and_derived_values() -> None:
    recon = make_recon()
    assert len(recon) == N and recon.image_hw == (H, W)
    assert recon.depth.dtype == np.float32 and recon.timestamps.dtype == np.float64
    np.testing.assert_allclose(recon.timestamps, np.arange(N) / 10.0)
    T_cam_world = recon.T_cam_world
    assert T_cam_world.shape == (N, 3, 4) and T_cam_world.dtype == np.float32
    for i in range(N):
        world_cam = np.vstack([recon.T_world_cam[i], [0, 0, 0, 1]])
        cam_world = np.vstack([T_cam_world[i], [0, 0, 0, 1]])
        np.testing.assert_allclose(cam_world @ world_cam, np.eye(4), atol=1e-6)
    no_fps = make_recon(fps=None)
    np.testing.assert_array_equal(no_fps.timestamps, np.arange(N, dtype=np.float64))


def test_accepts_model_shaped_inputs() -> None:
    recon = make_recon()
    T44 = np.repeat(np.eye(4, dtype=np.float32)[None], N, axis=0)
    T44[:, :3] = recon.T_world_cam
    other = Reconstruction(**{**_fields(recon), "depth": recon.depth[..., None].astype(np.float64),
                              "T_world_cam": T44, "keyframe": None})
    np.testing.assert_array_equal(other.depth, recon.depth)
    np.testing.assert_array_equal(other.T_world_cam, recon.T_world_cam)
    assert other.keyframe.dtype == bool and not other.keyframe.any()


@pytest.mark.parametrize(
    "change, error, words",
    [
        ({"depth": np.zeros((N, H, W + 1), np.float32)}, ValueError, ["depth", f"[{N}, {H}, {W}]", f"{W + 1}"]),
        ({"depth_conf": np.zeros((N - 1, H, W), np.float32)}, ValueError, ["depth_conf"]),
        ({"K": np.zeros((N, 3, 4), np.float32)}, ValueError, ["K", "[4, 3, 3]"]),
        ({"T_world_cam": np.zeros((N, 4, 3), np.float32)}, ValueError, ["T_world_cam"]),
        ({"pose_enc": np.zeros(N, np.float32)}, ValueError, ["pose_enc"]),
        ({"names": ["a", "b"]}, ValueError, ["names", "2 entries", f"{N} frames"]),
        ({"names": "abcd"}, TypeError, ["names"]),
        ({"keyframe": np.zeros(N + 1, bool)}, ValueError, ["keyframe"]),
        ({"images": np.zeros((N, H, W, 3), np.float32)}, TypeError, ["uint8", "float32"]),
        ({"images": np.zeros((N, H, W), np.uint8)}, ValueError, ["images"]),
        ({"images": np.zeros((0, H, W, 3), np.uint8)}, ValueError, ["N = 0"]),
        ({"sky_mask": np.zeros((N, H, 3), bool)}, ValueError, ["sky_mask"]),
        ({"timestamps": np.zeros(2)}, ValueError, ["timestamps"]),
    ],
)
def test_bad_input_gives_clear_errors(change: dict, error: type, words: list[str]) -> None:
    fields = {**_fields(make_recon()), **change}
    with pytest.raises(error) as info:
        Reconstruction(**fields)
    for word in words:
        assert word in str(info.value)


def test_non_finite_pose_is_rejected() -> None:
    fields = _fields(make_recon())
    fields["T_world_cam"] = fields["T_world_cam"].copy()
    fields["T_world_cam"][2, 0, 3] = np.nan
    with pytest.raises(ValueError, match=r"T_world_cam has non-finite values \(frames \[2\]\)"):
        Reconstruction(**fields)


def test_npz_round_trip_is_exact(tmp_path: Path) -> None:
    recon = make_recon()
    path = recon.save_npz(tmp_path / "predictions.npz")
    with np.load(path, allow_pickle=False) as data:  # independent reader: plain numpy
        assert set(data.files) == set(NPZ_KEYS) | {"sky_mask"}
        for key in ("images", "depth", "depth_conf", "T_world_cam", "K", "pose_enc", "keyframe",
                    "timestamps", "sky_mask"):
            stored = data[key]
            assert stored.dtype == getattr(recon, key).dtype, key
            np.testing.assert_array_equal(stored, getattr(recon, key), err_msg=key)
        assert data["names"].tolist() == recon.names
        assert data["image_hw"].tolist() == [H, W]
        np.testing.assert_array_equal(data["T_cam_world"], recon.T_cam_world)
        assert data["T_cam_world"].dtype == np.float32
        np.testing.assert_allclose(data["T_world_cam"], poses(), atol=1e-6)
    loaded = Reconstruction.load_npz(path)
    for key in ("images", "depth", "depth_conf", "T_world_cam", "K", "pose_enc", "keyframe", "timestamps",
                "sky_mask"):
        np.testing.assert_array_equal(getattr(loaded, key), getattr(recon, key), err_msg=key)
    assert loaded.names == recon.names


def test_npz_without_sky_mask_and_compressed(tmp_path: Path) -> None:
    recon = make_recon(sky=False)
    path = recon.save_npz(tmp_path / "p.npz", compress=True)
    with np.load(path) as data:
        assert set(data.files) == set(NPZ_KEYS)
    assert Reconstruction.load_npz(path).sky_mask is None


def test_load_npz_rejects_foreign_files(tmp_path: Path) -> None:
    np.savez(tmp_path / "other.npz", depth=np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="missing keys"):
        Reconstruction.load_npz(tmp_path / "other.npz")


def test_select_and_concat() -> None:
    recon = make_recon()
    first, rest = recon.select([0, 1]), recon.select(slice(2, None))
    assert first.names == recon.names[:2] and len(rest) == 2
    joined = Reconstruction.concat([first, rest])
    for key in ("images", "depth", "T_world_cam", "keyframe", "timestamps", "sky_mask"):
        np.testing.assert_array_equal(getattr(joined, key), getattr(recon, key))
    assert joined.names == recon.names
    assert recon.select(recon.keyframe).names == ["img_000.jpg", "img_002.jpg"]
    assert Reconstruction.concat([first, make_recon(sky=False).select([2, 3])]).sky_mask is None


def test_file_stems_are_safe_and_unique() -> None:
    recon = make_recon()
    recon.names = ["a/img 1.jpg", "b/img 1.jpg", ".hidden.png", "frame_000003"]
    assert recon.file_stems() == ["img_1", "img_1_000001", "hidden", "frame_000003"]
