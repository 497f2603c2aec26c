"""Windowed inference against the golden data (tiny preset)."""
from __future__ import annotations

import torch

import mapstream
from conftest import golden_case, golden_images
from golden_helpers import assert_outputs_close
from mapstream.compat import GCTStreamWindow, GCTStreamWindowV2
from mapstream.windowed import Sim3, pairwise_alignment, stitch_windows, warp_predictions

TRANSFORM_TOL = dict(rtol=1e-4, atol=1e-4)


def _tiny(cls, weights=None):
    preset = mapstream.get_preset("tiny")
    model = cls(preset.model, preset.stream)
    if weights is None:
        mapstream.fill_synthetic_(model)
    else:
        model.load_state_dict(weights)
    return model.eval()


def _check_windowed(out, ref, keys=("pose_enc", "depth", "depth_conf")):
    assert_outputs_close(out, ref, keys=keys)
    assert torch.equal(out["frame_type"], ref["frame_type"])
    assert torch.equal(out["is_keyframe"], ref["is_keyframe"])
    torch.testing.assert_close(out["chunk_scales"], ref["chunk_scales"], **TRANSFORM_TOL)
    torch.testing.assert_close(out["chunk_transforms"], ref["chunk_transforms"], **TRANSFORM_TOL)
    assert out["alignment_mode"] == "scaled"
    for i, window in enumerate(out["windows"]):
        torch.testing.assert_close(window["pose_enc"], ref[f"window{i}.pose_enc"], rtol=1e-4, atol=1e-4)
        if f"window{i}.depth" in ref:
            torch.testing.assert_close(window["depth"], ref[f"window{i}.depth"], rtol=1e-4, atol=1e-5)


def test_windowed_matches_golden(tiny_weights):
    ref, _ = golden_case("tiny_windowed")
    model = _tiny(GCTStreamWindow, tiny_weights)
    out = model.inference_windowed(
        golden_images(ref), window_size=4, overlap_size=2, num_scale_frames=2, keyframe_interval=1, return_windows=True
    )
    assert [w["pose_enc"].shape[1] for w in out["windows"]] == [4, 4, 4]
    _check_windowed(out, ref)


def test_windowed_v2_builds_the_point_head_and_matches_golden():
    ref, _ = golden_case("tiny_windowed_v2")
    model = _tiny(GCTStreamWindowV2)
    assert model.point_head is not None
    out = model.inference_windowed(
        golden_images(ref), window_size=4, overlap_size=2, num_scale_frames=2, return_windows=True
    )
    _check_windowed(out, ref, keys=("pose_enc", "depth", "depth_conf", "world_points", "world_points_conf"))


def test_windowed_with_keyframes_plan_and_alignment(tiny_weights):
    """`tiny_windowed_kf` was produced by the reference's SDPA backend, which stores
    non-keyframes (LIMITS E17); mapstream follows the FlashInfer semantics, so its
    per-window predictions differ by design. The window plan and frame types must match,
    and our alignment + stitching applied to the golden per-window predictions must
    reproduce the golden stitched outputs."""
    ref, _ = golden_case("tiny_windowed_kf")
    model = _tiny(GCTStreamWindow, tiny_weights)
    out = model.inference_windowed(
        golden_images(ref), window_size=4, overlap_size=2, num_scale_frames=2, keyframe_interval=2, return_windows=True
    )
    assert torch.equal(out["frame_type"], ref["frame_type"])
    assert torch.equal(out["is_keyframe"], ref["is_keyframe"])
    assert [w["pose_enc"].shape[1] for w in out["windows"]] == [6, 6]

    # Each window equals a plain keyframe stream of its frames (FlashInfer semantics).
    images = golden_images(ref)
    for (start, end), window in zip([(0, 6), (4, 10)], out["windows"]):
        stream = model.inference_streaming(images[start:end], num_scale_frames=2, keyframe_interval=2)
        assert torch.equal(stream["pose_enc"], window["pose_enc"])

    windows = []
    for i, window in enumerate(out["windows"]):
        windows.append(
            {
                "pose_enc": ref[f"window{i}.pose_enc"],
                "depth": ref[f"window{i}.depth"],
                "frame_type": window["frame_type"],
                "is_keyframe": window["is_keyframe"],
            }
        )
    aligned = [warp_predictions(windows[0], Sim3.identity(1, "cpu"))]
    sims = [Sim3.identity(1, "cpu")]
    for window in windows[1:]:
        sims.append(pairwise_alignment(aligned[-1], window, overlap=2, join="anchor"))  # the reference's
        aligned.append(warp_predictions(window, sims[-1]))
    stitched = stitch_windows(aligned, overlap=2)
    torch.testing.assert_close(stitched["pose_enc"], ref["pose_enc"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(stitched["depth"], ref["depth"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack([s.scale for s in sims], 1), ref["chunk_scales"], **TRANSFORM_TOL)
    torch.testing.assert_close(torch.stack([s.matrix() for s in sims], 1), ref["chunk_transforms"], **TRANSFORM_TOL)


def test_single_window_returns_raw_predictions(tiny_weights):
    ref, _ = golden_case("tiny_stream_plain")
    model = _tiny(GCTStreamWindow, tiny_weights)
    images = golden_images(ref)
    out = model.inference_windowed(images, window_size=64, num_scale_frames=2)
    assert "chunk_scales" not in out and out["alignment_mode"] == "scaled"
    assert_outputs_close(out, ref)  # not re-encoded: identical to plain streaming
    assert out["frame_type"].tolist() == [[0, 0, 1, 1, 1, 1]]
