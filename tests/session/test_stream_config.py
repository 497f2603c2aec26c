"""StreamConfig: the one declaration of every stream setting, checked where it is made."""
from __future__ import annotations

import dataclasses

import pytest

import mapstream
from mapstream.config import StreamConfig


@pytest.mark.parametrize("settings, message", [
    ({"num_scale_frames": 0}, "num_scale_frames must be >= 1, got 0"),
    ({"cache_scale_frames": -1}, "cache_scale_frames must be >= 0, got -1"),
    ({"sliding_window": 2.5}, "sliding_window must be an integer >= 1, got 2.5"),
    ({"trajectory_capacity": 1}, r"trajectory_capacity must be >= 2 or None \(unbounded\), got 1"),
    ({"keyframe_interval": "often"}, "keyframe_interval must be an int k >= 0, 'auto'"),
    ({"keyframe_interval": -1}, "keyframe_interval must be >= 0, got -1"),
    ({"precision": "fp64"}, "precision must be one of auto, fp32, bf16, fp16, got 'fp64'"),
    ({"backend": "cudnn"}, "backend must be one of auto, sdpa"),
    ({"fast": "graphs"}, "fast must be False, True, 'auto', 'pieces' or 'whole', got 'graphs'"),
    ({"window_size": 0}, "window_size must be >= 1, got 0"),
    ({"overlap": -1}, "overlap must be >= 0, got -1"),
    ({"shared_from": "last"}, "shared_from must be one of earlier, later, got 'last'"),
    ({"window_join": "median"}, "window_join must be one of shared, anchor, got 'median'"),
])
def test_a_setting_no_stream_can_run_with_is_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        StreamConfig(**settings)
    with pytest.raises(ValueError, match=message):  # as a session's keyword too
        mapstream.build_model("tiny").session(**settings)


def test_settings_are_changed_by_name_only_and_every_field_says_what_it_is():
    config = StreamConfig().with_settings(sliding_window=8, trajectory_capacity=None)
    assert (config.sliding_window, config.trajectory_capacity) == (8, None)
    with pytest.raises(TypeError, match="unknown stream setting window; StreamConfig has"):
        config.with_settings(window=8)
    import ast
    import inspect

    documented = set()
    body = ast.parse(inspect.getsource(StreamConfig)).body[0].body
    for field, after in zip(body, body[1:]):
        if isinstance(field, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            documented.add(field.target.id)
    assert documented == {f.name for f in dataclasses.fields(StreamConfig)}


def test_the_scale_frames_set_the_cache_anchors_unless_the_cache_keeps_its_own_count():
    assert StreamConfig(num_scale_frames=4).cache_spec().anchor_frames == 4
    assert StreamConfig(num_scale_frames=4, cache_scale_frames=8).cache_spec().anchor_frames == 8
    spec = StreamConfig(num_scale_frames=4, sliding_window=16, include_scale_frames=False).cache_spec()
    assert (spec.anchor_frames, spec.window_frames) == (0, 20)
    # The reference's constructor: kv_cache_scale_frames alone sets both; with num_frame_for_scale, the cache its own.
    assert mapstream.build_model("tiny", kv_cache_scale_frames=4).stream_config.num_scale_frames == 4
    both = mapstream.build_model("tiny", kv_cache_scale_frames=8, num_frame_for_scale=2).stream_config
    assert (both.num_scale_frames, both.anchor_frames) == (2, 8)
