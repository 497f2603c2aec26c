"""Parity with the reference's golden outputs, full (official-size) model with rule weights.

~2 s a frame on two CPU cores; the whole module takes a few minutes. Its memory is the model
(4.6 GB of fp32 weights, built once for the module), one case's cache at a time and no autograd
graph: the module peaks at the resident size measured in README.md.
"""
from __future__ import annotations

import pytest
import torch

import mapstream
from conftest import golden_case, golden_images, trim_process_memory
from golden_helpers import assert_intermediate_close, assert_outputs_close, cache_config_of, forward_sequence

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_model():
    golden_case("full_stream_plain")  # skips the module when the golden data is absent
    trim_process_memory()  # in the whole suite, what earlier tests freed is not resident beside it
    torch.manual_seed(0)
    # trajectory_capacity=None: the reference keeps every evicted frame's special tokens, and so
    # does this model's cache, which then grows with the stream instead of reserving room for
    # 1,024 frames' up front (1.4 GB at the golden frames' size). Weights that need no gradient:
    # the cases that call the model directly keep no autograd graph (0.9 GB a frame).
    # A window of 16 frames, not the reference's 64: every case streams at most 9 frames into
    # one cache (or names its own window), so nothing is evicted either way, and the cache's
    # ring, reserved whole when a stream starts, takes 0.4 GB instead of 1.5 GB.
    model = mapstream.build_model("lingbot-map", trajectory_capacity=None, kv_cache_sliding_window=16)
    mapstream.fill_synthetic_(model).requires_grad_(False)
    yield model.eval()
    model.free_kv_cache()
    del model
    trim_process_memory()


@pytest.fixture(autouse=True)
def _cache_pages_returned_after_each_case(full_model):
    yield
    full_model.free_kv_cache()  # the next case leases a cache of its own size


def stream(model, images, keyframe_interval=1, cache=None, trace=None):
    with model.session(num_scale_frames=2, keyframe_interval=keyframe_interval, precision="fp32", **(cache or {})) as s:
        return s.run(images)


def test_plain_stream_and_intermediates(full_model):
    ref, meta = golden_case("full_stream_plain")
    images = golden_images(ref)
    inter, _ = golden_case("full_intermediates")
    assert torch.equal(inter["images_u8"], ref["images_u8"])
    wanted = {name for name in inter if name.startswith("s1.")}
    compared = set()
    calls = {"n": 0}

    def trace(name, tensor):
        # Each intermediate is compared as the forward produces it and never kept: the
        # traced call would otherwise hold a copy of every block's output at once.
        key = f"s{calls['n']}.{name}"
        if key in wanted:
            assert_intermediate_close(key, tensor.detach(), inter[key])
            compared.add(key)

    full_model.clean_kv_cache()
    x = images.unsqueeze(0)
    outs = []
    for calls["n"], frames in enumerate([x[:, :2]] + [x[:, i : i + 1] for i in range(2, x.shape[1])]):
        outs.append(full_model(frames, num_frame_for_scale=2, trace=trace if calls["n"] == 1 else None))
    full_model.clean_kv_cache()
    assert compared == wanted, f"intermediates never traced: {sorted(wanted - compared)[:5]}"
    out = {k: torch.cat([o[k] for o in outs], dim=1) for k in ("pose_enc", "depth", "depth_conf")}
    assert_outputs_close(out, ref)
    fi, _ = golden_case("full_stream_plain_fi")
    assert_outputs_close(out, fi)


def test_keyframes_follow_flashinfer_semantics(full_model):
    ref, meta = golden_case("full_stream_kf_fi")
    out = stream(full_model, golden_images(ref), keyframe_interval=2)
    assert_outputs_close(out, ref)
    nopersist, _ = golden_case("full_stream_kf_nopersist")
    assert_outputs_close(out, nopersist)


def test_sliding_window_eviction(full_model):
    ref, meta = golden_case("full_stream_evict")
    out = stream(full_model, golden_images(ref), cache=cache_config_of(meta))
    assert_outputs_close(out, ref)


def test_isolation_and_stale_cache(full_model):
    ref, meta = golden_case("full_isolation")
    a, b = golden_images(ref, "A_images_u8"), golden_images(ref, "B_images_u8")
    full_model.inference_streaming(a, num_scale_frames=2)
    after_a = full_model.inference_streaming(b, num_scale_frames=2)
    assert_outputs_close(after_a, ref, prefix="B.")
    full_model.clean_kv_cache()
    forward_sequence(full_model, a, 2)
    stale = forward_sequence(full_model, b, 2)
    full_model.clean_kv_cache()
    assert_outputs_close(stale, ref, prefix="B_stale.")


def test_windowed(full_model):
    ref, _ = golden_case("full_windowed")
    out = full_model.inference_windowed(
        golden_images(ref), window_size=4, overlap_size=2, num_scale_frames=2, keyframe_interval=1, return_windows=True
    )
    assert_outputs_close(out, ref)
    assert torch.equal(out["frame_type"], ref["frame_type"])
    torch.testing.assert_close(out["chunk_scales"], ref["chunk_scales"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out["chunk_transforms"], ref["chunk_transforms"], rtol=1e-4, atol=1e-4)
    for i, window in enumerate(out["windows"]):
        torch.testing.assert_close(window["pose_enc"], ref[f"window{i}.pose_enc"], rtol=1e-4, atol=1e-4)
