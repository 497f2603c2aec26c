"""How a run streams its input: `mapstream.pipeline.plan_stream`."""
import math

import pytest

from mapstream.config import StreamConfig
from mapstream.pipeline import plan_stream


@pytest.mark.parametrize("mode, length, given, expected", [
    ("streaming", 320, None, 1), ("streaming", 321, None, 2), ("streaming", 1000, None, 4),
    ("streaming", None, None, "auto"), ("windowed", 1000, None, 1), ("windowed", None, None, 1),
    ("streaming", 1000, 3, 3), ("streaming", None, "auto", "auto"), ("windowed", 1000, 2, 2),
    ("auto", 1000, None, 4), ("auto", None, None, "auto"),
])
def test_weights_that_record_nothing_keep_the_reference_s_plan(mode, length, given, expected):
    """The official weights record no clip length: "auto" streams through one cache, and an
    unset keyframe interval stores every ceil(N / 320)-th of N frames (the reference demo's
    rule), chooses by motion on a live input of unknown length, and every frame of a window."""
    plan = plan_stream(mode, StreamConfig(keyframe_interval=given), length, None)
    assert plan.mode == ("streaming" if mode == "auto" else mode)
    assert plan.stream.keyframe_interval == expected and plan.reason == ""
    assert plan.stream.window_size == 64  # untouched


@pytest.mark.parametrize("length", [49, 96, 10_000, None])
def test_auto_runs_windows_of_the_clip_length_the_weights_record_on_longer_inputs(length):
    """Weights that record their clips' length (48) run an input that is, or may be, longer in
    windows of 48 stored frames, every frame stored, the overlap and other settings as given."""
    given = StreamConfig(overlap=12, num_scale_frames=6, sliding_window=32)
    plan = plan_stream("auto", given, length, 48)
    assert plan.mode == "windowed"
    # A live input's shared frames come from the earlier window, without waiting for the next.
    shared_from = "earlier" if length is None else "later"
    assert plan.stream == given.with_settings(window_size=48, keyframe_interval=1, shared_from=shared_from)
    assert "48 frames" in plan.reason and "--mode streaming" in plan.reason
    assert ("may run longer" if length is None else f"has {length}") in plan.reason


@pytest.mark.parametrize("length, expected", [(1, 1), (24, 1), (48, 1)])
def test_auto_streams_an_input_within_the_recorded_clip_length(length, expected):
    plan = plan_stream("auto", StreamConfig(), length, 48)
    assert (plan.mode, plan.stream.keyframe_interval, plan.reason) == ("streaming", expected, "")


@pytest.mark.parametrize("settings, views", [
    ({"keyframe_interval": 2}, 48),  # the user's keyframes: one cache, as asked
    ({"keyframe_interval": "auto"}, 48),
    ({"keyframe_interval": 1}, 48),
    ({}, 8),  # a window of only the scale frames
    ({"overlap": 48}, 48),  # a window of only the overlap
    ({"num_scale_frames": 48}, 48),
])
def test_auto_keeps_one_cache_where_windows_cannot_serve(settings, views):
    plan = plan_stream("auto", StreamConfig(**settings), 500, views)
    assert plan.mode == "streaming" and plan.reason == ""
    assert plan.stream.keyframe_interval == settings.get("keyframe_interval", math.ceil(500 / views))


@pytest.mark.parametrize("length, expected", [(48, 1), (49, 2), (96, 2), (97, 3), (None, "auto")])
def test_one_cache_stores_frames_within_the_recorded_clip_length(length, expected):
    """--mode streaming with weights that record 48: every ceil(N / 48)-th frame stored."""
    plan = plan_stream("streaming", StreamConfig(), length, 48)
    assert (plan.mode, plan.stream.keyframe_interval) == ("streaming", expected)


def test_explicit_windows_keep_their_own_size():
    plan = plan_stream("windowed", StreamConfig(window_size=20), 500, 48)
    assert (plan.mode, plan.stream.window_size, plan.stream.keyframe_interval) == ("windowed", 20, 1)


def test_a_run_s_plan_gives_final_predictions_only():
    for mode in ("auto", "streaming", "windowed"):
        assert plan_stream(mode, StreamConfig(provisional=True), 100, 48).stream.provisional is False


def test_an_unknown_mode_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="mode must be one of auto, streaming, windowed, got 'online'"):
        plan_stream("online", StreamConfig(), 10, None)
