"""CUDA-only checks of the batched fast step (skipped without a GPU): `BatchedPiecewiseGraphs`
captured and replayed gives what its eager decomposition and the network's eager batched
forward give, and `step_together` captures its graphs once and replays them every step."""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.fast import BatchedPiecewiseGraphs
from stream_helpers import started_states

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CACHE = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
SCALE, STREAMS, HW = 2, 3, (56, 70)
STORES = [[True, False, True], [False, True, True], [True, True, False], [True, False, False], [False, True, True]]


def test_replayed_batched_graphs_equal_their_eager_decomposition_and_forward_streams():
    """fp32 without cuDNN's timed search, so that the graphs hold the kernels an eager call
    picks: what differs is only what cuBLAS may choose inside a capture (tolerance of fp32
    reduction order, not of a lower precision)."""
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(0)
    images = torch.rand(STREAMS, SCALE + len(STORES), 3, *HW, device="cuda", generator=g)
    graphed_states, decomposed_states, eager_states = (started_states(model, images, SCALE, **CACHE) for _ in range(3))
    graphed = BatchedPiecewiseGraphs(model, HW, streams=STREAMS, capture=True, conv_search=False)
    decomposed = BatchedPiecewiseGraphs(model, HW, streams=STREAMS, capture=False)
    backend = model.attention_backend(images.device, torch.float32)
    with torch.no_grad():
        for step, stores in enumerate(STORES):
            batch = images[:, SCALE + step : SCALE + step + 1]
            got = graphed(batch, graphed_states, stores=stores, backend=backend)
            plain = decomposed(batch, decomposed_states, stores=stores, backend=backend)
            want = model.forward_streams(batch, eager_states, stores=stores, num_frame_for_scale=[SCALE] * STREAMS,
                                         backend=backend)
            for key in want:
                torch.testing.assert_close(got[key], plain[key], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5)
            for a, b in zip(graphed_states, eager_states):
                assert a.aggregator.visible_frames() == b.aggregator.visible_frames()
                assert a.camera.visible_frames() == b.camera.visible_frames()
    assert all(piece.graph is not None for piece in graphed.pieces)


def _kept_graphs(sessions):
    """The batched step `step_together` keeps for `sessions` and the graphs its pieces hold."""
    graphs = sessions[0].batched_slot.graphs
    assert all(s.batched_slot is sessions[0].batched_slot for s in sessions)
    return graphs.streams, graphs, [piece.graph for piece in (*graphs.pieces, graphs._dense_piece)]


def test_step_together_captures_the_batched_graphs_once_and_replays_them():
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny")).cuda().eval().cast_for_inference("bf16")
    g = torch.Generator(device="cuda").manual_seed(1)
    frames = torch.rand(STREAMS, 12, 3, *HW, device="cuda", generator=g)
    settings = dict(num_scale_frames=SCALE, keyframe_interval=2, precision="bf16", **CACHE)
    fast = [model.session(fast=True, **settings) for _ in range(STREAMS)]
    eager = [model.session(fast=False, **settings) for _ in range(STREAMS)]
    first = None
    for i in range(frames.shape[1]):
        got = mapstream.step_together(fast, list(frames[:, i]))
        want = mapstream.step_together(eager, list(frames[:, i]))
        for b in range(STREAMS):
            for a, w in zip(got[b], want[b]):
                assert a.keyframe == w.keyframe
                for key in ("depth", "pose_enc"):
                    x, y = getattr(a, key).float(), getattr(w, key).float()
                    assert float((x - y).norm() / y.norm()) < 2e-2, (i, b, key)  # bf16 rounding
        # Steps 0-1: the scale phase; step 2: the group size seen first (eager); step 3 captures.
        if i == SCALE + 1:
            first = _kept_graphs(fast)
            assert first[0] == STREAMS and all(graph is not None for graph in first[2])
        elif i > SCALE + 1:
            size, graphs, held = _kept_graphs(fast)
            assert graphs is first[1] and all(a is b for a, b in zip(held, first[2]))  # replayed, never recaptured
    for s in fast + eager:
        s.close()
