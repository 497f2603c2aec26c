"""Window planning: the reference's rules, narrated on small cases."""
from __future__ import annotations

import pytest

from mapstream.windowed import plan_windows


def test_golden_cases():
    # 8 frames, window 4 slots, overlap 2: windows start 2 apart.
    assert plan_windows(8, window_size=4, scale_frames=2, overlap_size=2).windows == ((0, 4), (2, 6), (4, 8))
    # keyframe interval 2: a window spans 2 + (4 - 2) * 2 = 6 frames.
    plan = plan_windows(10, window_size=4, scale_frames=2, overlap_size=2, keyframe_interval=2)
    assert plan.windows == ((0, 6), (4, 10)) and plan.span == 6


def test_demo_defaults_on_1000_frames():
    plan = plan_windows(1000, window_size=64, scale_frames=8, overlap_size=16)
    assert plan.span == 64 and plan.overlap == 16
    assert plan.windows[:3] == ((0, 64), (48, 112), (96, 160))
    assert plan.windows[-1][1] == 1000
    starts = [s for s, _ in plan.windows]
    assert all(b - a == 48 for a, b in zip(starts, starts[1:]))


def test_single_window_when_the_sequence_fits():
    assert plan_windows(10, window_size=16, scale_frames=8).windows == ((0, 10),)


def test_overlap_in_keyframes():
    plan = plan_windows(100, window_size=10, scale_frames=4, overlap_keyframes=3, keyframe_interval=2)
    assert plan.overlap == 6  # max(scale 4, 3 keyframes x interval 2)
    plan = plan_windows(100, window_size=10, scale_frames=4, overlap_keyframes=1, keyframe_interval=2)
    assert plan.overlap == 4


def test_overlap_defaults_to_scale_frames_and_is_capped():
    assert plan_windows(50, window_size=10, scale_frames=3).overlap == 3
    assert plan_windows(3, window_size=8, scale_frames=1, overlap_size=10).overlap == 2  # one window


@pytest.mark.parametrize("n, window_size, scale, overlap_keyframes, interval", [(18, 4, 5, 2, 3), (12, 2, 3, None, 1)])
def test_an_overlap_as_long_as_the_window_is_cut_to_all_frames_but_one(n, window_size, scale, overlap_keyframes, interval):
    """The reference kept only windows at least `overlap` long: with an overlap as long as
    the window every window but the last was dropped, frames and all (LIMITS 22). The
    overlap is cut to the window's length minus one: windows one frame apart, every frame
    covered, each window sharing its first `overlap` frames with the previous one's last."""
    plan = plan_windows(n, window_size=window_size, scale_frames=scale, overlap_size=scale + 5,
                        overlap_keyframes=overlap_keyframes, keyframe_interval=interval)
    assert plan.overlap == plan.span - 1
    assert plan.windows == tuple((i, i + plan.span) for i in range(n - plan.span + 1))
    with pytest.raises(ValueError, match="no room for the overlap"):
        plan_windows(5, window_size=1, scale_frames=1, overlap_size=3)


@pytest.mark.parametrize("n", [1, 7, 33, 101])
def test_windows_cover_every_frame(n):
    plan = plan_windows(n, window_size=6, scale_frames=2, overlap_size=2)
    covered = set()
    for start, end in plan.windows:
        covered.update(range(start, end))
    assert covered == set(range(n))


def test_invalid_arguments():
    with pytest.raises(ValueError):
        plan_windows(0, window_size=4, scale_frames=2)
    with pytest.raises(ValueError):
        plan_windows(10, window_size=0, scale_frames=2)


@pytest.mark.parametrize("seed", range(200))
def test_plans_cover_every_frame_and_windows_share_exactly_the_overlap(seed):
    """Over random settings: the windows cover every frame once their overlaps are counted,
    every window but possibly the last spans `span` frames, consecutive windows share exactly
    `overlap` frames, and the overlap is shorter than a window (the frames the next window is
    aligned on exist in both). The reference's rule broke the first two when the overlap was as
    long as the window (LIMITS 22)."""
    import random

    rng = random.Random(seed)
    n, window_size, scale = rng.randint(1, 40), rng.randint(1, 12), rng.randint(1, 8)
    overlap_size, overlap_keyframes = rng.choice([None, 0, 1, 2, 5, 20]), rng.choice([None, 1, 3])
    interval = rng.randint(1, 3)
    try:
        plan = plan_windows(n, window_size=window_size, scale_frames=scale, overlap_size=overlap_size,
                            overlap_keyframes=overlap_keyframes, keyframe_interval=interval)
    except ValueError as e:  # windows of a single frame cannot share one
        assert "no room for the overlap" in str(e)
        return
    windows = plan.windows
    assert windows[0][0] == 0 and windows[-1][1] == n
    assert all(end - start == plan.span for start, end in windows[:-1])
    if len(windows) > 1:
        assert plan.overlap < plan.span
        for (_, prev_end), (start, _) in zip(windows, windows[1:]):
            assert prev_end - start == plan.overlap
