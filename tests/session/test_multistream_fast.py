"""`step_together` on the fast path (tiny preset, CPU: the batched pieces step runs its
decomposition eagerly): once a group's size repeats, its batches run through one kept
`BatchedPiecewiseGraphs`, giving each session what the eager batched forward and its own
`step` give; a session with the fast path off, or a group size that changes, keeps the eager
batched forward. Tolerances as in test_multistream (batched against one-row matrix products)."""
from __future__ import annotations

import gc
import logging

import pytest
import torch

import mapstream
from mapstream import multistream
from mapstream.fast import BatchedPiecewiseGraphs

CACHE = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)
ROUNDING = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture()
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


@pytest.fixture()
def batched_calls(monkeypatch):
    """Every BatchedPiecewiseGraphs call, as (the graphs object, the number of streams)."""
    calls = []
    original = BatchedPiecewiseGraphs.__call__

    def spy(self, frames, states, **kwargs):
        calls.append((self, len(states)))
        return original(self, frames, states, **kwargs)

    monkeypatch.setattr(BatchedPiecewiseGraphs, "__call__", spy)
    return calls


def frames_of(n, seed):
    return torch.rand(n, 3, 28, 42, generator=torch.Generator().manual_seed(seed))


def sessions_of(model, count, fast, intervals=(1, 2, 3)):
    return [model.session(num_scale_frames=2, keyframe_interval=intervals[b % len(intervals)], fast=fast, **CACHE)
            for b in range(count)]


def assert_same(got, want):
    assert [(p.index, p.keyframe, p.scale_frame) for p in got] == [(p.index, p.keyframe, p.scale_frame) for p in want]
    for a, b in zip(got, want):
        for key in ("pose_enc", "T_world_cam", "K", "depth", "depth_conf"):
            torch.testing.assert_close(getattr(a, key), getattr(b, key), **ROUNDING)


def test_fast_sessions_stepped_together_match_the_eager_batch_and_their_solo_steps(model, batched_calls):
    n, count = 9, 3
    streams = [frames_of(n, seed=b) for b in range(count)]
    fast, eager, alone = (sessions_of(model, count, on) for on in (True, False, False))
    for i in range(n):
        frames = [s[i] for s in streams]
        got = mapstream.step_together(fast, frames)
        want = mapstream.step_together(eager, frames)
        for b in range(count):
            assert_same(got[b], want[b])
            assert_same(got[b], alone[b].step(frames[b]))
            assert fast[b].stats() == eager[b].stats() == alone[b].stats()
    # Steps 0-1: scale phase (each alone); step 2: the group size seen first (eager); then batched.
    assert len(batched_calls) == n - 3
    assert len({id(graphs) for graphs, _ in batched_calls}) == 1  # built once, kept
    assert {streams for _, streams in batched_calls} == {count}
    assert all(s.batched_slot.graphs is batched_calls[0][0] for s in fast)  # the group's sessions hold its graphs
    for s in fast + eager + alone:
        s.close()
    del batched_calls[:]
    gc.collect()
    assert not [key for key in multistream._slots.keys() if key[0] == id(model)]  # gone with the sessions


def test_a_changing_group_size_or_a_slow_session_keeps_the_eager_batch(model, batched_calls, caplog):
    streams = [frames_of(8, seed=10 + b) for b in range(3)]
    sessions = sessions_of(model, 3, True)
    caplog.set_level(logging.DEBUG, logger="mapstream.multistream")
    for i in range(2):  # scale phases
        mapstream.step_together(sessions, [s[i] for s in streams])
    sizes = [3, 2, 3, 3, 3, 2]
    for i, size in zip(range(2, 8), sizes):
        mapstream.step_together(sessions[:size], [s[i] for s in streams[:size]])
    # Only the calls whose size repeated the previous one (and what followed with it kept) batch.
    assert [streams for _, streams in batched_calls] == [3, 3]
    assert "graphs are built once a group size repeats" in caplog.text
    slow = model.session(num_scale_frames=2, fast=False, **CACHE)
    for i in range(2):
        mapstream.step_together([sessions[0], slow], [streams[0][i], streams[2][i]])
    calls = len(batched_calls)
    for i in range(2, 5):
        mapstream.step_together([sessions[0], slow], [streams[0][i], streams[2][i]])
    assert len(batched_calls) == calls
    assert "the fast path is off in at least one of them" in caplog.text
    for s in sessions + [slow]:
        s.close()
