"""Several sessions stepped together through one batched forward (tiny preset, CPU): each
session gets what its own `step` gives, whatever mix of phases, keyframe policies, frame
sizes and scene cuts the batch holds."""
from __future__ import annotations

import pytest
import torch

import mapstream
from mapstream.keyframes import FlowKeyframes

CACHE = dict(cache_scale_frames=2, sliding_window=3, trajectory_capacity=4)


@pytest.fixture(scope="module")
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def frames_of(n, h=28, w=42, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, h, w, generator=g)


def assert_same(got, want):
    assert [p.index for p in got] == [p.index for p in want]
    for a, b in zip(got, want):
        assert (a.keyframe, a.scale_frame, a.name) == (b.keyframe, b.scale_frame, b.name)
        for key in ("pose_enc", "T_world_cam", "K", "depth", "depth_conf"):
            torch.testing.assert_close(getattr(a, key), getattr(b, key), rtol=1e-4, atol=1e-5)


def solo(model, frames, policy, keyframes=None, cuts=()):
    preds = []
    with model.session(num_scale_frames=2, keyframe_interval=policy, **CACHE) as s:
        for i, frame in enumerate(frames):
            if i in cuts:
                s.reset()
            preds.append(s.step(frame, keyframe=None if keyframes is None else keyframes[i], name=f"f{i}"))
        return preds, s.stats()


def test_streams_stepped_together_equal_their_solo_runs(model):
    n = 11
    streams = [frames_of(n, seed=s) for s in range(4)]
    # Different policies; stream 2 has explicit keyframe overrides; stream 3 a scene cut.
    policies = [1, 2, FlowKeyframes(threshold=1.0, max_gap=2), 3]
    overrides = [None, None, [None] * 5 + [True, False, True, None, None, False], None]
    cuts = [(), (), (), (6,)]
    want = [solo(model, streams[b], policies[b], overrides[b], cuts[b]) for b in range(4)]

    sessions = [model.session(num_scale_frames=2, keyframe_interval=p, **CACHE) for p in policies]
    got: list[list] = [[] for _ in range(4)]
    for i in range(n):
        for b in range(4):
            if i in cuts[b]:
                sessions[b].reset()
        keyframes = [None if o is None else o[i] for o in overrides]
        per_session = mapstream.step_together(sessions, [s[i] for s in streams], keyframes=keyframes,
                                              names=[f"f{i}"] * 4)
        for b in range(4):
            got[b].append(per_session[b])
    for b in range(4):
        for step_got, step_want in zip(got[b], want[b][0]):
            assert_same(step_got, step_want)
        assert sessions[b].stats() == want[b][1]  # same cache contents bookkeeping
    for s in sessions:
        s.close()


def test_cache_contents_match_solo_runs_after_every_step(model):
    frames = [frames_of(9, seed=10 + b) for b in range(3)]
    together = [model.session(num_scale_frames=2, keyframe_interval=2, **CACHE) for _ in range(3)]
    alone = [model.session(num_scale_frames=2, keyframe_interval=2, **CACHE) for _ in range(3)]
    for i in range(9):
        mapstream.step_together(together, [f[i] for f in frames])
        for b in range(3):
            alone[b].step(frames[b][i])
            t, a = together[b].state.aggregator, alone[b].state.aggregator
            assert t.visible_frames() == a.visible_frames()
            assert together[b].state.camera.visible_frames() == alone[b].state.camera.visible_frames()
            if t.frames_stored:
                # Slot 0 (the unstored frame's spare) is scratch: written before it is read.
                lo = t.layout.tokens_per_frame
                hi = t._visible_end(lo, t.layout.trajectory_tokens)
                torch.testing.assert_close(t._run.storage[..., lo:hi, :], a._run.storage[..., lo:hi, :],
                                           rtol=1e-4, atol=1e-5)


def test_mixed_phases_and_sizes_are_grouped(model):
    big, small = frames_of(6, seed=20), frames_of(6, h=14, w=28, seed=21)
    late = frames_of(6, seed=22)
    sessions = [model.session(num_scale_frames=2, **CACHE) for _ in range(3)]
    want = [solo(model, big, 1)[0], solo(model, small, 1)[0], solo(model, late[:3], 1)[0]]
    got = [[], [], []]
    for i in range(6):
        active = [0, 1] + ([2] if i >= 3 else [])  # session 2 joins late: it is in its scale phase
        out = mapstream.step_together([sessions[b] for b in active],
                                      [(big, small, late)[b][i - (3 if b == 2 else 0)] for b in active],
                                      names=[f"f{i - (3 if b == 2 else 0)}" for b in active])
        for b, preds in zip(active, out):
            got[b].append(preds)
    for b in range(3):
        for g, w in zip(got[b], want[b]):
            assert_same(g, w)


WINDOWS = [dict(window_size=5, overlap=2, shared_from="later"), dict(window_size=4, overlap=1, shared_from="earlier")]


def test_windowed_sessions_join_the_batch_and_equal_their_solo_runs(model):
    """Two windowed streams (one whose windows reopen with a full scale phase, one whose
    overlap is shorter than its scale frames, so that its new window's frame is still
    buffered) beside a one-cache stream: each step gives each what its own `step` gives,
    and the windows are joined by the same transforms."""
    n = 13
    streams = [frames_of(n, seed=40 + b) for b in range(3)]

    def make(b):
        if b == 2:
            return model.session(num_scale_frames=2, keyframe_interval=1, **CACHE)
        return mapstream.WindowedSession(model, num_scale_frames=2, keyframe_interval=1, **WINDOWS[b])

    want = []
    for b in range(3):
        with make(b) as alone:
            want.append(([alone.step(frame, name=f"f{i}") for i, frame in enumerate(streams[b])], alone.flush(),
                         getattr(alone, "transforms", [])))
    sessions = [make(b) for b in range(3)]
    got = [[] for _ in range(3)]
    for i in range(n):
        for b, preds in enumerate(mapstream.step_together(sessions, [s[i] for s in streams], names=[f"f{i}"] * 3)):
            got[b].append(preds)
    for b in range(3):
        assert sum(map(len, got[b])) > 0
        for step_got, step_want in zip(got[b], want[b][0], strict=True):
            assert_same(step_got, step_want)
        assert_same(sessions[b].flush(), want[b][1])
    for b in range(2):
        assert sessions[b].stats()["windows"] == len(want[b][2]) > 2
        for t_got, t_want in zip(sessions[b].transforms, want[b][2], strict=True):
            torch.testing.assert_close(t_got.matrix(), t_want.matrix(), rtol=1e-4, atol=1e-5)
    for s in sessions:
        s.close()


def test_a_windowed_session_takes_no_keyframe_flag(model):
    windowed = mapstream.WindowedSession(model, num_scale_frames=1, keyframe_interval=1, window_size=3, overlap=1)
    plain = model.session(num_scale_frames=1, **CACHE)
    x = frames_of(2, seed=50)
    with pytest.raises(ValueError, match=r"keyframes\[1\]: a WindowedSession stores frames at its fixed interval"):
        mapstream.step_together([plain, windowed], [x[0], x[1]], keyframes=[True, False])
    assert plain.frames_processed == 0 and windowed.stats()["aggregator"].frames_seen == 0  # nothing moved
    mapstream.step_together([plain, windowed], [x[0], x[1]], keyframes=[True, None])
    assert plain.frames_processed == 1
    windowed.close()
    with pytest.raises(mapstream.session.SessionClosedError):
        mapstream.step_together([plain, windowed], [x[0], x[1]])
    plain.close()


def test_misuse_is_refused_before_any_session_moves(model):
    a, b = model.session(num_scale_frames=1, **CACHE), model.session(num_scale_frames=1, **CACHE)
    x = frames_of(2, seed=30)
    mapstream.step_together([a, b], [x[0], x[1]])
    with pytest.raises(ValueError, match="a session appears twice"):
        mapstream.step_together([a, a], [x[0], x[1]])
    with pytest.raises(TypeError, match=r"sessions\[1\] is a str; step_together takes mapstream.Session and "):
        mapstream.step_together([a, "camera"], [x[0], x[1]])
    with pytest.raises(ValueError, match="2 sessions need as many frames"):
        mapstream.step_together([a, b], [x[0]])
    bad = x[1].clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="frame 1: .*NaN"):
        mapstream.step_together([a, b], [x[0], bad])
    assert a.frames_processed == b.frames_processed == 1  # nothing moved
    b.close()
    with pytest.raises(mapstream.session.SessionClosedError):
        mapstream.step_together([a, b], [x[0], x[1]])
    assert a.frames_processed == 1
    a.close()


def test_forward_streams_refuses_a_shared_cache(model):
    state = model.new_state(model.stream_config.with_settings(**CACHE))
    with pytest.raises(ValueError, match="each stream needs its own cache"):
        model.forward_streams(frames_of(2, seed=1), [state, state], stores=[True, True], num_frame_for_scale=[1, 1])


@pytest.mark.parametrize("overrides", [dict(enable_point=True), dict(enable_3d_rope=False), dict(camera_num_iterations=2)])
def test_other_architectures_batch_the_same(overrides):
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", **overrides)).eval()
    streams = [frames_of(6, seed=40 + b) for b in range(3)]
    want = [solo(model, s, 2)[0] for s in streams]
    assert (want[0][-1][0].world_points is not None) == bool(overrides.get("enable_point"))
    sessions = [model.session(num_scale_frames=2, keyframe_interval=2, **CACHE) for _ in range(3)]
    for i in range(6):
        got = mapstream.step_together(sessions, [s[i] for s in streams], names=[f"f{i}"] * 3)
        for b in range(3):
            assert_same(got[b], want[b][i])
            for a, w in zip(got[b], want[b][i]):
                if w.world_points is not None:
                    torch.testing.assert_close(a.world_points, w.world_points, rtol=1e-4, atol=1e-5)
                    torch.testing.assert_close(a.world_points_conf, w.world_points_conf, rtol=1e-4, atol=1e-5)
