"""Motion-chosen keyframes: the same camera motion stores the same frames at any frame width."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mapstream.keyframes import AUTO_THRESHOLD, AUTO_WIDTH, FlowKeyframes, make_policy, mean_flow


def panning_wall(width: int, frames: int, step_deg: float):
    """Predictions of a camera that pans `step_deg` a frame in front of a wall 2 m away,
    at a 70-degree horizontal field of view and frames `width` pixels wide (4:7)."""
    height = width * 4 // 7
    f = width / 2 / math.tan(math.radians(35))
    K = torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=torch.float64)
    out = []
    for i in range(frames):
        a = math.radians(step_deg * i)
        R = torch.tensor([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]], dtype=torch.float64)
        # The wall z = 2 in world coordinates, seen along each pixel's ray.
        v, u = torch.meshgrid(torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64),
                              indexing="ij")
        rays = torch.stack(((u - K[0, 2]) / f, (v - K[1, 2]) / f, torch.ones_like(u)), -1) @ R.T
        depth = 2.0 / rays[..., 2]
        out.append(SimpleNamespace(depth=depth, K=K, T_world_cam=torch.cat((R, torch.zeros(3, 1, dtype=R.dtype)), 1)))
    return out


def decisions(policy, predictions, scale=0):
    policy.reset()
    stored = []
    for i, pred in enumerate(predictions):
        keep = policy.decide(i, scale, pred)
        if keep:
            policy.stored(i, pred)
        stored.append(keep)
    return stored


def test_the_measured_motion_scales_with_the_frame_width():
    wide, narrow = panning_wall(518, 2, 2.0), panning_wall(294, 2, 2.0)
    flow_wide = mean_flow(wide[1].depth, wide[1].K, wide[1].T_world_cam, wide[0].K, wide[0].T_world_cam)
    flow_narrow = mean_flow(narrow[1].depth, narrow[1].K, narrow[1].T_world_cam, narrow[0].K, narrow[0].T_world_cam)
    # A small pan by a moves a pixel at normalised x about f * a * (1 + x^2) sideways; x^2
    # averages tan(35 deg)^2 / 3 over the frame: about 15.0 pixels at 518 wide, 8.5 at 294.
    f = 518 / 2 / math.tan(math.radians(35))
    assert flow_wide == pytest.approx(f * math.radians(2) * (1 + math.tan(math.radians(35)) ** 2 / 3), rel=0.02)
    assert flow_narrow / flow_wide == pytest.approx(294 / 518, rel=0.02)


def test_auto_keyframes_store_the_same_frames_at_any_width_and_the_reference_form_counts_pixels():
    # 2 degrees a frame: the motion since the last keyframe passes 20 pixels of a 518-wide frame
    # on the second frame after it.
    expected = [True, False, True, False, True, False, True, False, True]
    for width in (518, 294, 196):
        assert decisions(make_policy("auto"), panning_wall(width, 9, 2.0)) == expected, width
    # Pixels as measured (the reference's flow_threshold): at 294 wide the same pan needs
    # three frames to move 20 pixels.
    own_pixels = decisions(FlowKeyframes(AUTO_THRESHOLD), panning_wall(294, 9, 2.0))
    assert own_pixels == [True, False, False, True, False, False, True, False, False]
    assert decisions(FlowKeyframes(AUTO_THRESHOLD), panning_wall(518, 9, 2.0)) == expected
    assert repr(make_policy("auto")) == f"FlowKeyframes(threshold={AUTO_THRESHOLD}, max_gap=30, width={AUTO_WIDTH})"


@pytest.mark.parametrize("width", [0, -3, 2.5, True])
def test_a_threshold_width_must_be_a_positive_number_of_pixels(width):
    with pytest.raises(ValueError, match="width must be a positive number of pixels"):
        FlowKeyframes(width=width)
