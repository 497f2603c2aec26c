"""The cache manager on tiny specs, narrated step by step.

Every key written for frame f, token j holds the value 1000 * f + j, so the keys handed to
attention can be decoded back into (frame, token) pairs and compared with the definition
of what must be visible (STREAMING.md section 3):

    anchors (all tokens) + window (all tokens) + trajectory (special tokens) [+ the frame]
"""
from __future__ import annotations

import random

import pytest
import torch

from mapstream.cache import CacheSpec, CacheStateError, PoolRegistry, StreamCacheManager, TokenLayout, thin_trajectory

TPF, SPECIAL = 4, 2  # 4 tokens per frame, the first 2 of them "special"
LAYOUT = TokenLayout(num_layers=2, num_heads=1, head_dim=1, tokens_per_frame=TPF, trajectory_tokens=SPECIAL)


def frame_keys(frame_ids) -> torch.Tensor:
    """k [1, 1, n*TPF, 1] encoding (frame, token)."""
    vals = [1000.0 * f + j for f in frame_ids for j in range(TPF)]
    return torch.tensor(vals, dtype=torch.float64).view(1, 1, -1, 1)


def run_step(mgr: StreamCacheManager, frame_ids, store: bool, moves_first: bool = False) -> list[set[tuple[int, int]]]:
    """Run one step over every layer; returns, per layer, the decoded visible (frame, token) set.
    moves_first: for single frames, run the step's moves for all layers up front
    (`apply_moves`) and only the writes per layer, as the graph-replayed step does."""
    step = mgr.begin_step(len(frame_ids), store=store, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))
    moves_first = moves_first and len(frame_ids) == 1
    if moves_first:
        step.apply_moves()
    k = frame_keys(frame_ids)
    seen = []

    def capture(q, keys, values):
        assert torch.equal(keys, values)
        seen.append({(round(x) // 1000, round(x) % 1000) for x in keys.flatten().tolist()})
        assert len(seen[-1]) == keys.shape[-2], "a token is visible twice"
        return q

    for layer in range(LAYOUT.num_layers):
        step.attend(layer, k, k, k.clone(), capture, moves_done=moves_first)
    mgr.finish_step(step)
    return seen


def expected_visible(anchors, window, trajectory, current=()) -> set[tuple[int, int]]:
    full = {(f, j) for f in list(anchors) + list(window) + list(current) for j in range(TPF)}
    return full | {(f, j) for f in trajectory for j in range(SPECIAL)}


def make(anchors=2, window=2, capacity=4) -> StreamCacheManager:
    return StreamCacheManager(CacheSpec(anchors, window, capacity), PoolRegistry(), name="test")


def test_narrated_stream():
    mgr = make()
    # Scale phase: frames 0, 1 attend to each other, then become the anchors.
    seen = run_step(mgr, [0, 1], store=True)
    assert seen[0] == expected_visible([0, 1], [], [])
    assert mgr.visible_frames() == {"anchors": [0, 1], "window": [], "trajectory": []}
    # Keyframes 2, 3 fill the window.
    assert run_step(mgr, [2], store=True)[0] == expected_visible([0, 1], [2], [])
    assert run_step(mgr, [3], store=True)[0] == expected_visible([0, 1], [2, 3], [])
    # A non-keyframe with a full window sees window + 1 frames (eviction deferred) ...
    assert run_step(mgr, [4], store=False)[1] == expected_visible([0, 1], [2, 3], [], [4])
    # ... and leaves nothing behind.
    assert mgr.visible_frames() == {"anchors": [0, 1], "window": [2, 3], "trajectory": []}
    # Keyframe 5: frame 2 leaves the window first; its special tokens stay visible.
    assert run_step(mgr, [5], store=True)[0] == expected_visible([0, 1], [3, 5], [2])
    assert run_step(mgr, [6], store=True)[1] == expected_visible([0, 1], [5, 6], [2, 3])
    assert mgr.frames_stored == 6 and mgr.frames_seen == 7
    stats = mgr.stats()
    assert (stats.anchor_frames, stats.window_frames, stats.trajectory_frames) == (2, 2, 2)


def test_trajectory_thinning_when_full():
    mgr = make(anchors=1, window=1, capacity=4)
    run_step(mgr, [0], store=True)
    for f in range(1, 7):
        run_step(mgr, [f], store=True)
    # Evicted so far: 1..5, capacity 4 -> at the 5th eviction the older half [1, 2] is thinned to [1].
    assert mgr.visible_frames()["trajectory"] == [1, 3, 4, 5]
    seen = run_step(mgr, [7], store=True)
    assert seen[0] == expected_visible([0], [7], thin_trajectory([1, 3, 4, 5]) + [6])
    assert mgr.visible_frames()["trajectory"] == [1, 4, 5, 6]


def test_unbounded_trajectory_grows_and_keeps_everything():
    mgr = make(anchors=1, window=1, capacity=None)
    for f in range(200):
        seen = run_step(mgr, [f], store=True)
    assert seen[0] == expected_visible([0], [199], list(range(1, 199)))


def test_multi_frame_block_after_the_scale_phase_attends_then_stores():
    mgr = make(anchors=1, window=2, capacity=8)
    run_step(mgr, [0], store=True)
    run_step(mgr, [1], store=True)
    # Block [2, 3, 4]: attends to the cache before it plus all of itself, then stores in order.
    assert run_step(mgr, [2, 3, 4], store=True)[0] == expected_visible([0], [1], [], [2, 3, 4])
    assert mgr.visible_frames() == {"anchors": [0], "window": [3, 4], "trajectory": [1, 2]}


def reference_visible(history, spec: CacheSpec, step_frames, store):
    """A dense, obviously-correct model of the policy: lists of frame ids."""
    anchors, window, traj = history
    visible_before = expected_visible(anchors, window, traj)
    for f in step_frames if store else []:
        if len(anchors) < spec.anchor_frames:
            anchors.append(f)
        elif len(window) < spec.window_frames:
            window.append(f)
        else:
            traj.append(window.pop(0))
            if spec.trajectory_capacity is not None and len(traj) > spec.trajectory_capacity:
                last = traj.pop()
                traj[:] = thin_trajectory(traj) + [last]
            window.append(f)
    if len(step_frames) > 1:
        return visible_before | expected_visible([], [], [], step_frames)
    if store:
        return expected_visible(anchors, window, traj)
    return expected_visible(anchors, window, traj, step_frames)


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("moves_first", [False, True], ids=["per-layer", "moves-first"])
@pytest.mark.parametrize("seed", range(6))
def test_random_streams_match_the_dense_reference(seed, moves_first, kv_dtype):
    """In FP8 too: a row of one value is its own largest, stored as +-448 times its scale, so
    the keys read back decode to their (frame, token) only if every move carried each token's
    scale with it."""
    rng = random.Random(seed)
    spec = CacheSpec(rng.randint(0, 3), rng.randint(1, 4), rng.choice([2, 3, 5, None]), kv_dtype=kv_dtype)
    mgr = StreamCacheManager(spec, PoolRegistry())
    history = ([], [], [])
    stored_ids = []  # the manager names stored frames by storage index (the 3D-RoPE time)
    next_id = 0
    for _ in range(60):
        n = rng.choice([1, 1, 1, 1, 2, 3]) if rng.random() < 0.3 else 1
        store = rng.random() < 0.7
        frames = list(range(next_id, next_id + n))
        next_id += n
        want = reference_visible(history, spec, frames, store)
        for layer_seen in run_step(mgr, frames, store, moves_first):
            assert layer_seen == want
        if store:
            stored_ids.extend(frames)
        named = {role: [stored_ids[i] for i in ids] for role, ids in mgr.visible_frames().items()}
        assert named == {"anchors": history[0], "window": history[1], "trajectory": history[2]}


def test_reset_forgets_everything_and_keeps_the_pages():
    pools = PoolRegistry()
    mgr = StreamCacheManager(CacheSpec(1, 2, 4), pools)
    for f in range(10):
        run_step(mgr, [f], store=True)
    held = mgr.stats().bytes_held
    mgr.reset()
    assert mgr.visible_frames() == {"anchors": [], "window": [], "trajectory": []}
    assert mgr.frames_stored == 0 and mgr.stats().bytes_held == held
    assert run_step(mgr, [100], store=True)[0] == expected_visible([100], [], [])
    pool = pools.pools()[0]
    assert pool.stats().pages_in_use == mgr.stats().pages_in_use + mgr.stats().pages_free
    mgr.release()
    assert pool.stats().pages_in_use == 0
    assert pools.trim() > 0 and pool.stats().bytes_total == 0


def test_many_sequences_hold_no_more_memory_than_one():
    pools = PoolRegistry()
    mgr = StreamCacheManager(CacheSpec(2, 3, 6), pools)
    sizes = set()
    for seq in range(100):
        mgr.reset()
        for f in range(seq % 17 + 1):
            run_step(mgr, [f], store=f % 3 != 2)
        sizes.add((pools.pools()[0].stats().bytes_total, mgr.stats().bytes_held))
    assert len(sizes) == 1


def test_resolution_change_mid_sequence_is_refused_and_allowed_after_reset():
    mgr = make()
    run_step(mgr, [0], store=True)
    other = TokenLayout(2, 1, 1, TPF + 1, SPECIAL)
    with pytest.raises(CacheStateError, match="reset the cache"):
        mgr.begin_step(1, store=True, layout=other, dtype=torch.float64, device=torch.device("cpu"))
    # As many tokens a frame but another patch grid (portrait after landscape) is a change too.
    wide, tall = (TokenLayout(2, 1, 1, TPF, SPECIAL, patch_grid=g) for g in ((1, TPF - SPECIAL), (TPF - SPECIAL, 1)))
    mgr.reset()
    mgr.finish_step(mgr.begin_step(1, store=True, layout=wide, dtype=torch.float64, device=torch.device("cpu")))
    with pytest.raises(CacheStateError, match=rf"\({TPF} tokens per frame \({TPF - SPECIAL} x 1 patches\).*stored with {TPF} tokens per frame \(1 x {TPF - SPECIAL} patches\)"):
        mgr.begin_step(1, store=True, layout=tall, dtype=torch.float64, device=torch.device("cpu"))
    mgr.reset()
    step = mgr.begin_step(1, store=True, layout=other, dtype=torch.float64, device=torch.device("cpu"))
    mgr.finish_step(step)
    assert mgr.layout == other


def test_a_failed_stored_step_poisons_the_cache_until_reset():
    mgr = make()
    run_step(mgr, [0], store=True)
    step = mgr.begin_step(1, store=True, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))
    mgr.abort_step(step)
    with pytest.raises(CacheStateError, match="failed part-way"):
        run_step(mgr, [1], store=True)
    mgr.reset()
    run_step(mgr, [1], store=True)


def test_a_failed_unstored_step_leaves_the_cache_valid():
    mgr = make()
    run_step(mgr, [0, 1], store=True)
    step = mgr.begin_step(1, store=False, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))
    mgr.abort_step(step)
    assert run_step(mgr, [2], store=True)[0] == expected_visible([0, 1], [2], [])


def test_begin_twice_is_refused():
    mgr = make()
    mgr.begin_step(1, store=True, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))
    with pytest.raises(CacheStateError, match="not finished"):
        mgr.begin_step(1, store=True, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))


def test_thin_trajectory_rule():
    assert thin_trajectory([1, 2]) == [1]
    assert thin_trajectory([1, 2, 3, 4]) == [1, 3, 4]
    assert thin_trajectory(list(range(8))) == [0, 2, 4, 5, 6, 7]


def test_store_last_promotes_an_unstored_frame():
    """Decide-after-seeing: frame 4 attends unstored (window + 1 visible), then is stored."""
    mgr = make()
    run_step(mgr, [0, 1], store=True)
    run_step(mgr, [2], store=True)
    run_step(mgr, [3], store=True)
    assert run_step(mgr, [4], store=False)[0] == expected_visible([0, 1], [2, 3], [], [4])
    mgr.store_last()
    assert mgr.frames_stored == 5
    # Now identical to having stored frame 4: frame 2 left the window, 4 joined it.
    assert run_step(mgr, [5], store=False)[1] == expected_visible([0, 1], [3, 4], [2], [5])
    with pytest.raises(CacheStateError, match="single unstored frame"):
        run_step(mgr, [6], store=True)
        mgr.store_last()


def test_moves_done_is_refused_for_a_block():
    mgr = make()
    step = mgr.begin_step(2, store=True, layout=LAYOUT, dtype=torch.float64, device=torch.device("cpu"))
    k = frame_keys([0, 1])
    with pytest.raises(CacheStateError, match="moves_done is for single-frame steps"):
        step.attend(0, k, k, k, lambda q, keys, values: q, moves_done=True)
