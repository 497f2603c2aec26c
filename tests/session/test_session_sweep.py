"""The fast path against the plain one over a seeded sweep of settings (tiny preset, CPU).

Fixed cases elsewhere check each mechanism; this sweep draws the settings a user may pick
together (frame size, scale frames, window, trajectory capacity, keyframe policy, graph
decomposition, stream length) so that their combinations are checked too. A one-frame scale
phase, which no fixed case had, once took the graphs built for the frames after it.
"""
from __future__ import annotations

import random

import pytest
import torch

import mapstream


def _settings(seed: int) -> dict:
    rng = random.Random(seed)
    return {
        "hw": rng.choice([(14, 14), (28, 14), (14, 70), (42, 28)]),
        "scale": rng.choice([1, 2, 3]),
        "window": rng.choice([1, 2, 5]),
        "capacity": rng.choice([None, 2, 3]),
        "keyframes": rng.choice([1, 2, 3, "auto"]),
        "frames": rng.randint(1, 10),
        "fast": rng.choice([True, "pieces", "whole"]),
    }


SETTINGS = [_settings(seed) for seed in range(12)]


@pytest.fixture(scope="module")
def model():
    return mapstream.fill_synthetic_(mapstream.build_model("tiny")).eval()


@pytest.mark.parametrize("settings", SETTINGS, ids=[str(i) for i in range(len(SETTINGS))])
def test_fast_sessions_equal_plain_ones_across_settings(model, settings):
    """Same predictions and keyframe decisions frame for frame, through `run_frames` and
    `run`; a reset replays the sequence bit for bit."""
    s = settings
    x = torch.rand(s["frames"], 3, *s["hw"], generator=torch.Generator().manual_seed(len(str(s))))
    options = dict(num_scale_frames=s["scale"], keyframe_interval=s["keyframes"], cache_scale_frames=s["scale"],
                   sliding_window=s["window"], trajectory_capacity=s["capacity"])
    with model.session(**options) as plain:
        want = plain.run_frames(x)
    with model.session(**options, fast=s["fast"]) as fast:
        got = fast.run_frames(x)
        fast.reset()
        again = fast.run_frames(x)
        fast.reset()
        stacked = fast.run(x)
    assert [p.index for p in got] == [p.index for p in want] == list(range(s["frames"]))
    for i, (a, b, c) in enumerate(zip(got, want, again)):
        torch.testing.assert_close(a.pose_enc, b.pose_enc, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.depth, b.depth, rtol=1e-4, atol=1e-5)
        assert a.keyframe == b.keyframe
        assert torch.equal(a.pose_enc, c.pose_enc) and torch.equal(a.depth, c.depth)
        torch.testing.assert_close(stacked["pose_enc"][0, i], b.pose_enc, rtol=1e-4, atol=1e-4)
