"""Online sessions (tiny preset, CPU): golden parity through step(), lifecycle, isolation,
bounded memory on long streams, interleaving, misuse."""
from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file

import mapstream
from mapstream.cache import shared_pools
from conftest import GOLDEN, golden_case, golden_images
from golden_helpers import assert_outputs_close, cache_config_of
from mapstream.keyframes import FixedInterval, FlowKeyframes
from mapstream.session import SessionClosedError


@pytest.fixture(scope="module")
def model():
    path = GOLDEN / "tiny_weights.safetensors"
    m = mapstream.build_model("tiny").eval()
    if path.exists():
        m.load_state_dict(load_file(str(path)))
    else:
        mapstream.fill_synthetic_(m)
    return m


def stack(preds):
    return {
        "pose_enc": torch.stack([p.pose_enc for p in preds])[None],
        "depth": torch.stack([p.depth for p in preds])[None, ..., None],
        "depth_conf": torch.stack([p.depth_conf for p in preds])[None],
    }


def frames_of(n, h=28, w=42, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, h, w, generator=g)


@pytest.mark.parametrize("case", ["tiny_stream_plain_fi", "tiny_stream_kf_fi", "tiny_stream_evict_kf_fi"])
def test_step_by_step_matches_golden(model, case):
    ref, meta = golden_case(case)
    kf = 2 if "kf" in case else 1
    with model.session(num_scale_frames=2, keyframe_interval=kf, **cache_config_of(meta), precision="fp32") as s:
        preds = []
        for i, frame in enumerate(golden_images(ref)):
            got = s.step(frame, name=f"f{i}")
            assert len(got) == (0 if i == 0 else 2 if i == 1 else 1)
            preds.extend(got)
    assert [p.index for p in preds] == list(range(len(preds)))
    assert [p.name for p in preds] == [f"f{i}" for i in range(len(preds))]
    assert [p.keyframe for p in preds] == [True, True] + [kf == 1 or (i - 2) % kf == 0 for i in range(2, len(preds))]
    assert_outputs_close(stack(preds), ref)
    torch.testing.assert_close(torch.stack([p.T_cam_world for p in preds])[None], ref["post.extrinsic_c2w"], rtol=1e-4, atol=1e-4) if "post.extrinsic_c2w" in ref else None


def test_run_equals_step(model):
    x = frames_of(7)
    with model.session(num_scale_frames=3, keyframe_interval=2) as a, model.session(num_scale_frames=3, keyframe_interval=2) as b:
        ran = a.run(x)
        stepped = stack(b.run_frames(x))
    for key in ("pose_enc", "depth", "depth_conf"):
        assert torch.equal(ran[key], stepped[key])


def test_short_stream_is_flushed_as_one_scale_block(model):
    x = frames_of(3)
    with model.session(num_scale_frames=8) as s:
        assert s.step(x[0]) == [] and s.step(x[1]) == [] and s.step(x[2]) == []
        preds = s.flush()
    ref = model.inference_streaming(x, num_scale_frames=8)
    assert len(preds) == 3 and all(p.scale_frame for p in preds)
    assert torch.equal(stack(preds)["pose_enc"], ref["pose_enc"])


def test_provisional_predictions_during_the_scale_phase(model):
    x = frames_of(4)
    with model.session(num_scale_frames=3, provisional=True) as s:
        first = s.step(x[0])
        second = s.step(x[1])
        final = s.step(x[2])
        after = s.step(x[3])
    assert [p.provisional for p in first + second] == [True, True]
    assert [p.index for p in first + second] == [0, 1]
    assert [p.provisional for p in final] == [False] * 3
    # A provisional prediction equals the scale phase run on the frames seen so far.
    two = model.inference_streaming(x[:2], num_scale_frames=2)
    torch.testing.assert_close(second[0].pose_enc, two["pose_enc"][0, 1])
    # Provisional work leaves no trace: the stream equals one without it.
    plain = model.inference_streaming(x, num_scale_frames=3)
    assert torch.equal(stack(final + after)["pose_enc"], plain["pose_enc"])


def test_reset_mid_stream_equals_a_fresh_session(model):
    x = frames_of(10)
    with model.session(num_scale_frames=2) as s:
        s.run_frames(x[:5])
        s.reset()
        after_cut = s.run_frames(x[5:])
    with model.session(num_scale_frames=2) as fresh:
        clean = fresh.run_frames(x[5:])
    for a, b in zip(after_cut, clean):
        assert torch.equal(a.pose_enc, b.pose_enc) and torch.equal(a.depth, b.depth)
    assert [p.index for p in after_cut] == list(range(5))


def test_clean_kv_cache_gives_fresh_model_outputs_bit_for_bit(model):
    x, y = frames_of(5, seed=1), frames_of(6, seed=2)
    fresh = mapstream.build_model("tiny").eval()
    fresh.load_state_dict(model.state_dict())
    want = fresh.inference_streaming(y, num_scale_frames=2)
    model.inference_streaming(x, num_scale_frames=2)
    got = model.inference_streaming(y, num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        assert torch.equal(got[key], want[key])
    # Low level: the stale cache is detectable, and gone after clean_kv_cache().
    model.clean_kv_cache()
    model(x[None, :2], num_frame_for_scale=2)
    stale = model(y[None, :2], num_frame_for_scale=2)
    model.clean_kv_cache()
    clean = model(y[None, :2], num_frame_for_scale=2)
    model.clean_kv_cache()
    assert not torch.allclose(stale["pose_enc"], clean["pose_enc"], atol=1e-3)
    assert torch.equal(clean["pose_enc"], want["pose_enc"][:, :2])



@pytest.mark.parametrize("keyframe", [True, False], ids=["stored", "unstored"])
@pytest.mark.parametrize("where", ["camera_head", "depth_head"])
def test_a_step_failing_after_the_aggregator_never_leaves_the_caches_apart(model, monkeypatch, where, keyframe):
    """A forward that raises after the aggregator's cache took its part (in the camera head,
    between the two caches; in the depth head, after both) must not be silently continued:
    had it stored its frame, the two caches (or the caller, who got no output) would
    disagree from then on, so both refuse further steps until clean_kv_cache. An unstored
    frame leaves both as they were, and the next frame gets what it gets without the
    failure. The same holds for a session, until its reset."""
    from mapstream.cache import CacheStateError

    x = frames_of(5, seed=3)
    state = model.default_state

    def fail(*args, **kwargs):
        raise KeyboardInterrupt(f"interrupted in the {where}")

    model.clean_kv_cache()
    model(x[None, :2], num_frame_for_scale=2)
    want_next = model(x[None, 3:4], num_frame_for_scale=2, keyframe=True)
    model.clean_kv_cache()
    model(x[None, :2], num_frame_for_scale=2)
    before = (state.aggregator.visible_frames(), state.camera.visible_frames())
    with monkeypatch.context() as m:
        m.setattr(getattr(model, where), "forward", fail)
        with pytest.raises(KeyboardInterrupt):
            model(x[None, 2:3], num_frame_for_scale=2, keyframe=keyframe)
    if keyframe:
        for _ in range(2):  # and it keeps refusing
            with pytest.raises(CacheStateError, match="failed part-way"):
                model(x[None, 3:4], num_frame_for_scale=2)
    else:
        assert (state.aggregator.visible_frames(), state.camera.visible_frames()) == before
        got = model(x[None, 3:4], num_frame_for_scale=2, keyframe=True)
        assert torch.equal(got["pose_enc"], want_next["pose_enc"]) and torch.equal(got["depth"], want_next["depth"])
    model.clean_kv_cache()
    fresh = model(x[None, :2], num_frame_for_scale=2)
    model.clean_kv_cache()
    assert torch.equal(fresh["pose_enc"], model(x[None, :2], num_frame_for_scale=2)["pose_enc"])
    model.clean_kv_cache()

    with model.session(num_scale_frames=2, keyframe_interval=1 if keyframe else 2) as session:
        session.run_frames(x[:3])  # scale frames 0-1, frame 2 stored either way
        with monkeypatch.context() as m:
            m.setattr(getattr(model, where), "forward", fail)
            with pytest.raises(KeyboardInterrupt):
                session.step(x[3])  # stored with interval 1, not with 2
        if keyframe:
            with pytest.raises(CacheStateError, match="failed part-way"):
                session.step(x[4])
            session.reset()
            assert [p.index for p in session.run_frames(x[:3])] == [0, 1, 2]
        else:
            assert session.step(x[4])[0].index == 3


def test_the_reference_cache_manager_names_reach_the_default_cache(model):
    """Code written against the reference resets `aggregator.kv_cache_manager` (a
    `FlashInferKVCacheManager`) and reads its `num_frames`; here they are the default cache."""
    from mapstream.cache import FlashInferKVCacheManager, StreamCacheManager

    assert FlashInferKVCacheManager is StreamCacheManager
    manager = model.aggregator.kv_cache_manager
    assert manager is model.default_state.aggregator and isinstance(manager, FlashInferKVCacheManager)
    model.clean_kv_cache()
    x = frames_of(4, seed=9)
    model(x[None, :2], num_frame_for_scale=2)
    model(x[None, 2:3], num_frame_for_scale=2)
    assert manager.num_frames == manager.frames_stored == 3
    manager.reset()
    assert manager.num_frames == 0 and manager.visible_frames() == {"anchors": [], "window": [], "trajectory": []}
    # The reference discards its manager to change resolution: here that releases the pages.
    model(x[None, :2], num_frame_for_scale=2)
    model.aggregator.kv_cache_manager = None
    assert manager.num_frames == 0 and manager.pool is None
    bigger = torch.rand(1, 2, 3, 42, 56)
    want = model.inference_streaming(bigger, num_scale_frames=2)
    model.clean_kv_cache()
    got = model(bigger, num_frame_for_scale=2)
    assert torch.equal(got["pose_enc"], want["pose_enc"])
    with pytest.raises(TypeError, match="only be set to None"):
        model.aggregator.kv_cache_manager = manager
    model.clean_kv_cache()


def test_inference_streaming_leaves_no_cache_behind(model):
    model.inference_streaming(frames_of(5), num_scale_frames=2)
    state = model.default_state
    assert state.aggregator.frames_stored == 0 and state.aggregator.slots_in_use == 0
    assert state.camera.frames_stored == 0


def test_interleaved_sessions_give_their_solo_outputs(model):
    a_frames, b_frames = frames_of(9, seed=3), frames_of(9, seed=4)
    with model.session(num_scale_frames=2) as a, model.session(num_scale_frames=3, keyframe_interval=2) as b:
        got_a, got_b = [], []
        for fa, fb in zip(a_frames, b_frames):
            got_a += a.step(fa)
            got_b += b.step(fb)
        # Both sessions lease pages from the model's shared pool.
        pool = a.state.aggregator.pool
        assert pool is b.state.aggregator.pool
        leased = [x.stats()["aggregator"] for x in (a, b)]
        assert pool.stats().pages_in_use >= sum(st.pages_in_use + st.pages_free for st in leased)
    solo_a = model.inference_streaming(a_frames, num_scale_frames=2)
    solo_b = model.inference_streaming(b_frames, num_scale_frames=3, keyframe_interval=2)
    assert torch.equal(stack(got_a)["pose_enc"], solo_a["pose_enc"])
    assert torch.equal(stack(got_b)["depth"], solo_b["depth"])


def test_memory_is_flat_over_3000_frames(model):
    cache = dict(cache_scale_frames=2, sliding_window=4, trajectory_capacity=32)
    frames = frames_of(16, h=14, w=14, seed=5)
    with model.session(num_scale_frames=2, **cache) as s:
        held = None
        for i in range(3000):
            s.step(frames[i % 16])
            if i == 100:
                held = (s.stats()["aggregator"].bytes_held, s.stats()["camera"].bytes_held, shared_pools().pools()[0].stats().bytes_total)
            if i > 100 and i % 250 == 0:
                st = s.stats()
                assert (st["aggregator"].bytes_held, st["camera"].bytes_held, shared_pools().pools()[0].stats().bytes_total) == held
                assert st["aggregator"].trajectory_frames <= 32 and st["camera"].trajectory_frames <= 32
        assert s.stats()["aggregator"].frames_stored == 3000


def test_fifty_sequences_hold_no_more_memory_than_one(model):
    frames = frames_of(12, h=14, w=28, seed=6)
    sizes = set()
    with model.session(num_scale_frames=2) as s:
        for seq in range(50):
            s.reset()
            s.run_frames(frames[: 3 + seq % 9])
            sizes.add(tuple(p.stats().bytes_total for p in shared_pools().pools()))
    assert len(sizes) == 1
    model.free_kv_cache()


def test_close_returns_pages_and_further_steps_fail(model):
    model.free_kv_cache()
    s = model.session(num_scale_frames=1)
    s.step(frames_of(1)[0])
    pools = shared_pools().pools()
    assert sum(p.stats().pages_in_use for p in pools) > 0
    s.close()
    assert sum(p.stats().pages_in_use for p in pools) == 0
    with pytest.raises(SessionClosedError):
        s.step(frames_of(1)[0])
    assert model.free_kv_cache() > 0


def test_a_session_dropped_without_close_gives_its_pages_back(model):
    """Sessions nobody closed (an exception, a forgotten `with`) return their pages once they
    are collected: five dropped sessions hold nothing, and free_kv_cache hands the memory back."""
    import gc

    model.free_kv_cache()
    pools = shared_pools().pools
    for seed in range(5):
        s = model.session(num_scale_frames=1)
        s.step(frames_of(1, seed=seed)[0])
        assert sum(p.stats().pages_in_use for p in pools()) > 0
        del s
        gc.collect()
        assert sum(p.stats().pages_in_use for p in pools()) == 0
    assert model.free_kv_cache() > 0
    assert sum(p.stats().bytes_total for p in pools()) == 0


def test_run_after_buffered_steps_returns_every_predicted_frames_image(model):
    """Frames `step` buffered for the scale phase are predicted by the next `run`: its images
    start with them, one image a prediction, in order."""
    frames = frames_of(5, seed=4)
    with model.session(num_scale_frames=3) as s:
        assert s.step(frames[0]) == []
        out = s.run(frames[1:])
    assert out["images"].shape[1] == out["depth"].shape[1] == out["pose_enc"].shape[1] == 5
    assert torch.equal(out["images"][0].cpu(), frames)


def test_misuse_is_a_clear_error(model):
    with model.session(num_scale_frames=2) as s:
        s.run_frames(frames_of(3))
        with pytest.raises((ValueError, RuntimeError), match="reset"):
            s.step(torch.rand(3, 14, 28))  # another resolution mid-sequence
        s.reset()
        s.step(torch.rand(3, 14, 28))  # fine after a reset
        s.step(torch.rand(3, 14, 28))  # the scale phase ran at 14 x 28
        with pytest.raises(ValueError, match=r"frame of size \(28, 14\) differs from the sequence's \(14, 28\)"):
            s.step(torch.rand(3, 28, 14))  # as many patches, another grid: refused too
        with pytest.raises(ValueError, match="differs from the sequence's"):
            s.run(torch.rand(2, 3, 28, 14))
        with pytest.raises(ValueError, match="one frame"):
            s.step(torch.rand(2, 3, 14, 28))
        with pytest.raises(ValueError, match="\\[0, 1\\]"):
            s.step(torch.rand(3, 14, 28) * 255)
    with pytest.raises(ValueError, match="batch 2"):
        model.session().run(torch.rand(2, 3, 3, 14, 28))
    with pytest.raises(ValueError, match="either"):
        model.session(sliding_window=8, state=model.new_state())


def test_after_a_reset_a_frame_of_the_last_sequences_size_is_refused_cleanly(model):
    """The frame size a session accepted belongs to its sequence: after reset() a frame of the
    previous sequence's size gets the same clear error as in a fresh session (not a cache
    failure part-way through the step), and the stream goes on as a fresh one would."""
    landscape, portrait = frames_of(3, 28, 42, seed=1), frames_of(3, 42, 28, seed=2)
    with model.session(num_scale_frames=2) as fresh:
        want = fresh.run_frames(portrait)
    with model.session(num_scale_frames=2) as s:
        s.run_frames(landscape)
        s.reset()
        got = s.step(portrait[0]) + s.step(portrait[1])
        with pytest.raises(ValueError, match=r"frame of size \(28, 42\) differs from the sequence's \(42, 28\)"):
            s.step(landscape[2])
        got += s.step(portrait[2])
    assert [p.index for p in got] == [p.index for p in want] == [0, 1, 2]
    for a, b in zip(got, want):
        assert torch.equal(a.pose_enc, b.pose_enc) and torch.equal(a.depth, b.depth)


def test_a_resize_overshoot_is_used_as_it_is_and_other_scales_are_refused(model, caplog, monkeypatch):
    """A bicubic resize of frames in [0, 1] overshoots them a little near edges: such frames
    run unchanged (said once), as in the reference; 0-255 data, [-1, 1] data and mean/std
    normalized frames are refused with what to do."""
    import torch.nn.functional as F

    from mapstream import validation

    monkeypatch.setattr(validation, "_told_overshoot", False)
    x = frames_of(3, seed=5)
    edges = torch.zeros_like(x)
    edges[..., x.shape[-1] // 2:] = 1.0
    resized = F.interpolate(torch.cat([x, edges])[:, :, ::2, ::2], size=x.shape[-2:], mode="bicubic")
    lo, hi = float(resized.min()), float(resized.max())
    assert lo < 0 and hi > 1 and -validation.OVERSHOOT < lo and hi < 1 + validation.OVERSHOOT
    with caplog.at_level(logging.WARNING, logger="mapstream.validation"):
        got = model.inference_streaming(resized, num_scale_frames=2)
        model.inference_streaming(resized, num_scale_frames=2)
    assert [r.message.count("beyond [0, 1]") for r in caplog.records] == [1]
    assert torch.equal(got["images"][0], resized)  # used as given: not clamped
    for bad in (x * 255, x * 2 - 1, (x - 0.45) / 0.225):
        with pytest.raises(ValueError, match=r"must lie in \[0, 1\] \(up to 0.25 beyond.*divide 0-255 data by 255"):
            model.inference_streaming(bad, num_scale_frames=2)


def test_a_batch_of_sequences_equals_each_sequence_streamed_alone(model):
    """[B, S, 3, H, W] is B independent sequences (the reference takes batch 1 only,
    LIMITS.md 14): each gets exactly what it gets alone, and no cache is left behind."""
    x = torch.stack([frames_of(6, seed=s) for s in (1, 2, 3)])
    together = model.inference_streaming(x, num_scale_frames=2, keyframe_interval=2)
    assert together["pose_enc"].shape[:2] == (3, 6) and together["images"].shape == x.shape
    for b in range(3):
        alone = model.inference_streaming(x[b], num_scale_frames=2, keyframe_interval=2)
        assert set(alone) == set(together)
        for key, value in alone.items():
            assert torch.equal(together[key][b : b + 1], value), key
    assert model.default_state.aggregator.frames_stored == 0


def test_keyframe_overrides_take_booleans_only_and_scale_frames_are_always_stored(model, caplog):
    """A string such as "False" is truthy: it is refused before the session changes, rather
    than stored as a keyframe. NumPy and 0-d torch booleans and 0/1 are taken. keyframe=False
    in the scale phase is overridden (scale frames are always stored), with one warning."""
    import numpy as np

    x = frames_of(4, seed=21)
    with model.session(num_scale_frames=2) as s:
        with pytest.raises(TypeError, match="keyframe must be True, False or None .*'False'"):
            s.step(x[0], keyframe="False")
        with caplog.at_level(logging.WARNING, logger="mapstream.session"):
            assert s.step(x[0], keyframe=False) == []
            preds = s.step(x[1], keyframe=np.bool_(False))
        assert [(p.index, p.keyframe) for p in preds] == [(0, True), (1, True)]
        assert caplog.text.count("scale frames are always stored") == 1
        (p2,) = s.step(x[2], keyframe=torch.tensor(False))
        (p3,) = s.step(x[3], keyframe=1)
        assert (p2.keyframe, p3.keyframe) == (False, True) and s.state.aggregator.frames_stored == 3
    with pytest.raises(TypeError, match="keyframe must be True, False or None .*'no'"):
        model(x[None, :1], keyframe="no")
    with pytest.raises(TypeError, match="True or False for a forward call"):
        model(x[None, :1], keyframe=None)
    assert model.default_state.frames_stored == 0
    a, b = model.session(num_scale_frames=1), model.session(num_scale_frames=1)
    with pytest.raises(TypeError, match="keyframes: keyframe must be"):
        mapstream.step_together([a, b], [x[0], x[1]], keyframes=[None, "yes"])
    assert a.in_scale_phase and b.in_scale_phase
    a.close(), b.close()


def test_auto_keyframes_need_no_frame_count(model):
    x = frames_of(12, seed=7)
    policy = FlowKeyframes(threshold=1e9, max_gap=4)  # store only on the gap rule
    with model.session(num_scale_frames=2, keyframe_interval=policy) as s:
        preds = s.run_frames(x)
    assert [p.keyframe for p in preds] == [True, True, True, False, False, False, True, False, False, False, True, False]
    # Decide-after-seeing stores a frame exactly like storing it up front (window not full).
    fixed = FixedInterval(4)
    with model.session(num_scale_frames=2, keyframe_interval=fixed) as s:
        ref = s.run_frames(x)
    for a, b in zip(preds, ref):
        assert a.keyframe == b.keyframe
        torch.testing.assert_close(a.pose_enc, b.pose_enc)
    with model.session(num_scale_frames=2, keyframe_interval="auto") as s:
        auto = s.run_frames(x)
    assert auto[2].keyframe and all(torch.isfinite(p.pose_enc).all() for p in auto)


def test_compiled_model_computes_the_same_function():
    from mapstream.geometry import camera_matrices
    from mapstream.models.compile import CompileOptions

    plain = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    # Dynamo tracing only (the "eager" backend): fast, exercises the wiring.
    compiled = mapstream.build_model("tiny", compile=CompileOptions(backend="eager", heads=True)).eval()
    assert list(compiled.state_dict()) == list(plain.state_dict())  # built compiled, same checkpoint keys
    compiled.load_state_dict(plain.state_dict())
    x = frames_of(5, seed=12)
    a = plain.inference_streaming(x, num_scale_frames=2)
    b = compiled.inference_streaming(x, num_scale_frames=2)
    torch.testing.assert_close(a["pose_enc"], b["pose_enc"])
    torch.testing.assert_close(a["depth"], b["depth"])
    # The graphed decompositions (eager on the CPU) run the compiled between-layers function.
    for fast in (True, "whole"):
        with compiled.session(num_scale_frames=2, fast=fast) as s:
            got = s.run_frames(x)
        for j, pred in enumerate(got):
            torch.testing.assert_close(pred.pose_enc, a["pose_enc"][0, j])
            torch.testing.assert_close(pred.depth, a["depth"][0, j, ..., 0])
            T_world_cam, T_cam_world, K = camera_matrices(a["pose_enc"][0, j], a["depth"].shape[2:4])
            for have, want in ((pred.T_world_cam, T_world_cam), (pred.T_cam_world, T_cam_world), (pred.K, K)):
                torch.testing.assert_close(have, want)


@pytest.mark.parametrize("mode", [None, "max-autotune"])
def test_a_compiled_network_asks_inductor_for_unpadded_products_in_every_mode(monkeypatch, mode):
    """Inductor's shape padding copies the inputs of two products a block (978 -> 984 rows);
    a compiled network turns it off and keeps the rest of the mode's options (torch.compile
    takes options or a mode, not both). Other backends get the mode as given."""
    import torch._inductor

    from mapstream.models.compile import CompileOptions

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    mapstream.build_model("tiny", compile=CompileOptions(mode=mode))
    assert calls and all(set(kw) == {"backend", "options", "dynamic"} for kw in calls), calls
    want = {**(torch._inductor.list_mode_options(mode) if mode else {}), "shape_padding": False}
    assert all(kw["options"] == want and kw["backend"] == "inductor" for kw in calls), calls
    calls.clear()
    mapstream.build_model("tiny", compile=CompileOptions(backend="eager", mode=mode, shape_padding=True))
    assert calls and all(kw == {"backend": "eager", "mode": mode, "dynamic": False} for kw in calls), calls


def test_conv_search_turns_cudnn_benchmark_on_only_inside_and_never_for_deterministic_runs(monkeypatch):
    from mapstream.fast.piece import conv_search as _conv_search

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    with _conv_search(True):
        assert torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.benchmark
    with pytest.raises(KeyError), _conv_search(True):
        raise KeyError("restored on the way out of an error too")
    assert not torch.backends.cudnn.benchmark
    with _conv_search(False):
        assert not torch.backends.cudnn.benchmark
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    with _conv_search(True):
        assert not torch.backends.cudnn.benchmark


@pytest.mark.parametrize("whole", [False, True], ids=["pieces", "whole-step"])
@pytest.mark.parametrize("kf", [1, 2, "auto"])
def test_fast_path_computes_the_same_function(model, kf, whole):
    """Both graph decompositions (run eagerly on the CPU) equal the plain forward, through
    window eviction, trajectory thinning and unstored frames, also when the keyframe policy
    decides after seeing the prediction ("auto": the step's frame is promoted afterwards).
    The whole-step mode reads write offsets and key ranges from device tensors (masked SDPA
    here)."""
    x = frames_of(16, seed=13)
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
    with model.session(num_scale_frames=2, keyframe_interval=kf, **cache) as plain:
        want = plain.run_frames(x)
        want_stats = plain.state.aggregator.stats(), plain.state.camera.stats()
    with model.session(num_scale_frames=2, keyframe_interval=kf, **cache, fast="whole" if whole else True) as fast:
        got = fast.run_frames(x)
        (graphed,) = fast._graphed.values()  # the decomposition was used
        assert graphed.whole == whole
        assert graphed._whole.piece is not None if whole else len(graphed._outputs) == model.config.depth + 1
        assert (fast.state.aggregator.stats(), fast.state.camera.stats()) == want_stats
        assert want_stats[0].trajectory_frames >= 3  # thinning happened (capacity 4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-5, atol=1e-6)
        assert a.keyframe == b.keyframe


@pytest.mark.parametrize("fast", [True, "whole"])
@pytest.mark.parametrize("scale, frames", [(1, 5), (3, 1)], ids=["one-scale-frame", "one-frame-stream"])
def test_a_scale_phase_of_one_frame_never_takes_the_graphs(model, fast, scale, frames):
    """A scale phase of a single frame (num_scale_frames=1, or a stream of one frame flushed)
    is one frame like a streaming step, but it takes the scale frames' tokens: it must run the
    plain forward, not the graphs built for the frames after it (which once produced another
    first prediction and a wrongly stored first frame). `step`, `run_frames` and `run` alike."""
    x = frames_of(frames, seed=19)
    cache = dict(cache_scale_frames=scale, sliding_window=2, trajectory_capacity=2)
    with model.session(num_scale_frames=scale, **cache) as plain:
        want = plain.run_frames(x)
    with model.session(num_scale_frames=scale, **cache, fast=fast) as s:
        got = s.run_frames(x)
        s.reset()
        stacked = s.run(x)
    assert len(got) == len(want) == frames
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stacked["pose_enc"][0, i], b.pose_enc, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("whole", [False, True], ids=["pieces", "whole-step"])
def test_graphed_steps_launch_the_first_graph_before_planning_the_cache_step(model, monkeypatch, whole):
    """Graph 0 (embedding, frame block 0, global block 0's q/k/v) reads no cache, so a
    single-frame step launches it before the host plans the aggregator's cache step: on a
    GPU the frame is embedded while the host works. The step's copies (window eviction)
    still run before its first attention (pieces) or the graph of the rest (whole step)."""
    from mapstream.cache import Step, StreamCacheManager
    from mapstream.fast import piece as graphs

    events = []
    piece_call, begin, moves, attend = graphs.Piece.__call__, StreamCacheManager.begin_step, Step.apply_moves, Step.attend

    def logged(name, fn):
        def wrapper(self, *args, **kwargs):
            events.append(name(self))
            return fn(self, *args, **kwargs)
        return wrapper

    with model.session(num_scale_frames=2, fast="whole" if whole else True) as s:
        for frame in frames_of(3, seed=5):  # the scale phase and one graphed step
            s.step(frame)
        first_piece = s._graphed[(28, 42)]._first_piece
        monkeypatch.setattr(graphs.Piece, "__call__", logged(lambda p: "piece 0" if p is first_piece else "piece", piece_call))
        monkeypatch.setattr(StreamCacheManager, "begin_step", logged(lambda m: f"begin {m.name}", begin))
        monkeypatch.setattr(Step, "apply_moves", logged(lambda st: f"moves {st.manager.name}", moves))
        monkeypatch.setattr(Step, "attend", logged(lambda st: "attend", attend))
        s.step(frames_of(1, seed=6)[0])
    if whole:  # both caches' steps planned, then their copies queued (beside graph 0 on a GPU), then the rest
        assert events == ["piece 0", "begin aggregator", "begin camera_head", "moves aggregator", "moves camera_head", "piece"], events
    else:
        assert events[:4] == ["piece 0", "begin aggregator", "moves aggregator", "attend"], events[:6]


def test_a_frame_failing_the_value_check_is_rejected_after_the_first_graph_without_touching_the_session(model, monkeypatch):
    """A graphed step launches its first graph (no cache read) before the frame's value
    check answers; a NaN or out-of-range frame is then rejected with the check's error, and
    the session goes on exactly as a twin that never saw it (same indices, same outputs)."""
    from mapstream.fast import piece as graphs
    from mapstream.validation import ValueCheck

    good = frames_of(5, seed=8)
    nan = good[3].clone()
    nan[1, 2, 3] = float("nan")
    bright = good[3] * 2 + 0.5
    with model.session(num_scale_frames=2, fast=True) as s, model.session(num_scale_frames=2, fast=True) as twin:
        for frame in good[:3]:
            s.step(frame)
            twin.step(frame)
        events = []
        piece_call, wait = graphs.Piece.__call__, ValueCheck.wait
        first_piece = s._graphed[(28, 42)].pieces[0]

        def logged_piece(self):
            if self is first_piece:
                events.append("piece 0")
            return piece_call(self)

        def logged_wait(self):
            events.append("value check")
            return wait(self)

        monkeypatch.setattr(graphs.Piece, "__call__", logged_piece)
        monkeypatch.setattr(ValueCheck, "wait", logged_wait)
        with pytest.raises(ValueError, match="NaN"):
            s.step(nan)
        assert events == ["piece 0", "value check"]
        with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
            s.step(bright)
        for frame in good[3:]:
            (a,), (b,) = s.step(frame), twin.step(frame)
            assert a.index == b.index
            assert torch.equal(a.pose_enc, b.pose_enc) and torch.equal(a.depth, b.depth)


def test_a_started_graphed_step_runs_once_and_only_with_its_own_frame(model):
    with model.session(num_scale_frames=2, fast=True) as s:
        for frame in frames_of(2, seed=9):
            s.step(frame)
        graphed = s._graphs_for(frames_of(1, seed=9)[None])
        frame = frames_of(1, seed=10)[None]
        started = graphed.start(frame, s.state)
        with pytest.raises(ValueError, match="finishes with its own frame"):
            started(frame[..., :14, :], s.state, store=True, backend=model.attention_backend(frame.device, frame.dtype))
        out = started(frame, s.state, store=True, backend=model.attention_backend(frame.device, frame.dtype))
        assert torch.isfinite(out["depth"]).all()
        with pytest.raises(RuntimeError, match="already run"):
            started(frame, s.state, store=True, backend=model.attention_backend(frame.device, frame.dtype))


def test_frames_without_pixels_or_with_channels_last_are_told_what_is_wrong(model):
    from mapstream.validation import check_images

    with pytest.raises(ValueError, match=r"no pixels: size 0x42"):
        check_images(torch.rand(2, 3, 0, 42), 14)
    with pytest.raises(ValueError, match=r"channels last \(\[\.\.\., H, W, 3\]\)\? move them: x.movedim\(-1, -3\)"):
        check_images(torch.rand(2, 28, 42, 3), 14)
    with pytest.raises(ValueError, match=r"got 1 \(shape \[1, 2, 1, 28, 42\]\)$"):  # no hint where none fits
        check_images(torch.rand(2, 1, 28, 42), 14)


def test_a_frame_unlike_the_last_accepted_one_is_checked_in_full_after_the_scale_phase(model):
    """After the scale phase a frame with the shape, dtype and device of the last accepted one
    skips the shape checks (the step's start is GPU idle time); any other frame is checked in
    full and refused with the check's message, the session untouched."""
    x = frames_of(4, seed=14)
    with model.session(num_scale_frames=2, fast=True) as s:
        for frame in x[:3]:
            s.step(frame)
        with pytest.raises(ValueError, match="floating point"):
            s.step((x[3] * 255).to(torch.uint8))
        with pytest.raises(ValueError, match="3 \\(RGB\\) channels"):
            s.step(x[3, :2])
        with pytest.raises(TypeError, match="torch.Tensor"):
            s.step(x[3].numpy())
        with pytest.raises(ValueError, match="one frame"):
            s.step(x[2:4])
        (pred,) = s.step(x[3].permute(0, 2, 1).contiguous().permute(0, 2, 1))  # same frame, other strides
        assert pred.index == 3
    with model.session(num_scale_frames=2, fast=True) as twin:
        want = twin.run_frames(x)[-1]
    assert torch.equal(pred.pose_enc, want.pose_enc) and torch.equal(pred.depth, want.depth)


@pytest.mark.parametrize("whole", [False, True], ids=["pieces", "whole-step"])
def test_graphed_steps_after_a_reset_see_the_new_sequence_time(model, whole):
    """The first graph's time index (3D RoPE) is set for the next frame at the end of each
    step and again at the start where a reset or a later keyframe decision changed it: a
    sequence replayed after a reset equals the first pass, and the plain forward, frame for
    frame (keyframes every second frame, so that frames seen and stored differ)."""
    x = frames_of(7, seed=17)
    with model.session(num_scale_frames=2, keyframe_interval=2) as plain:
        want = plain.run_frames(x)
    with model.session(num_scale_frames=2, keyframe_interval=2, fast="whole" if whole else "pieces") as s:
        first = s.run_frames(x)
        s.reset()
        second = s.run_frames(x[:5])
    for got in (first, second):
        for a, b in zip(got, want):
            torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.depth, b.depth, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sessions_enter_autocast_without_its_cast_cache(precision):
    """A CUDA graph captured inside a caching autocast reads its cached weight casts after the
    context has freed them (the GPU test `test_graphs_of_fp32_weights_under_bf16_autocast_read_live_casts`
    shows the crash): the sessions' autocast keeps no cache. Checked here on any machine."""
    import warnings

    from mapstream.session import _autocast

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available ... disabling autocast" on a CPU machine
        with _autocast(torch.device("cuda"), precision):
            assert not torch.is_autocast_cache_enabled()
    assert torch.is_autocast_cache_enabled()  # the default again outside


def test_cast_for_inference_lays_dense_head_weights_out_channels_last_without_changing_outputs():
    plain = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    cast = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval().cast_for_inference("fp32")
    conv = cast.depth_head.scratch.output_conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert cast.state_dict().keys() == plain.state_dict().keys()
    x = frames_of(4, seed=21)
    a = plain.inference_streaming(x, num_scale_frames=2)
    b = cast.inference_streaming(x, num_scale_frames=2)
    torch.testing.assert_close(b["depth"], a["depth"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b["depth_conf"], a["depth_conf"], rtol=1e-5, atol=1e-6)


def test_heads_in_bf16_compute_in_bf16_and_stay_close_to_fp32_heads():
    """Heads cast to bf16 (what cast_for_inference(..., heads=True) does to them) compute in
    bf16, their camera cache included; outputs stay fp32 and within bf16 rounding of the fp32
    heads; the pieces decomposition (whose camera head reads its cache through a
    DeviceStep) agrees with the plain forward to bf16 rounding."""
    cast = mapstream.build_model("tiny").cast_for_inference("bf16", heads=True)
    assert {p.dtype for p in cast.parameters()} == {torch.bfloat16} and cast.head_dtype == torch.bfloat16
    assert mapstream.build_model("tiny").cast_for_inference("bf16").head_dtype == torch.float32
    fp32 = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    half = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    for head in half._head_modules():  # bf16 heads, fp32 aggregator: runs on the CPU
        head.to(torch.bfloat16)
    x = frames_of(7, seed=31)
    want = fp32.inference_streaming(x, num_scale_frames=2)
    with half.session(num_scale_frames=2) as s:
        got = s.run_frames(x)
        assert s.state.camera._key.dtype == torch.bfloat16  # the camera cache holds bf16 keys
    with half.session(num_scale_frames=2, fast=True) as s:
        got_fast = s.run_frames(x)
    for i, (a, b) in enumerate(zip(got, got_fast)):
        assert a.pose_enc.dtype == a.depth.dtype == b.depth.dtype == torch.float32
        assert float((b.pose_enc - a.pose_enc).norm() / a.pose_enc.norm()) < 3e-2
        torch.testing.assert_close(b.depth, a.depth, rtol=1e-5, atol=1e-6)  # the same DPT code
        rel_pose = float((a.pose_enc - want["pose_enc"][0, i]).norm() / want["pose_enc"][0, i].norm())
        rel_depth = float((a.depth - want["depth"][0, i, ..., 0]).norm() / want["depth"][0, i].norm())
        assert 0 < rel_pose < 5e-2 and 0 < rel_depth < 5e-2, (i, rel_pose, rel_depth)


def test_fast_mode_is_validated(model):
    with pytest.raises(ValueError, match="fast must be False, True, 'auto', 'pieces' or 'whole', got 'graphs'"):
        model.session(fast="graphs")


def test_dpt_position_embeddings_are_kept_per_frame_size_and_bounded():
    from mapstream.heads.dpt import dpt_position_embedding

    head = mapstream.build_model("tiny").depth_head
    like = torch.zeros(1, dtype=torch.float64)
    first = head._position(16, 4, 6, 1.5, like)
    assert head._position(16, 4, 6, 1.5, like) is first  # computed once
    torch.testing.assert_close(first, dpt_position_embedding(16, 4, 6, 1.5, like.device).double())
    for rows in range(5, 40):  # a stream of ever-new sizes
        head._position(16, rows, 6, 1.5, like)
    assert len(head._positions) <= 20


def test_whole_step_follows_the_cache_when_its_storage_moves(model):
    """An uncapped trajectory memory moves to a larger arena when full; the whole-step path
    must notice (a captured graph would hold the old addresses) and keep computing the
    model's function."""
    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=None)
    x = frames_of(74, h=14, w=28, seed=31)
    with model.session(num_scale_frames=2, **cache) as plain:
        want = plain.run_frames(x)
    keys = []
    with model.session(num_scale_frames=2, **cache, fast="whole") as fast:
        got = []
        for frame in x:
            got += fast.step(frame)
            keys += [g._whole.key for g in fast._graphed.values()]
        assert fast.state.aggregator.stats().trajectory_frames > 64  # grew past the first arena
    storages = {key[0] for key in keys if key is not None}
    assert len(storages) == 2  # one move, followed
    for a, b in zip(got, want):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-5, atol=1e-6)


def test_the_step_copies_go_beside_graph_0_only_when_planning_queued_nothing(model, monkeypatch):
    """On a GPU the step's cache copies run on a second stream beside graph 0, ordered after
    the frame's load only. A step whose planning queued work on the current stream (a new
    arena: the first step, trajectory growth) must keep them there, after that work; every
    other step takes the second stream. Here: which steps took it, against the cache moves."""
    from mapstream.fast.whole import WholeStepGraphs

    cache = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=None)
    beside, entered = [], WholeStepGraphs._beside_first_graph

    def spy(self):
        beside[-1] = True
        return entered(self)

    monkeypatch.setattr(WholeStepGraphs, "_beside_first_graph", spy)
    storages = []
    with model.session(num_scale_frames=2, **cache, fast="whole") as fast:
        for frame in frames_of(74, h=14, w=28, seed=31):
            beside.append(False)
            fast.step(frame)
            run = fast.state.aggregator._run  # none while the scale phase buffers
            storages.append(run.storage.data_ptr() if run is not None else None)
    steps = list(range(2, 74))  # graphed steps: after the scale phase
    moved = {i for i in steps if i == 2 or storages[i] != storages[i - 1]}
    assert len(moved) == 2  # the first graphed step and one growth of the trajectory memory
    assert [i for i in steps if not beside[i]] == sorted(moved)


@pytest.mark.parametrize("fast", [False, True, "whole"], ids=["eager", "pieces", "whole-step"])
def test_cache_attentions_get_their_global_blocks_key_norm_hint(model, monkeypatch, fast):
    """Every aggregator cache attention is handed its global block's key-norm bound (with
    it our Triton kernel fixes each row's softmax reference point in advance), the camera
    head's attentions none. The bounds are read from the k_norm parameters and follow an
    in-place change of them."""
    from mapstream.attention.backend import AttentionBackend
    from mapstream.attention.sdpa import SDPABackend
    from mapstream.layers import layer_norm_bound

    hints = []

    def spy(fn):
        def wrapper(self, *args, key_norm=None, **kwargs):
            hints.append(None if key_norm is None else key_norm.bound)
            return fn(self, *args, key_norm=key_norm, **kwargs)
        return wrapper

    monkeypatch.setattr(SDPABackend, "attend", spy(SDPABackend.attend))
    monkeypatch.setattr(AttentionBackend, "attend_range", spy(AttentionBackend.attend_range))
    blocks = model.aggregator.global_blocks
    depth = len(blocks)

    def aggregator_hints() -> list[list[float]]:
        hints.clear()
        with model.session(num_scale_frames=2, fast=fast) as s:
            s.run_frames(frames_of(4, seed=21))
        assert None in hints  # the camera head's attentions
        given = [h for h in hints if h is not None]
        assert len(given) == depth * 3  # the scale block, then two single frames
        return [given[i : i + depth] for i in range(0, len(given), depth)]

    bounds = [layer_norm_bound(block.attn.k_norm) for block in blocks]
    assert aggregator_hints() == [bounds] * 3
    weight = blocks[1].attn.k_norm.weight
    with torch.no_grad():
        weight.mul_(2.0)
    try:
        doubled = [layer_norm_bound(block.attn.k_norm) for block in blocks]
        assert doubled[1] > bounds[1] and doubled[0] == bounds[0]
        assert aggregator_hints() == [doubled] * 3
    finally:
        with torch.no_grad():
            weight.mul_(0.5)
    assert aggregator_hints() == [bounds] * 3


def test_a_key_norm_hint_that_needed_repairs_is_withdrawn_with_a_warning(model, caplog):
    """A block whose cache attention had to compute rows again (its bound too loose for the
    weights: the backend counts them in the hint's counter) gets no hint from the next step
    on, with a warning; new k_norm weights get a new chance. (On the CPU the counters are
    read at once; on CUDA a step or two later, `tests/gpu`.)"""
    import logging

    hints = model.aggregator.key_norm_hints
    first = model.aggregator.key_norms()
    assert all(h is not None and h.repairs.tolist() == [0] for h in first)
    first[2].repairs.add_(3)  # as the kernel's merge would
    with caplog.at_level(logging.WARNING, logger="mapstream.models.key_norms"):
        later = model.aggregator.key_norms()
    assert later[2] is None and all(h is not None for i, h in enumerate(later) if i != 2)
    assert "global block 2" in caplog.text and "3 row block(s)" in caplog.text
    assert hints.repaired_blocks()[2] == 3
    weight = model.aggregator.global_blocks[2].attn.k_norm.weight
    with torch.no_grad():
        weight.mul_(1.0)  # an in-place write: the bounds and counters start again
    fresh = model.aggregator.key_norms()
    assert all(h is not None for h in fresh) and hints.repaired_blocks() == [0] * len(fresh)


def test_a_deep_copied_model_computes_the_same_and_shares_nothing(model):
    """copy.deepcopy of a model that has run (its key-norm hints have counters): the copy
    predicts the same, has a reference-protocol state of its own and keeps its own hints."""
    import copy

    frames = frames_of(5, seed=31)
    with model.session(num_scale_frames=2) as s:
        want = s.run_frames(frames)
    twin = copy.deepcopy(model)
    assert twin.aggregator.kv_cache_manager is not model.aggregator.kv_cache_manager
    with twin.session(num_scale_frames=2) as s:
        got = s.run_frames(frames)
    for a, b in zip(got, want):
        assert torch.equal(a.pose_enc, b.pose_enc) and torch.equal(a.depth, b.depth)
    twin.aggregator.key_norms()[0].repairs.add_(1)
    assert model.aggregator.key_norm_hints.repaired_blocks()[0] == 0


def test_fast_true_steps_in_pieces_off_cuda_and_the_named_modes_are_kept(model):
    """`Session(fast=True)` chooses the step's decomposition: off CUDA always the pieces (the
    whole step is for backends that read key ranges on a GPU); "pieces" and "whole" are kept
    as asked (tests/gpu covers the choice on CUDA)."""
    modes = {fast: model.session(num_scale_frames=2, fast=fast) for fast in (False, True, "pieces", "whole")}
    assert {fast: s.whole_step for fast, s in modes.items()} == {False: False, True: False, "pieces": False, "whole": True}
    for s in modes.values():
        s.close()


@pytest.mark.parametrize("option, anchors, window, trajectory, tokens", [
    ({}, [0, 1], [6, 7], [2, 3, 4, 5], 6),
    ({"camera_only": True}, [0, 1], [6, 7], [2, 3, 4, 5], 1),
    ({"cross_frame_special": False}, [0, 1], [6, 7], [2, 3, 4, 5], 0),
    ({"include_scale_frames": False}, [], [4, 5, 6, 7], [0, 1, 2, 3], 6),
])
def test_the_reference_retention_options_hold_on_every_backend(model, option, anchors, window, trajectory, tokens):
    """Eight frames with 2 scale frames and a window of 2: what each of the reference's
    kv_cache_* options keeps (docs/ARCHITECTURE.md), in both caches; the trajectory's frames
    leave `tokens` tokens each (all 6 special tokens, the camera token, or none)."""
    cache = dict(cache_scale_frames=2, sliding_window=2, **option)
    with model.session(num_scale_frames=2, **cache) as session:
        session.run_frames(frames_of(8, seed=5))
        for part in (session.state.aggregator, session.state.camera):
            assert part.visible_frames() == {"anchors": anchors, "window": window, "trajectory": trajectory}
        layout = session.state.aggregator.layout
        assert layout.trajectory_tokens == tokens


def test_casting_for_inference_keeps_the_input_normalisation_in_fp32():
    """LIMITS 26: the reference's bf16 cast rounded the ImageNet mean and std (0.485 became
    0.484375), shifting every input. Here the cast reaches weights only: the constants stay
    fp32, so a bf16 model normalises its input exactly as an fp32 one."""
    from mapstream.models.aggregator import _IMAGENET_MEAN, _IMAGENET_STD

    model = mapstream.build_model("tiny").cast_for_inference("bf16")
    agg = model.aggregator
    assert agg._resnet_mean.dtype == agg._resnet_std.dtype == torch.float32
    assert agg._resnet_mean.flatten().tolist() == torch.tensor(_IMAGENET_MEAN).tolist()
    assert agg._resnet_std.flatten().tolist() == torch.tensor(_IMAGENET_STD).tolist()
    assert next(agg.frame_blocks.parameters()).dtype == torch.bfloat16  # the weights were cast


def test_a_whole_sequence_failing_after_a_stored_frames_outputs_are_copied_leaves_the_caches_refusing(model, monkeypatch):
    """`run` takes each frame's step like `step` does: a failure in the copy of a stored
    frame's outputs (to `output_device`), after both caches took the frame, makes them refuse
    further steps until reset, in the scale phase and after it."""
    from mapstream.cache import CacheStateError
    from mapstream.session import Session

    x = frames_of(5, seed=7)
    for failing_call in (1, 3):  # the scale phase's copy, then the second streamed frame's
        calls = {"n": 0}
        real = Session._to_output

        def copy_then_fail(self, out, real=real, calls=calls, failing_call=failing_call):
            calls["n"] += 1
            if calls["n"] == failing_call:
                raise KeyboardInterrupt("interrupted while copying the outputs")
            return real(self, out)

        with model.session(num_scale_frames=2, output_device="cpu") as session:
            with monkeypatch.context() as m:
                m.setattr(Session, "_to_output", copy_then_fail)
                with pytest.raises(KeyboardInterrupt):
                    session.run(x)
            with pytest.raises(CacheStateError, match="failed part-way"):
                session.step(x[4])
            session.reset()
            assert session.run(x)["pose_enc"].shape == (1, 5, 9)


def test_long_library_calls_show_progress_when_asked_and_stay_quiet_in_logs(model, capfd):
    """inference_streaming and inference_windowed take `progress`: True draws a bar counting
    what they do (frames, windows) on stderr; None draws one only on a terminal (pytest's
    captured stderr is not one); False never. Outputs are the same."""
    x = frames_of(6)[None]
    quiet = model.inference_streaming(x, num_scale_frames=2)
    assert capfd.readouterr().err == ""
    shown = model.inference_streaming(x, num_scale_frames=2, progress=True)
    err = capfd.readouterr().err
    assert "streaming" in err and "6/6" in err
    assert torch.equal(quiet["depth"], shown["depth"])
    model.inference_streaming(x, num_scale_frames=2, progress=False)
    assert capfd.readouterr().err == ""

    windowed = model.inference_windowed(x, window_size=4, overlap_size=2, num_scale_frames=2, progress=True)
    err = capfd.readouterr().err
    assert "windows" in err and "2/2" in err and "streaming" not in err  # one bar, over the windows
    assert windowed["depth"].shape[1] == 6


def test_the_reference_flow_arguments_choose_keyframes_by_motion(model):
    """inference_streaming(flow_threshold=t, max_non_keyframe_gap=g) is a session with
    FlowKeyframes(t, g) (the windowed module's form of the reference); 0 is the fixed interval.
    Windowed inference takes the arguments but runs fixed intervals only."""
    from mapstream.keyframes import FlowKeyframes

    x = frames_of(9, seed=31)
    for threshold, gap in ((1e-3, 30), (1e9, 3)):
        got = model.inference_streaming(x, num_scale_frames=2, flow_threshold=threshold, max_non_keyframe_gap=gap)
        with model.session(num_scale_frames=2, keyframe_interval=FlowKeyframes(threshold, gap)) as s:
            want = s.run(x)
        assert torch.equal(got["pose_enc"], want["pose_enc"]) and torch.equal(got["depth"], want["depth"])
    # A threshold no motion reaches stores only the first streaming frame and every 3rd after.
    fixed = model.inference_streaming(x, num_scale_frames=2, keyframe_interval=3)
    torch.testing.assert_close(got["pose_enc"], fixed["pose_enc"])
    plain = model.inference_streaming(x, num_scale_frames=2, flow_threshold=0.0, max_non_keyframe_gap=5)
    assert torch.equal(plain["pose_enc"], model.inference_streaming(x, num_scale_frames=2)["pose_enc"])
    with pytest.raises(ValueError, match="give either keyframe_interval"):
        model.inference_streaming(x, num_scale_frames=2, keyframe_interval=2, flow_threshold=5.0)
    with pytest.raises(ValueError, match="max_gap >= 1"):
        model.inference_streaming(x, num_scale_frames=2, flow_threshold=5.0, max_non_keyframe_gap=0)
    windowed = model.inference_windowed(x, window_size=4, overlap_size=2, num_scale_frames=2, flow_threshold=0.0,
                                        max_non_keyframe_gap=30)
    assert windowed["pose_enc"].shape[1] == 9
    with pytest.raises(ValueError, match="windows are planned from a fixed keyframe interval"):
        model.inference_windowed(x, window_size=4, overlap_size=2, num_scale_frames=2, flow_threshold=5.0)


def test_a_copied_models_reference_protocol_keeps_its_cache_settings():
    """The reference protocol's default caches belong to the model's modules; a deep copy's
    are made on first use with the copy's own stream settings (here a window of 2 frames,
    which a default-settings cache would not evict)."""
    import copy

    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", kv_cache_sliding_window=2)).eval()
    twin = copy.deepcopy(model)
    assert twin.default_state.aggregator.spec == model.default_state.aggregator.spec
    assert twin.default_state.aggregator.spec.window_frames == 2
    assert twin.default_state.aggregator is not model.default_state.aggregator


def test_a_session_keeps_the_graphed_steps_of_at_most_four_frame_sizes(model):
    """A session reset between inputs of ever-new sizes (a fleet worker lends one session to
    many inputs) keeps its graphed steps bounded; a size seen again after the clear is graphed
    anew and predicts as before."""
    from mapstream.session import _GRAPHED_SIZES

    sizes = [(28, 42), (42, 28), (28, 56), (42, 42), (56, 28), (28, 42)]
    with model.session(num_scale_frames=2, fast=True) as s:
        first = None
        for i, (h, w) in enumerate(sizes):
            s.reset()
            outs = [p for frame in frames_of(3, h, w, seed=1) for p in s.step(frame)]
            assert len(s._graphed) <= _GRAPHED_SIZES and (h, w) in s._graphed
            if i == 0:
                first = outs[-1].depth
        assert len(s._graphed) == 2  # cleared when the fifth size came, then (56, 28) and (28, 42) again
        torch.testing.assert_close(outs[-1].depth, first, rtol=0, atol=0)
