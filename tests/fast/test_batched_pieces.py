"""The batched pieces step (`BatchedPiecewiseGraphs`, capture=False: the graphs' decomposition
run eagerly on the CPU) against the network's eager batched forward (`forward_streams`) and
against each stream stepped alone, tiny preset, past the scale phase, with keyframe and
non-keyframe steps.

Tolerances: against `forward_streams` the two run the same functions on the same batched
shapes in the same order (the trunk's pieces are `enter_layer`/`between_layers`/`leave_layer`,
the attention the same per-stream cache steps), so they agree to the last bit on one machine;
the test still allows fp32 rounding (rtol 1e-6) so that a kernel choosing another summation
order for a view is not a failure. Against a stream stepped alone the batched matrix products
round differently from one-row ones (BLAS blocks by batch), hence `test_multistream`'s
rtol 1e-4 / atol 1e-5.
"""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.fast import BatchedPiecewiseGraphs
from stream_helpers import started_states

CACHE = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
SCALE = 2
EXACT = dict(rtol=1e-6, atol=1e-7)
ROUNDING = dict(rtol=1e-4, atol=1e-5)
# Per step and stream: stored (keyframe) or only attended; every stream sees both kinds and
# the window fills, so trajectory moves run too.
STORES = [[True, False, True], [False, True, True], [True, True, False], [True, False, False],
          [False, True, True], [True, True, True], [False, False, True]]


@pytest.fixture(scope="module")
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def streams_of(count, frames, h=28, w=42):
    g = torch.Generator().manual_seed(7)
    return torch.rand(count, frames, 3, h, w, generator=g)


def visible_cache(state):
    """What a cache holds that a later step can read: its frames' bookkeeping and the K/V of
    the visible slots (slot 0 is the unstored frame's scratch, written before it is read)."""
    agg = state.aggregator
    lo = agg.layout.tokens_per_frame
    hi = agg._visible_end(lo, agg.layout.trajectory_tokens)
    return (agg.visible_frames(), state.camera.visible_frames(), agg.frames_stored), agg._run.storage[..., lo:hi, :]


def assert_same_caches(got, want, tolerance):
    for a, b in zip(got, want):
        (a_frames, a_kv), (b_frames, b_kv) = visible_cache(a), visible_cache(b)
        assert a_frames == b_frames
        torch.testing.assert_close(a_kv, b_kv, **tolerance)


@pytest.mark.parametrize("overrides", [{}, dict(enable_point=True), dict(enable_3d_rope=False)],
                         ids=["default", "point-head", "2d-rope"])
def test_batched_pieces_equal_the_eager_batched_forward_and_each_stream_alone(overrides):
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", **overrides)).eval()
    count, steps = 3, len(STORES)
    images = streams_of(count, SCALE + steps)
    batched_states, eager_states, solo_states = (started_states(model, images, SCALE, **CACHE) for _ in range(3))
    graphs = BatchedPiecewiseGraphs(model, (28, 42), streams=count, capture=False)
    backend = model.attention_backend(images.device, torch.float32)
    with torch.no_grad():
        for step, stores in enumerate(STORES):
            batch = images[:, SCALE + step : SCALE + step + 1]
            got = graphs(batch, batched_states, stores=stores, backend=backend)
            want = model.forward_streams(batch, eager_states, stores=stores, num_frame_for_scale=[SCALE] * count,
                                         backend=backend)
            assert sorted(got) == sorted(want)
            for key in want:
                torch.testing.assert_close(got[key], want[key], **EXACT)
            assert_same_caches(batched_states, eager_states, EXACT)
            for b, state in enumerate(solo_states):
                alone = model(batch[b : b + 1], state, store=stores[b], num_frame_for_scale=SCALE, backend=backend)
                for key in want:
                    torch.testing.assert_close(got[key][b : b + 1], alone[key], **ROUNDING)
            assert_same_caches(batched_states, solo_states, ROUNDING)


def test_one_stream_is_the_single_stream_pieces_step(model):
    """streams=1 is a session's own pieces step: the same outputs for the same frames."""
    images = streams_of(1, SCALE + 3)
    ours, theirs = started_states(model, images, SCALE, **CACHE), started_states(model, images, SCALE, **CACHE)
    batched = BatchedPiecewiseGraphs(model, (28, 42), streams=1, capture=False)
    single = mapstream.fast.graphed_step(model, (28, 42), whole=False, capture=False)
    backend = model.attention_backend(images.device, torch.float32)
    with torch.no_grad():
        for step, store in enumerate([True, False, True]):
            frame = images[:, SCALE + step : SCALE + step + 1]
            got = batched(frame, ours, stores=[store], backend=backend)
            with theirs[0].step(store):
                want = single(frame, theirs[0], store=store, backend=backend)
            for key in got:
                # One row through the batched pieces and through a session's own pieces runs the
                # same operations; the CPU's BLAS may block an [N, K] product of N = 1 differently,
                # which moves a pose by an fp32 rounding or two (seen: 1e-6 on one element).
                torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=2e-6)
    assert_same_caches(ours, theirs, EXACT)


def test_a_batched_step_refuses_batches_of_another_shape(model):
    images = streams_of(2, SCALE + 1)
    states = started_states(model, images, SCALE, **CACHE)
    graphs = BatchedPiecewiseGraphs(model, (28, 42), streams=2, capture=False)
    backend = model.attention_backend(images.device, torch.float32)
    with pytest.raises(ValueError, match="takes frames"):
        graphs(images[:1, SCALE:], states[:1], stores=[True], backend=backend)
    with pytest.raises(ValueError, match="got 1 states"):
        graphs(images[:, SCALE:], states[:1], stores=[True, True], backend=backend)
    with pytest.raises(ValueError, match="the same state appears twice"):
        graphs(images[:, SCALE:], [states[0], states[0]], stores=[True, True], backend=backend)
    with pytest.raises(ValueError, match="at least one stream"):
        BatchedPiecewiseGraphs(model, (28, 42), streams=0, capture=False)
