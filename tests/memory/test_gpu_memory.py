"""The GPU memory budget: exact weights and cache bytes, the estimate's shape, the order in
which `plan_memory` gives settings up, and its refusal. (The working-memory figures are
checked against measurements on the device: benchmarks/memory_parts.py.)"""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.gpu_memory import GIB, WORKING, MemoryBudgetError, estimate_memory, parse_memory, plan_memory


@pytest.fixture(scope="module")
def tiny():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


@pytest.fixture(scope="module")
def official():
    with torch.device("meta"):  # sizes only: nothing allocated, never run
        return mapstream.build_model("lingbot-map")


@pytest.mark.parametrize("text, want", [
    ("8GB", 8 * GIB), ("8 GiB", 8 * GIB), ("7.5g", int(7.5 * GIB)), ("6000MB", 6000 * 2**20), ("512MiB", 2**29),
    ("2T", 2 * 2**40), (12, 12 * GIB), ("0.5", GIB // 2),
])
def test_parse_memory_counts_powers_of_1024(text, want):
    assert parse_memory(text) == want


@pytest.mark.parametrize("text", ["", "eight GB", "8XB", "-1GB", "0GB", "8 GB extra"])
def test_parse_memory_refuses_what_is_not_an_amount(text):
    with pytest.raises(ValueError, match="GPU memory"):
        parse_memory(text)


@pytest.mark.parametrize("settings", [
    dict(kv_dtype="auto", sliding_window=3, trajectory_capacity=4),
    dict(kv_dtype="fp8", sliding_window=3, trajectory_capacity=4),
    dict(kv_dtype="fp8", sliding_window=5, trajectory_capacity=None),
    dict(kv_dtype="auto", sliding_window=2, trajectory_capacity=6, include_scale_frames=False),
    dict(kv_dtype="auto", sliding_window=2, trajectory_capacity=6, camera_only=True),
    dict(kv_dtype="auto", sliding_window=2, trajectory_capacity=6, cross_frame_special=False),
])
def test_cache_bytes_are_what_a_session_leases(tiny, settings):
    stream = tiny.stream_config.with_settings(num_scale_frames=2, **settings)
    frames = torch.rand(11, 3, 28, 42, generator=torch.Generator().manual_seed(0))
    with tiny.session(stream) as session:
        for frame in frames:
            session.step(frame)
        stats = session.stats()
        leased = stats["aggregator"].bytes_held + stats["camera"].bytes_held
    assert tiny.cache_bytes((28, 42), stream, dtype=torch.float32) == leased


def test_cache_bytes_refuse_frames_that_are_not_whole_patches(tiny):
    with pytest.raises(ValueError, match="multiples of the patch size"):
        tiny.cache_bytes((30, 42), dtype=torch.float32)


def test_the_weights_estimate_is_the_cast_networks_bytes():
    net = mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()
    stream = net.stream_config
    fp32 = estimate_memory(net, (28, 42), stream, precision="fp32").weights
    bf16_trunk = estimate_memory(net, (28, 42), stream, precision="bf16").weights
    bf16_all = estimate_memory(net, (28, 42), stream, precision="bf16", low_precision_heads=True).weights

    def held(module):
        return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])

    assert fp32 == held(net)
    net.cast_for_inference("bf16")
    assert bf16_trunk == held(net)
    net.cast_for_inference("bf16", heads=True)
    assert bf16_all == held(net) < bf16_trunk < fp32


def test_the_estimate_grows_with_what_the_stream_holds_and_shrinks_with_fp8_and_chunks(official):
    stream = official.stream_config

    def total(hw=(378, 518), **kw):
        chunk = kw.pop("chunk", None)
        return estimate_memory(official, hw, stream.with_settings(**kw), precision="bf16",
                               dense_chunk_frames=chunk).total

    assert total(sliding_window=32) < total(sliding_window=64)
    assert total(kv_dtype="fp8") < total()
    assert total(chunk=1) < total(chunk=8)
    assert total((224, 294)) < total()
    assert total(trajectory_capacity=64) < total(trajectory_capacity=1024)
    # fp8 halves the aggregator's cache: the arena at 518x378 and a window of 64 is 24 layers x
    # 1005 tokens x 16 heads x (64 values + 4 scale bytes) x 2 (keys, values) a frame
    e8 = estimate_memory(official, (378, 518), stream.with_settings(kv_dtype="fp8"), precision="bf16")
    e16 = estimate_memory(official, (378, 518), stream, precision="bf16")
    camera = _camera_bytes(official, stream)
    frames = stream.cache_spec().ring_slots + 7  # + the trajectory's 1024 x 6 special tokens: 7 pages of 1005
    assert e8.caches - camera == frames * 24 * 1005 * 16 * (64 + 4) * 2
    assert e16.caches - camera == frames * 24 * 1005 * 16 * 64 * 2 * 2


def _camera_bytes(net, stream):
    """The camera head's cache bytes: a stream without it leases the aggregator's alone."""
    state = net.new_state(stream)
    return state.camera.lease_bytes(net.camera_head.cache_layout(2 * net.config.embed_dim), torch.float32)


def test_a_budget_that_fits_changes_nothing(official):
    stream = official.stream_config
    need = estimate_memory(official, (378, 518), stream, precision="bf16").total
    plan = plan_memory(need, official, (378, 518), stream, precision="bf16")
    assert plan.changes == () and plan.stream == stream and plan.dense_chunk_frames == official.dense_chunk_frames
    assert plan.estimate.total == need and "as given" in plan.describe()


def test_the_plan_gives_up_the_cheapest_setting_first(official):
    stream = official.stream_config
    hw = (378, 518)

    def need(**kw):
        chunk, heads = kw.pop("chunk", official.dense_chunk_frames), kw.pop("heads", False)
        return estimate_memory(official, hw, stream.with_settings(**kw), precision="bf16",
                               low_precision_heads=heads, dense_chunk_frames=chunk).total

    plan = plan_memory(need(chunk=1), official, hw, stream, precision="bf16")
    assert (plan.dense_chunk_frames, plan.stream.kv_dtype, plan.stream.sliding_window) == (1, "auto", 64)
    plan = plan_memory(need(chunk=1) - 1, official, hw, stream, precision="bf16")
    assert (plan.stream.kv_dtype, plan.stream.sliding_window, plan.low_precision_heads) == ("fp8", 64, False)
    plan = plan_memory(need(chunk=1, kv_dtype="fp8") - 1, official, hw, stream, precision="bf16")
    assert (plan.stream.kv_dtype, plan.stream.sliding_window, plan.low_precision_heads) == ("fp8", 48, False)
    assert "sliding window of 48" in plan.describe() and plan.stream.window_size == stream.window_size
    windowed = plan_memory(need(chunk=1, kv_dtype="fp8") - 1, official, hw, stream, precision="bf16", windowed=True)
    assert windowed.stream.window_size == stream.anchor_frames + 48
    smallest_fp32_heads = need(chunk=1, kv_dtype="fp8", sliding_window=8)
    plan = plan_memory(smallest_fp32_heads - 1, official, hw, stream, precision="bf16")
    assert plan.low_precision_heads and "pose error" in plan.describe()
    assert plan.estimate.total <= smallest_fp32_heads - 1


def test_a_budget_nothing_fits_is_refused_with_the_least_it_needs(official):
    stream = official.stream_config
    least = estimate_memory(official, (378, 518), stream.with_settings(kv_dtype="fp8", sliding_window=8),
                            precision="bf16", low_precision_heads=True, dense_chunk_frames=1)
    with pytest.raises(MemoryBudgetError, match=f"needs about {least.total / GIB:.2f} GiB"):
        plan_memory(least.total - 1, official, (378, 518), stream, precision="bf16")


def test_the_dense_chunk_changes_memory_not_outputs(tiny):
    frames = torch.rand(4, 3, 28, 42, generator=torch.Generator().manual_seed(1))
    outs = []
    for chunk in (8, 1):
        tiny.dense_chunk_frames = chunk
        with tiny.session(num_scale_frames=4) as session:
            outs.append(session.run_frames(frames))
    tiny.dense_chunk_frames = 8
    for a, b in zip(*outs):
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(a.depth_conf, b.depth_conf, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="positive int"):
        tiny.dense_chunk_frames = 0


def test_streams_that_fit_count_the_weights_once_and_each_streams_caches():
    from mapstream.gpu_memory import MemoryEstimate, streams_that_fit

    e = MemoryEstimate(weights=10, caches=7, working=3)
    assert streams_that_fit(13 + 7 * 4, e) == 4
    assert streams_that_fit(13 + 7 * 4 - 1, e) == 3
    assert streams_that_fit(12, e) == 0


def test_a_server_is_told_how_many_sessions_its_gpu_holds(official):
    from mapstream.gpu_memory import streams_that_fit
    from mapstream.serve.config import ServeConfig
    from mapstream.serve.memory import sessions_memory_warning

    stream = official.stream_config.with_settings(precision="bf16")
    card = 80 * GIB
    for batch in (1, 4):  # fewer than the sessions that fit: the batch is what a busy server steps
        per = estimate_memory(official, (518, 518), stream, precision="bf16", streams=64, batch=batch)
        fit = streams_that_fit(card, per)
        told = sessions_memory_warning(official, stream, ServeConfig(max_sessions=fit + 1, max_batch=batch), card)
        assert f"room for about {fit}" in told and f"--max-sessions {fit}" in told and "--gpu-memory" in told
        assert sessions_memory_warning(official, stream, ServeConfig(max_sessions=fit, max_batch=batch), card) is None
    fp8 = stream.with_settings(kv_dtype="fp8")
    assert sessions_memory_warning(official, fp8, ServeConfig(max_sessions=8, max_batch=8), card) is None  # 8 on 80 GB


def test_streams_share_the_weights_and_each_holds_its_caches_and_its_one_frame_graph(official):
    stream = official.stream_config.with_settings(precision="bf16")
    one = estimate_memory(official, (378, 518), stream, precision="bf16")
    four = estimate_memory(official, (378, 518), stream, precision="bf16", streams=4)
    assert (four.weights, four.caches, four.working) == (one.weights, one.caches, one.working)  # the scale phase
    assert one.graphs == 0 and 0 < four.graphs < one.working  # one stream: its graph comes after its scale phase
    assert four.total == one.weights + 4 * (one.caches + four.graphs) + one.working and four.streams == 4
    assert four.per_stream == four.caches + four.graphs and "4 x" in four.describe()
    batched = [estimate_memory(official, (378, 518), stream, precision="bf16", streams=16, batch=b)
               for b in (1, 16, 32)]
    assert batched[0].working == one.working  # one frame at a time: no batched graph beside the scale phase
    assert batched[0].working < batched[1].working == batched[2].working  # 32 at a time: only 16 streams to batch
    # The batched graph of 16 frames: sixteen one-frame steps' passing tensors (the fixed part
    # once), and what its pieces keep between them: bf16, every layer, every token of a frame.
    c = official.config
    kept = WORKING.pieces_per_token_layer * 16 * (c.num_special_tokens + 27 * 37) * c.depth * c.embed_dim * 2
    assert batched[1].working - one.working == pytest.approx(16 * four.graphs - 15 * WORKING.fixed + kept, abs=16)
    with pytest.raises(ValueError, match="streams and batch"):
        estimate_memory(official, (378, 518), stream, precision="bf16", streams=0)


def test_a_plan_for_many_streams_gives_settings_up_until_they_all_fit(official):
    stream = official.stream_config.with_settings(precision="bf16")
    hw = (518, 518)

    def need(streams, heads=False, chunk=None, **kw):
        return estimate_memory(official, hw, stream.with_settings(**kw), precision="bf16", streams=streams,
                               batch=8, low_precision_heads=heads, dense_chunk_frames=chunk).total

    assert need(8) > 80 * GIB  # eight bf16 caches with a window of 64 do not fit an 80 GB card
    plan = plan_memory(80 * GIB, official, hw, stream, precision="bf16", streams=8, batch=8)
    assert plan.estimate.streams == 8 and plan.estimate.total <= 80 * GIB
    assert plan.stream.kv_dtype == "fp8" and plan.stream.sliding_window == stream.sliding_window
    assert "8 streams of 518x518" in plan.describe() and "8 x " in plan.describe()
    plan = plan_memory(need(8, kv_dtype="fp8", chunk=1) - 1, official, hw, stream, precision="bf16", streams=8, batch=8)
    assert plan.stream.kv_dtype == "fp8" and plan.stream.sliding_window == 48
    smallest = need(64, heads=True, chunk=1, kv_dtype="fp8", sliding_window=8)
    with pytest.raises(MemoryBudgetError, match=r"64 streams of 518x518.*fewer streams \(about \d+ fit\)"):
        plan_memory(smallest - 1, official, hw, stream, precision="bf16", streams=64, batch=8,
                    low_precision_heads=True)
