"""Parity with the reference's golden outputs, tiny preset (README section 5 and 9 cases)."""
from __future__ import annotations

import pytest
import torch

import mapstream
from conftest import golden_case, golden_images
from golden_helpers import (
    assert_intermediate_close,
    assert_outputs_close,
    cache_config_of,
    forward_sequence,
    keyframe_interval_of,
)
from mapstream.geometry import invert_se3, pose_encoding_to_extri_intri
from mapstream.layers import patch_positions_2d, rope3d, rope3d_angles, rope3d_time_columns, rope3d_time_inv_freq, token_positions_3d


def tiny_model(weights, meta) -> mapstream.GCTStream:
    cache = cache_config_of(meta)
    model = mapstream.build_model(
        "tiny", kv_cache_scale_frames=cache["cache_scale_frames"], kv_cache_sliding_window=cache["sliding_window"]
    ).eval()
    model.load_state_dict(weights)
    return model


STREAM_CASES = [
    "tiny_stream_plain",
    "tiny_stream_plain_fi",
    "tiny_stream_kf_fi",  # keyframes: the FlashInfer semantics are the target on every backend
    "tiny_stream_kf_nopersist",
    "tiny_stream_evict",
    "tiny_stream_evict_kf_fi",  # deferred eviction: non-keyframes see window + 1 frames
]


@pytest.mark.parametrize("case", STREAM_CASES)
def test_inference_streaming_matches_golden(case, tiny_weights):
    ref, meta = golden_case(case)
    model = tiny_model(tiny_weights, meta)
    images = golden_images(ref)
    out = model.inference_streaming(images, num_scale_frames=2, keyframe_interval=keyframe_interval_of(meta))
    assert_outputs_close(out, ref)
    if "post.intrinsic" in ref:
        T_world_cam, K = pose_encoding_to_extri_intri(out["pose_enc"], tuple(images.shape[-2:]))
        # The golden "post.extrinsic_c2w" is the demo's `extrinsic`, i.e. world-to-camera.
        torch.testing.assert_close(invert_se3(T_world_cam), ref["post.extrinsic_c2w"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(K, ref["post.intrinsic"], rtol=1e-4, atol=1e-4)


def test_sdpa_keyframe_bug_is_not_reproduced(tiny_weights):
    """`*_stream_kf` stores non-keyframes (the reference's SDPA bug); we do not."""
    ref, meta = golden_case("tiny_stream_kf")
    model = tiny_model(tiny_weights, meta)
    out = model.inference_streaming(golden_images(ref), num_scale_frames=2, keyframe_interval=2)
    assert (out["pose_enc"] - ref["pose_enc"]).abs().max() > 1e-2
    fi, _ = golden_case("tiny_stream_kf_fi")
    assert_outputs_close(out, fi)


def test_cache_after_each_forward_matches_reference_counters(tiny_weights):
    """Stored frames (= 3D-RoPE time counter) and camera cache length after every call."""
    ref, meta = golden_case("tiny_stream_kf_fi")
    model = tiny_model(tiny_weights, meta)
    images = golden_images(ref)
    session = model.session(num_scale_frames=2, keyframe_interval=2, precision="fp32")
    expected = meta["run"]["cache_after_each_forward"]
    frames = list(images)
    session.step(frames[0])
    for call, frame in zip(expected, frames[1:]):
        session.step(frame)
        stats = session.stats()
        assert stats["aggregator"].frames_stored == call["total_frames_processed"]
        assert stats["camera"].frames_stored == call["cam_frames"] if "cam_frames" in call else True
        assert session.state.camera.frames_stored == call["total_frames_processed"]


def test_isolation_and_stale_cache(tiny_weights):
    ref, meta = golden_case("tiny_isolation")
    model = tiny_model(tiny_weights, meta)
    a, b = golden_images(ref, "A_images_u8"), golden_images(ref, "B_images_u8")
    model.inference_streaming(a, num_scale_frames=2)
    after_a = model.inference_streaming(b, num_scale_frames=2)
    fresh = tiny_model(tiny_weights, meta).inference_streaming(b, num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        assert torch.equal(after_a[key], fresh[key]), key
    assert_outputs_close(fresh, ref, prefix="B.")

    # Low level: without clean_kv_cache() the second sequence continues the first.
    model.clean_kv_cache()
    forward_sequence(model, a, 2)
    stale = forward_sequence(model, b, 2)
    assert_outputs_close(stale, ref, prefix="B_stale.")
    model.clean_kv_cache()
    clean = forward_sequence(model, b, 2)
    assert_outputs_close(clean, ref, prefix="B.")


def test_resolution_change_without_clean_is_a_clear_error(tiny_weights):
    ref, meta = golden_case("tiny_isolation")
    model = tiny_model(tiny_weights, meta)
    a = golden_images(ref, "A_images_u8")
    forward_sequence(model, a, 2)
    other = torch.rand(1, 1, 3, 56, 112)
    with pytest.raises(RuntimeError, match="reset the cache"):
        model(other, num_frame_for_scale=2)
    model.clean_kv_cache()
    out = model(other, num_frame_for_scale=2)  # after a clean, a new resolution is fine
    assert out["depth"].shape == (1, 1, 56, 112, 1)
    # The same patches in another grid (112 x 56 after 56 x 112) is a resolution change too.
    with pytest.raises(RuntimeError, match=r"reset the cache.*"):
        model(other.transpose(-1, -2).contiguous(), num_frame_for_scale=2)


def test_intermediates_match_golden(tiny_weights):
    ref, meta = golden_case("tiny_intermediates")
    model = tiny_model(tiny_weights, meta)
    images = golden_images(ref)
    recorded: dict[str, torch.Tensor] = {}
    step = 0

    def trace(name, tensor):
        recorded[f"s{step}.{name}"] = tensor.detach().clone()

    model.clean_kv_cache()
    x = images.unsqueeze(0)
    calls = [x[:, :2]] + [x[:, i : i + 1] for i in range(2, x.shape[1])]
    vit = model.aggregator.patch_embed
    for step, frames in enumerate(calls):
        if f"s{step}.agg.tokens_in" not in ref:
            break
        model(frames, num_frame_for_scale=2, trace=trace)
        # The ViT and the RoPE tables, recomputed from the same inputs.
        normed = (frames[0] - model.aggregator._resnet_mean[0]) / model.aggregator._resnet_std[0]
        recorded[f"s{step}.vit.patch_proj"] = vit.patch_embed(normed)
        _, hidden = vit(normed, return_hidden=True)
        for i, h in enumerate(hidden):
            recorded[f"s{step}.vit.blocks.{i}"] = h
        h, w = frames.shape[-2] // 14, frames.shape[-1] // 14
        recorded[f"s{step}.agg.pos2d"] = patch_positions_2d(h, w, 6, frames.device).expand(frames.shape[1], -1, -1)
        stored_before = model.aggregator.kv_cache_manager.frames_stored - frames.shape[1]
        pos3d = token_positions_3d(torch.arange(stored_before, stored_before + frames.shape[1]), h, w, 6)
        angles = rope3d_angles(pos3d, (20, 22, 22))
        recorded[f"s{step}.agg.pos3d_real"] = angles.cos()[None, None]
        recorded[f"s{step}.agg.pos3d_imag"] = angles.sin()[None, None]
    checked = 0
    for name, want in ref.items():
        if not name.startswith("s"):
            continue
        assert name in recorded, f"intermediate {name} was not produced"
        got = recorded[name]
        if want.dtype == torch.int64:
            assert torch.equal(got.to(torch.int64), want), name
        else:
            assert_intermediate_close(name, got, want)
        checked += 1
    assert checked >= 100


def test_forward_rejects_bad_input(tiny_weights):
    model = mapstream.build_model("tiny").eval()
    cases = [
        (torch.rand(2, 3, 84, 141), "multiple of the patch size"),
        (torch.rand(2, 4, 84, 140), "3 \\(RGB\\) channels"),
        (torch.rand(84, 140), "shape"),
        (torch.rand(0, 3, 84, 140), "no frame"),
        (torch.rand(2, 3, 84, 140) * 255, "\\[0, 1\\]"),
        (torch.full((2, 3, 84, 140), float("nan")), "NaN"),
        ((torch.rand(2, 3, 84, 140) * 255).to(torch.uint8), "floating point"),
        (torch.rand(2, 2, 3, 84, 140), "batch size 2"),
    ]
    for images, message in cases:
        with pytest.raises(ValueError, match=message):
            model(images, num_frame_for_scale=2)
    with pytest.raises(ValueError, match="causal_inference=False"):
        model(torch.rand(1, 3, 84, 140), causal_inference=False)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
@pytest.mark.parametrize("time_index", [0, 1, 17, 4096, 123_457])
def test_rope3d_time_columns_update_a_frame_table_to_any_time(time_index, as_tensor):
    """A streaming step keeps one frame's 3D RoPE table and rewrites only its time pairs
    (`rope3d_time_columns`, the time as an int or as the float64 scalar tensor a captured
    graph reads); the result must be bit-identical to the table built for that time, and its
    other columns must not depend on time."""
    dims, theta = (20, 22, 22), 10000.0
    table = rope3d(token_positions_3d(torch.tensor([0]), 3, 4, 6), dims, theta)
    want = rope3d(token_positions_3d(torch.tensor([time_index]), 3, 4, 6), dims, theta)
    time = torch.tensor(float(time_index), dtype=torch.float64) if as_tensor else time_index
    cos, sin = rope3d_time_columns(time, rope3d_time_inv_freq(dims, theta, torch.device("cpu")))
    assert cos.shape == sin.shape == (dims[0] // 2,)
    table.cos[:, : cos.numel()].copy_(cos)
    table.sin[:, : sin.numel()].copy_(sin)
    assert torch.equal(table.cos, want.cos) and torch.equal(table.sin, want.sin)


def test_the_rope_table_size_limits_nothing_but_the_frame_grid():
    """LIMITS 1: the reference's 3D RoPE reads a table of max_frame_num rows, so it crashed once
    that many frames were stored, and on a frame grid wider than max_frame_num - 6. Angles are
    computed from positions here: a table of 9 rows streams 20 stored frames with the outputs
    of the default 1024, and a grid that would not fit is a clear error before any work."""
    x = torch.rand(20, 3, 28, 42, generator=torch.Generator().manual_seed(6))  # a 2 x 3 patch grid
    small = mapstream.fill_synthetic_(mapstream.build_model("tiny", max_frame_num=9)).eval()
    default = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    got = small.inference_streaming(x, num_scale_frames=2)
    want = default.inference_streaming(x, num_scale_frames=2)
    assert torch.equal(got["pose_enc"], want["pose_enc"]) and torch.equal(got["depth"], want["depth"])
    too_small = mapstream.fill_synthetic_(mapstream.build_model("tiny", max_frame_num=8)).eval()
    with pytest.raises(ValueError, match="max_frame_num=8 is too small for a 2x3 patch grid.*needs max_frame_num >= 9"):
        too_small.inference_streaming(x[:3], num_scale_frames=2)
