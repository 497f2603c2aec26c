"""The online windowed session against the offline windowed inference (tiny preset)."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import mapstream
from mapstream.windowed import WindowedSession


@pytest.fixture(scope="module")
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


def frames_of(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 28, 42, generator=g)


@pytest.mark.parametrize("join", ["anchor", "shared"])
@pytest.mark.parametrize("overlap, scale, interval, n", [(2, 2, 1, 20), (3, 2, 2, 23), (1, 2, 1, 13), (3, 2, 1, 14), (7, 2, 1, 9)])
def test_online_windows_equal_the_offline_ones(model, overlap, scale, interval, n, join):
    """Also where windows overlap by more than they advance, so that a frame lies in three
    windows (the next window is aligned on the previous window's own predictions, not on
    the earlier ones emitted), and where the overlap asked for is as long as the window
    (last case): both cut it to the window's length minus one, and neither loses a frame.
    The reference's join is what its `inference_windowed` takes; mapstream's own through
    `windowed_inference` with the same settings."""
    x = frames_of(n, seed=overlap + n)
    settings = dict(window_size=5, overlap=overlap, num_scale_frames=scale, keyframe_interval=interval)
    if join == "anchor":
        offline = model.inference_windowed(
            x, window_size=5, overlap_size=overlap, num_scale_frames=scale, keyframe_interval=interval,
            return_windows=True,
        )
    else:
        offline = mapstream.windowed_inference(
            model, x, model.stream_config.with_settings(**settings), return_windows=True
        )
    with WindowedSession(model, **settings, shared_from="earlier", window_join=join) as online:
        preds = online.run_frames(x)
        transforms = online.transforms
        overlap = online.overlap
    assert offline["pose_enc"].shape[1] == n
    assert [p.index for p in preds] == list(range(n))
    # Same alignment transforms as the offline stitch.
    torch.testing.assert_close(torch.stack([t.scale for t in transforms], 1), offline["chunk_scales"])
    torch.testing.assert_close(torch.stack([t.matrix() for t in transforms], 1), offline["chunk_transforms"])
    # Frames shared by two windows come from the earlier window online, from the later one
    # offline; every other frame is identical.
    span = offline["windows"][0]["pose_enc"].shape[1]
    step = span - overlap
    shared = {k * step + o for k in range(1, len(transforms)) for o in range(overlap)}
    pose = torch.stack([p.pose_enc for p in preds])
    depth = torch.stack([p.depth for p in preds])
    for i in range(n):
        if i not in shared:
            torch.testing.assert_close(pose[i], offline["pose_enc"][0, i])
            torch.testing.assert_close(depth[i], offline["depth"][0, i, ..., 0])
    # Keyframe flags: online frame i is flagged by the window that emitted it.
    assert all(p.keyframe == offline["windows"][0]["is_keyframe"][0, i].item() for i, p in enumerate(preds[:span]))


def test_an_overlap_cut_to_the_window_is_told_online_as_offline(model, caplog):
    """An overlap as long as the window is cut to the window minus one frame by both; the offline
    plan said so and the online session (what `mapstream run --mode windowed` uses) kept quiet."""
    with caplog.at_level(logging.WARNING):
        WindowedSession(model, window_size=5, overlap=7, num_scale_frames=2).close()
    assert "an overlap of 7 frames does not fit windows of 5 frames; using 4" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        WindowedSession(model, window_size=5, overlap=4, num_scale_frames=2).close()
    assert "does not fit" not in caplog.text


def test_long_stream_runs_in_per_window_memory(model, monkeypatch):
    """The cache holds one window's frames; the session keeps the latest KEPT_TRANSFORMS
    windows' transforms, the newest last."""
    monkeypatch.setattr(mapstream.windowed.online, "KEPT_TRANSFORMS", 10)
    x = frames_of(8, seed=9)
    with WindowedSession(model, window_size=6, overlap=2, num_scale_frames=2) as online:
        held = None
        for i in range(400):
            online.step(x[i % 8])
            if i == 50:
                held = online.stats()["aggregator"].bytes_held
            if online.stats()["windows"] == 12 and online._pending is None:
                twelfth = online.transforms[-1]
        assert online.stats()["aggregator"].bytes_held == held
        assert online.stats()["windows"] == 1 + (400 - 6 + 3) // 4
        assert len(online.transforms) == 10 and online.transforms[-1] is online._sim
        assert all(t is not twelfth for t in online.transforms)  # the oldest were let go


def test_five_thousand_frames_run_in_per_window_memory(model):
    """Issue 4: a tiny-preset run over 5,000 frames completes with per-window memory."""
    x = frames_of(8, seed=11)[:, :, :14, :14]
    with WindowedSession(model, window_size=8, overlap=2, num_scale_frames=2) as online:
        emitted = 0
        for i in range(5000):
            emitted += len(online.step(x[i % 8]))
            if i == 100:
                held = (online.stats()["aggregator"].bytes_held, online.stats()["camera"].bytes_held)
        emitted += len(online.flush())
        assert (online.stats()["aggregator"].bytes_held, online.stats()["camera"].bytes_held) == held
    assert emitted == 5000


def test_a_batch_of_sequences_is_windowed_as_each_sequence_alone(model):
    """Windowed inference of [B, S, 3, H, W] equals each sequence's own (the reference
    paired keyframes from batch element 0 only, LIMITS.md 14); per-window raw predictions
    come back per sequence."""
    x = torch.stack([frames_of(11, seed=s) for s in (4, 5)])
    together = model.inference_windowed(x, window_size=5, overlap_size=2, num_scale_frames=2, return_windows=True)
    assert together["alignment_mode"] == "scaled" and len(together["windows"]) == 2
    for b in range(2):
        alone = model.inference_windowed(x[b], window_size=5, overlap_size=2, num_scale_frames=2, return_windows=True)
        tensors = [k for k, v in alone.items() if torch.is_tensor(v)]
        assert {"pose_enc", "depth", "chunk_scales", "chunk_transforms", "is_keyframe"} <= set(tensors)
        for key in tensors:
            assert torch.equal(together[key][b : b + 1], alone[key]), key
        for got, want in zip(together["windows"][b], alone["windows"]):
            assert torch.equal(got["pose_enc"], want["pose_enc"])


@pytest.mark.parametrize("window_size, overlap, message", [
    (0, 2, "window_size must be >= 1, got 0"),
    (-3, 2, "window_size must be >= 1, got -3"),
    (5, 0, "an overlap of 0 frames leaves consecutive windows no frame to align them on"),
])
def test_online_windows_refuse_what_the_offline_plan_refuses_and_an_overlap_of_nothing(model, window_size, overlap, message):
    """A window of no slots is refused as offline (it used to run silently as windows of the
    scale frames); an overlap of 0 is told as such, not as a window too short."""
    with pytest.raises(ValueError, match="window_size must be >= 1") if window_size < 1 else contextlib.nullcontext():
        model.inference_windowed(frames_of(9), window_size=window_size, overlap_size=2, num_scale_frames=2)
    with pytest.raises(ValueError, match=message):
        WindowedSession(model, window_size=window_size, overlap=overlap, num_scale_frames=2)


@pytest.mark.parametrize("interval", ["auto", 1.5, True, -1])
def test_windows_need_a_fixed_keyframe_interval(model, interval):
    """Windows are planned from the interval before any frame is seen: motion-based keyframes
    are refused offline (once a TypeError from inside the plan) and online alike."""
    message = "windowed inference needs a fixed keyframe interval" if interval == "auto" else "keyframe_interval must be"
    with pytest.raises(ValueError, match=message):
        model.inference_windowed(frames_of(9), window_size=4, overlap_size=2, num_scale_frames=2,
                                 keyframe_interval=interval)
    with pytest.raises(ValueError, match=message):
        WindowedSession(model, window_size=4, overlap=2, num_scale_frames=2, keyframe_interval=interval)


@pytest.mark.parametrize("window_size, frames, warned", [(6, 10, True), (4, 10, False), (2, 10, False), (6, 4, False)])
def test_windows_that_outgrow_the_cache_say_so_and_keep_the_reference_outputs(window_size, frames, warned, caplog):
    """A window of more stored frames than the cache's scale frames and sliding window evicts
    its own oldest keyframes, as the reference does (its outputs are kept), now with a
    warning that says by how much to raise the sliding window. Offline, a sequence shorter
    than a window stores only its own frames; online, the length is not known in advance."""
    small = mapstream.fill_synthetic_(
        mapstream.build_model("tiny", kv_cache_scale_frames=2, kv_cache_sliding_window=2)
    ).eval()
    wide = mapstream.fill_synthetic_(
        mapstream.build_model("tiny", kv_cache_scale_frames=2, kv_cache_sliding_window=8)
    ).eval()
    x = frames_of(frames, seed=4)
    options = dict(window_size=window_size, overlap_size=2, num_scale_frames=2)
    with caplog.at_level("WARNING", logger="mapstream.windowed.plan"):
        evicting = small.inference_windowed(x, **options)
    assert ("by 2 to keep whole windows" in caplog.text) == warned
    caplog.clear()
    with caplog.at_level("WARNING", logger="mapstream.windowed.plan"):
        WindowedSession(small, window_size=window_size, overlap=2, num_scale_frames=2).close()
    assert ("exceed the 4 the cache keeps" in caplog.text) == (window_size > 4)
    whole = wide.inference_windowed(x, **options)
    assert torch.equal(evicting["pose_enc"], whole["pose_enc"]) != warned  # eviction changes the outputs


def test_only_the_median_scale_estimator_exists(model):
    with pytest.raises(ValueError, match="scale_mode must be 'median'"):
        model.inference_windowed(frames_of(6), window_size=4, overlap_size=2, num_scale_frames=2, scale_mode="mean")


@pytest.mark.parametrize("overlap, scale, interval, n", [(2, 2, 1, 20), (3, 2, 2, 23), (1, 2, 1, 13), (3, 2, 1, 14),
                                                         (7, 2, 1, 9), (2, 3, 1, 11), (4, 2, 1, 16)])
def test_shared_frames_from_the_later_window_are_the_offline_stitch(model, overlap, scale, interval, n):
    """shared_from="later": every frame, shared or not, is the offline result, in order, each
    emitted once; a window's last `overlap` frames wait for the next window (or the end)."""
    x = frames_of(n, seed=overlap + n)
    offline = model.inference_windowed(
        x, window_size=5, overlap_size=overlap, num_scale_frames=scale, keyframe_interval=interval
    )
    emitted_after: dict[int, int] = {}
    with WindowedSession(model, window_size=5, overlap=overlap, num_scale_frames=scale,
                         keyframe_interval=interval, shared_from="later", window_join="anchor") as online:
        preds = []
        for fed, frame in enumerate(x):
            for p in online.step(frame):
                emitted_after[p.index] = fed
                preds.append(p)
        preds += online.flush()
        span, overlap = online.span, online.overlap
    assert [p.index for p in preds] == list(range(n))
    torch.testing.assert_close(torch.stack([p.pose_enc for p in preds]), offline["pose_enc"][0])
    torch.testing.assert_close(torch.stack([p.depth for p in preds]), offline["depth"][0, ..., 0])
    torch.testing.assert_close(torch.stack([p.depth_conf for p in preds]), offline["depth_conf"][0])
    # Each frame comes from the last window holding it, so it is emitted no sooner than that
    # window opened: window k (k >= 1) starts at frame k * step and opens when frame
    # (k - 1) * step + span arrives; it exists when that frame does.
    step = span - overlap
    opened = [0] + [(k - 1) * step + span for k in range(1, n) if (k - 1) * step + span < n]
    for i, fed in emitted_after.items():
        last = max(k for k in range(len(opened)) if k * step <= i)
        assert fed >= opened[last], (i, fed, opened[last])


def test_shared_from_takes_only_the_two_choices(model):
    with pytest.raises(ValueError, match="shared_from must be one of earlier, later"):
        WindowedSession(model, window_size=5, overlap=2, num_scale_frames=2, shared_from="last")


def test_provisional_predictions_are_refused_by_a_windowed_session(model):
    """Its windows' scale phases would give provisional predictions in the window's own frame."""
    with pytest.raises(ValueError, match="a windowed session gives final predictions only: make it with provisional"):
        WindowedSession(model, window_size=5, overlap=2, num_scale_frames=2, provisional=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_scale_frames": 2.5}, "num_scale_frames must be an integer >= 1, got 2.5"),
    ({"num_scale_frames": "2"}, "num_scale_frames must be an integer >= 1, got '2'"),
    ({"num_scale_frames": 0}, "num_scale_frames must be >= 1, got 0"),
    ({"window_size": 4.5}, "window_size must be an integer >= 1, got 4.5"),
    ({"overlap_size": 1.5}, "overlap_size must be an integer >= 0, got 1.5"),
    ({"overlap_keyframes": 1.5}, "overlap_keyframes must be an integer >= 0, got 1.5"),
])
def test_counts_that_are_not_whole_numbers_are_refused_offline_online_and_streaming(kwargs, message):
    """A count given as a float or a string is refused up front with its name, never rounded
    or failed deep inside a slice; a scale phase of no frame is refused windowed as streaming."""
    import mapstream

    model = mapstream.build_model("tiny")
    frames = torch.zeros(7, 3, 28, 28)
    offline = {"window_size": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.inference_windowed(frames, **offline)
    online = {("overlap" if k == "overlap_size" else k): v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message.replace("overlap_size", "overlap")):
        mapstream.WindowedSession(model, **{"window_size": 3, **online})
    if set(kwargs) == {"num_scale_frames"}:
        with pytest.raises(ValueError, match=message):
            model.inference_streaming(frames, **kwargs)
        with pytest.raises(ValueError, match=message):
            model.session(**kwargs)
