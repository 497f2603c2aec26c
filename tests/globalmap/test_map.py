"""The global map on its own: keyframes, corrections between them, bounded memory, settings."""
import resource

import numpy as np
import pytest
import torch

pytest.importorskip("gtsam")
pytest.importorskip("faiss")

import mapstream  # noqa: E402
from mapstream.geometry.align import Sim3, umeyama  # noqa: E402
from mapstream.globalmap import BackgroundMap, GlobalMap, MapConfig  # noqa: E402
from mapstream.globalmap.graph import Edge  # noqa: E402
from mapstream.globalmap.map import KEPT_REJECTIONS  # noqa: E402

from map_helpers import prediction, walk  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def _frame(i: int) -> torch.Tensor:
    return torch.rand(3, 28, 28, generator=torch.Generator().manual_seed(i))


def test_every_keyframe_becomes_a_node_joined_by_odometry(tiny):
    gmap = GlobalMap(tiny, MapConfig(keyframe_every=3, min_similarity=1.0))
    poses = walk(20)
    for i in range(20):
        gmap.add(prediction(i, poses[i]), _frame(i))
    assert gmap.graph.keys == list(range(0, 20, 3))
    assert [(e.i, e.j) for e in gmap.graph.edges] == [(k, k + 3) for k in range(0, 18, 3)]
    # Odometry alone: the map is the stream (no correction anywhere).
    gmap.finish()
    for i in range(20):
        corrected, scale = gmap.correct_pose(i, poses[i])
        np.testing.assert_allclose(corrected, poses[i][:3], atol=1e-6)
        assert scale == pytest.approx(1.0, abs=1e-6)


def _map_pulled_at_frame_8(tiny, frames: int) -> tuple[GlobalMap, np.ndarray]:
    """A map of frames 0-8 of a walk of `frames` (keyframes every 4th) whose keyframe 8 a loop
    pulls by 0.4 m along y from keyframe 0 (a tight, certain edge), and the walk's poses."""
    gmap = GlobalMap(tiny, MapConfig(keyframe_every=4, min_similarity=1.0))
    poses = walk(frames)
    for i in range(9):
        gmap.add(prediction(i, poses[i]), _frame(i))
    relative = Sim3(np.eye(3), poses[8][:3, 3] - poses[0][:3, 3] + np.array([0, 0.4, 0]), 1.0)
    gmap.graph.add_edge(Edge(0, 8, relative, np.array([1e-4, 1e-4, 1e-4]), "loop"))
    gmap.graph.update()
    return gmap, poses


def test_a_frame_between_keyframes_moves_with_both(tiny):
    gmap, poses = _map_pulled_at_frame_8(tiny, 9)
    gmap.finish()
    shift = [gmap.correct_pose(i, poses[i])[0][1, 3] for i in range(9)]
    assert shift[0] == pytest.approx(0.0, abs=1e-4)
    assert shift[8] == pytest.approx(0.4, abs=1e-3)
    # In between, the correction is interpolated: monotonic, and half-way at frame 6.
    assert all(b >= a - 1e-9 for a, b in zip(shift, shift[1:]))
    assert shift[6] == pytest.approx((shift[4] + shift[8]) / 2, abs=1e-3)


def test_keyframes_that_arrive_after_a_loop_move_with_it(tiny):
    """A loop pulls keyframe 8 by 0.4 m; keyframes 12 and 16, added afterwards, are placed by
    odometry from the corrected 8: their frames and points carry the same correction (the
    correction is the estimate against the stream's own pose, whatever value a node began from)."""
    gmap, poses = _map_pulled_at_frame_8(tiny, 17)
    for i in range(9, 17):
        gmap.add(prediction(i, poses[i]), _frame(i))
    for moment in ("streaming", "finished"):
        for i in (8, 10, 12, 16):
            corrected, _ = gmap.correct_pose(i, poses[i])
            assert corrected[1, 3] == pytest.approx(0.4, abs=1e-3), (moment, i)
            assert corrected[0, 3] == pytest.approx(poses[i][0, 3], abs=1e-3), (moment, i)
        for key in (12, 16):
            np.testing.assert_allclose(gmap.correct_pose(key, poses[key])[0][:, 3], gmap.graph.estimate(key).t,
                                       atol=1e-9)
        gmap.finish()


def test_frames_must_reach_the_map_in_order_and_keyframes_with_their_image(tiny):
    gmap = GlobalMap(tiny, MapConfig(keyframe_every=2))
    gmap.add(prediction(0, np.eye(4)), _frame(0))
    with pytest.raises(ValueError, match="in order"):
        gmap.add(prediction(0, np.eye(4)), _frame(0))
    with pytest.raises(ValueError, match="its image is needed"):
        gmap.add(prediction(2, np.eye(4)), None)


@pytest.mark.parametrize("bad", [dict(keyframe_every=0), dict(capacity=8), dict(min_similarity=1.5),
                                 dict(odometry_sigma=(0.1, 0.0, 0.1)), dict(outlier_rejection="cauchy")])
def test_bad_settings_are_refused_with_their_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        MapConfig(**bad)


def test_an_endless_stream_keeps_the_map_within_its_bound(tiny):
    """20,000 frames: the map holds at most `capacity` keyframes (nodes, descriptors, images),
    its edges stay in proportion, and the process does not grow with the stream."""
    cfg = MapConfig(keyframe_every=10, capacity=64, min_similarity=1.0)
    gmap = GlobalMap(tiny, cfg)
    rng = np.random.default_rng(0)
    T = np.eye(4)
    rss = {}
    for i in range(20_000):
        step = np.eye(4)
        step[:3, 3] = rng.normal(scale=0.02, size=3)
        T = T @ step
        gmap.add(prediction(i, T), _frame(i) if i % 10 == 0 else None)
        if i in (4_999, 19_999):
            rss[i] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert len(gmap.keyframes) <= cfg.capacity
    assert len(gmap.graph) == len(gmap.keyframes) == len(gmap.places) <= cfg.capacity
    assert len(gmap.graph.edges) <= 2 * cfg.capacity
    assert gmap.stats()["merged_away"] == 2_000 - len(gmap.keyframes)
    assert gmap.stats()["bytes"] <= cfg.capacity * max(kf.nbytes for kf in gmap.keyframes.values())
    assert len(gmap.rejected) <= KEPT_REJECTIONS
    # The peak resident size after 20,000 frames is the one after 5,000 (plus allocator noise).
    assert rss[19_999] - rss[4_999] < 64 * 1024  # KiB
    # Frames of every era still get a correction (from the keyframes kept around them).
    gmap.finish()
    for i in (0, 10_001, 19_999):
        assert np.isfinite(gmap.correct_pose(i, np.eye(4))[0]).all()


def test_the_background_map_equals_the_map_run_in_the_foreground(tiny):
    cfg = MapConfig(keyframe_every=2, min_similarity=1.0)
    poses = walk(30)
    front = GlobalMap(tiny, cfg)
    back = BackgroundMap(tiny, cfg)
    for i in range(30):
        front.add(prediction(i, poses[i]), _frame(i))
        back.submit(prediction(i, poses[i]), _frame(i))
    front.finish()
    behind = back.finish()
    assert behind.graph.keys == front.graph.keys
    for key in front.graph.keys:
        np.testing.assert_allclose(behind.keyframes[key].descriptor, front.keyframes[key].descriptor)


def test_a_resumed_run_hands_the_map_the_window_joins_the_stream_marked(tiny, tmp_path):
    """The frames an earlier run finished reach the map from the frame store with their
    scale-frame marks, so the odometry edges across its window joins are weighed as joins."""
    from mapstream.pipeline.frame_store import FrameStore
    from mapstream.pipeline.loop_closure import MapRun

    cfg = MapConfig(keyframe_every=4, min_similarity=1.0)
    poses = walk(24)
    marks = [i in (0, 1, 10, 11, 19) for i in range(24)]  # windows start at frames 0, 10 and 19
    live = GlobalMap(tiny, cfg)
    store = FrameStore(tmp_path, {"c": 1}, shard_frames=5)
    for i in range(24):
        pred = prediction(i, poses[i], scale_frame=marks[i])
        live.add(pred, _frame(i))
        store.add({"image": (_frame(i).permute(1, 2, 0) * 255 + 0.5).to(torch.uint8).numpy(),
                   "depth": pred.depth.numpy(), "depth_conf": pred.depth_conf.numpy(),
                   "T_world_cam": pred.T_world_cam.numpy(), "K": pred.K.numpy(), "pose_enc": pred.pose_enc.numpy(),
                   "keyframe": True, "scale_frame": marks[i], "index": i, "name": f"{i}", "time": float(i)})
    store.flush()
    resumed = MapRun(tiny, cfg)
    resumed.resume(store.assemble(), store.scale_frames())
    gmap = resumed.finish()
    joined = [k for k in gmap.graph.keys if gmap.keyframes[k].joined]
    assert joined == [12, 20]  # the first keyframes after the joins at frames 10 and 19
    assert joined == [k for k in live.graph.keys if live.keyframes[k].joined]
    assert gmap.stats()["window_joins"] == live.stats()["window_joins"] == 2
    with pytest.raises(ValueError, match="3 scale-frame marks for 24 frames"):
        MapRun(tiny, cfg).resume(store.assemble(), np.zeros(3, dtype=bool))


def test_the_odometry_edge_across_a_window_join_is_join_factor_times_as_uncertain(tiny):
    gmap = GlobalMap(tiny, MapConfig(keyframe_every=2, min_similarity=1.0, join_factor=3.0))
    poses = walk(9)
    for i in range(9):  # the first window's scale frames 0-1, the next window's 5-6
        gmap.add(prediction(i, poses[i], scale_frame=i in (0, 1, 5, 6)), _frame(i))
    sigmas = {(e.i, e.j): e.sigmas for e in gmap.graph.edges}
    assert list(sigmas) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    np.testing.assert_allclose(sigmas[(4, 6)], 3.0 * sigmas[(2, 4)])  # keyframe 6 comes after the join at 5
    np.testing.assert_allclose(sigmas[(6, 8)], sigmas[(2, 4)])
    assert gmap.stats()["window_joins"] == 1


def test_a_failure_on_the_map_thread_is_raised_on_the_stream_thread(tiny):
    back = BackgroundMap(tiny, MapConfig(keyframe_every=1))
    back.submit(prediction(3, np.eye(4)), _frame(0))
    back.submit(prediction(1, np.eye(4)), _frame(1))  # out of order: fails on the map thread
    with pytest.raises(RuntimeError, match="in order"):
        back.finish()


def test_known_poses_on_a_tenth_of_the_frames_give_the_map_their_frame_and_metric_scale(tiny):
    """A stream predicted at 0.4 of the metric scale, in its own frame: poses known (metric, in
    a world of their own) for every 10th frame give the map that frame and scale, to 2 %."""
    rng = np.random.default_rng(3)
    n = 120
    truth = np.tile(np.eye(4), (n, 1, 1))
    angle = np.linspace(0, 1.5 * np.pi, n)
    truth[:, 0, 3], truth[:, 1, 3], truth[:, 2, 3] = 3 * np.cos(angle), 2 * np.sin(angle), 0.1 * np.sin(5 * angle)
    world = Sim3(np.array([[0, -1, 0], [1, 0, 0], [0, 0, 1.0]]), np.array([5.0, -2.0, 1.0]), 1.0)
    stream = world.inverse().apply_poses(truth)  # the stream's frame: another world ...
    stream[:, :3, 3] *= 0.4  # ... and scale
    stream[:, :3, 3] += rng.normal(scale=0.004, size=(n, 3))  # and its noise
    gmap = GlobalMap(tiny, MapConfig(keyframe_every=4, min_similarity=1.0))
    for i in range(n):
        gmap.add(prediction(i, stream[i]), _frame(i))
    gmap.finish()
    known = {i: (truth[i], stream[i]) for i in range(0, n, 10)}
    report = gmap.apply_known_poses(known)
    assert report["known_poses"] == 12
    assert report["scale_to_known"] == pytest.approx(2.5, rel=0.02)
    corrected = np.stack([gmap.correct_pose(i, stream[i])[0] for i in range(n)])
    fit = umeyama(corrected[:, :3, 3], truth[:, :3, 3], with_scale=True)
    assert fit.s == pytest.approx(1.0, abs=0.02)  # metric
    error = np.linalg.norm(corrected[:, :3, 3] - truth[:, :3, 3], axis=1)  # and in the known frame (metres)
    assert np.median(error) < 0.1 and error.max() < 0.2
    # Depth scales with the map: a frame's correction carries the factor to metric depth.
    assert gmap.correct_pose(55, stream[55])[1] == pytest.approx(2.5, rel=0.02)


class _AcceptEverything:
    """A verifier that accepts each candidate with the stream's own relative pose."""

    def check(self, candidate_side, query_side, *, candidate, query, similarity, **_):
        from mapstream.globalmap.loops import LoopCheck

        check = LoopCheck(candidate.index, query.index, similarity, accepted=True, reason="accepted")
        check.relative = candidate.pose.inverse().compose(query.pose)
        return check


@pytest.mark.parametrize("depth", [0.5, 2.0, 40.0])
def test_a_loop_edge_is_as_uncertain_in_translation_as_the_candidates_depth_says(tiny, depth):
    """The loop sigma's translation is a fraction of the candidate keyframe's median depth,
    as odometry's is: the same setting serves a scene predicted at any scale."""
    cfg = MapConfig(keyframe_every=2, temporal_gap=4, min_similarity=0.0, loop_cooldown=100)
    gmap = GlobalMap(tiny, cfg)
    gmap.verifier = _AcceptEverything()
    poses = walk(12, step=0.01 * depth)
    for i in range(12):
        gmap.add(prediction(i, poses[i], depth=depth), _frame(i))
    loops = [e for e in gmap.graph.edges if e.kind == "loop"]
    assert len(loops) == 1
    rot, trans, scale = cfg.loop_sigma
    np.testing.assert_allclose(loops[0].sigmas, [rot, trans * depth, scale], rtol=1e-6)
