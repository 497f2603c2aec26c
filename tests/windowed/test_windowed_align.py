"""Window alignment on synthetic trajectories: known transforms are recovered; degenerate
overlaps give a defined result and a warning, never NaN."""
from __future__ import annotations

import math

import pytest
import torch

from mapstream.geometry import mat_to_quat, quat_to_mat
from mapstream.windowed import AlignmentWarning, Sim3, pairwise_alignment, warp_predictions


def random_rotation(gen: torch.Generator) -> torch.Tensor:
    q = torch.randn(4, generator=gen, dtype=torch.float64)
    return quat_to_mat(q / q.norm())


def synthetic_window(rotations, centres, depth, keyframes) -> dict:
    n = len(rotations)
    quats = mat_to_quat(torch.stack(rotations))
    pose = torch.cat((torch.stack(centres), quats, torch.full((n, 2), 1.1, dtype=torch.float64)), dim=-1)
    return {
        "pose_enc": pose[None].float(),
        "depth": depth[None].float(),
        "is_keyframe": torch.tensor([keyframes]),
    }


@pytest.mark.parametrize("join", ["shared", "anchor"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_known_sim3_is_recovered(seed, join):
    gen = torch.Generator().manual_seed(seed)
    n, overlap = 6, 3
    rots = [random_rotation(gen) for _ in range(n)]
    centres = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(n)]
    depth = torch.rand(n, 7, 9, 1, generator=gen, dtype=torch.float64) + 0.5
    prev = synthetic_window(rots, centres, depth, [True] * n)

    # The next window sees the last `overlap` frames in its own frame: x_curr = (R^T (x - t)) / s.
    s_true = 1.7
    r_true = random_rotation(gen)
    t_true = torch.randn(3, generator=gen, dtype=torch.float64)
    idx = range(n - overlap, n)
    curr_rots = [r_true.T @ rots[i] for i in idx]
    curr_centres = [(r_true.T @ (centres[i] - t_true)) / s_true for i in idx]
    curr = synthetic_window(curr_rots, curr_centres, depth[n - overlap :] / s_true, [True] * overlap)

    sim = pairwise_alignment(prev, curr, overlap, join)
    assert sim.scale.item() == pytest.approx(s_true, rel=1e-5)
    torch.testing.assert_close(sim.rotation[0].double(), r_true, atol=1e-5, rtol=0)
    torch.testing.assert_close(sim.translation[0].double(), t_true, atol=1e-4, rtol=0)

    warped = warp_predictions(curr, sim)
    torch.testing.assert_close(warped["pose_enc"][0, :, :3], prev["pose_enc"][0, n - overlap :, :3], atol=1e-4, rtol=0)
    torch.testing.assert_close(warped["depth"], prev["depth"][:, n - overlap :], atol=1e-5, rtol=1e-5)
    # Warped quaternions are unit with w >= 0.
    q = warped["pose_enc"][0, :, 3:7]
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(overlap), atol=1e-6, rtol=0)
    assert (q[:, 3] >= 0).all()


def rotation_z(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)


def test_the_shared_join_weighs_every_shared_stored_frame_and_the_anchor_join_the_last():
    """The next window sees the two shared frames turned by +a and -a about z and their centres
    moved by +d and -d: the shared join finds the mean of the two (no turn, no shift), the
    reference's anchor join the last frame's (-a, -d)."""
    gen = torch.Generator().manual_seed(4)
    rots = [random_rotation(gen) for _ in range(4)]
    centres = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(4)]
    depth = torch.ones(4, 2, 2, 1, dtype=torch.float64)
    prev = synthetic_window(rots, centres, depth, [True] * 4)
    a, d = 0.2, torch.tensor([0.3, -0.1, 0.2], dtype=torch.float64)
    # x_prev = R x_curr + t per frame: curr frame 0 with R = Rz(a), t = d; frame 1 with Rz(-a), -d.
    turns = [rotation_z(a), rotation_z(-a)]
    shifts = [d, -d]
    curr = synthetic_window(
        [turns[k].T @ rots[2 + k] for k in range(2)],
        [turns[k].T @ (centres[2 + k] - shifts[k]) for k in range(2)],
        depth[2:], [True, True],
    )
    shared = pairwise_alignment(prev, curr, overlap=2, join="shared")
    torch.testing.assert_close(shared.rotation[0].double(), torch.eye(3, dtype=torch.float64), atol=1e-6, rtol=0)
    # The centroid of the curr centres maps onto the centroid of the prev ones.
    centroid_curr = (curr["pose_enc"][0, :, :3].double()).mean(0)
    centroid_prev = torch.stack(centres[2:]).mean(0)
    torch.testing.assert_close(shared.translation[0].double(), centroid_prev - centroid_curr, atol=1e-5, rtol=0)
    anchor = pairwise_alignment(prev, curr, overlap=2, join="anchor")
    torch.testing.assert_close(anchor.rotation[0].double(), rotation_z(-a), atol=1e-6, rtol=0)
    torch.testing.assert_close(anchor.translation[0].double(), -d, atol=1e-5, rtol=0)


def test_an_unknown_join_is_refused():
    gen = torch.Generator().manual_seed(5)
    window = synthetic_window([random_rotation(gen)] * 2, [torch.zeros(3, dtype=torch.float64)] * 2,
                              torch.ones(2, 2, 2, 1, dtype=torch.float64), [True, True])
    with pytest.raises(ValueError, match="join must be one of shared, anchor, got 'median'"):
        pairwise_alignment(window, window, overlap=2, join="median")


@pytest.mark.parametrize("join", ["shared", "anchor"])
def test_anchor_is_the_last_shared_keyframe(join):
    gen = torch.Generator().manual_seed(3)
    rots = [random_rotation(gen) for _ in range(4)]
    centres = [torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(4)]
    depth = torch.ones(4, 2, 2, 1, dtype=torch.float64)
    prev = synthetic_window(rots, centres, depth, [True, True, True, False])
    # curr frame 1 (= prev frame 3) is garbage, but it is not a keyframe in prev: ignored.
    curr_rots = [rots[2], random_rotation(gen)]
    curr_centres = [centres[2], torch.full((3,), 100.0, dtype=torch.float64)]
    curr = synthetic_window(curr_rots, curr_centres, depth[2:], [True, True])
    sim = pairwise_alignment(prev, curr, overlap=2, join=join)
    torch.testing.assert_close(sim.rotation[0], torch.eye(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(sim.translation[0], torch.zeros(3), atol=1e-5, rtol=0)


def _static_pair(depth_prev, depth_curr):
    rots = [torch.eye(3, dtype=torch.float64)] * 3
    centres = [torch.zeros(3, dtype=torch.float64)] * 3  # a static camera: no baseline at all
    prev = synthetic_window(rots, centres, depth_prev, [True] * 3)
    curr = synthetic_window(rots[:2], centres[:2], depth_curr, [True] * 2)
    return prev, curr


def test_static_camera_is_aligned_without_nan():
    depth = torch.full((3, 2, 2, 1), 2.0, dtype=torch.float64)
    prev, curr = _static_pair(depth, depth[:2] / 4)
    sim = pairwise_alignment(prev, curr, overlap=2)
    assert sim.scale.item() == pytest.approx(4.0)
    assert torch.isfinite(sim.matrix()).all()


def test_no_valid_depth_falls_back_to_unit_scale_with_a_warning():
    prev, curr = _static_pair(torch.full((3, 2, 2, 1), float("nan"), dtype=torch.float64), torch.zeros(2, 2, 2, 1))
    with pytest.warns(AlignmentWarning, match="no valid depth"):
        sim = pairwise_alignment(prev, curr, overlap=2)
    assert sim.scale.item() == 1.0


@pytest.mark.parametrize("join", ["shared", "anchor"])
def test_non_finite_pose_falls_back_to_identity_with_a_warning(join):
    depth = torch.ones(3, 2, 2, 1, dtype=torch.float64)
    prev, curr = _static_pair(depth, depth[:2])
    curr["pose_enc"][0, 1, 3:7] = float("nan")
    with pytest.warns(AlignmentWarning, match="non-finite pose"):
        sim = pairwise_alignment(prev, curr, overlap=2, join=join)
    torch.testing.assert_close(sim.matrix(), Sim3.identity(1, "cpu").matrix())


def test_scale_is_clamped():
    depth = torch.ones(3, 2, 2, 1, dtype=torch.float64)
    prev, curr = _static_pair(depth * 1e6, depth[:2])
    assert pairwise_alignment(prev, curr, overlap=2).scale.item() == pytest.approx(1e3)


def test_lower_median_for_even_counts():
    prev, curr = _static_pair(
        torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(1, 2, 2, 1).expand(3, 2, 2, 1).clone(),
        torch.ones(2, 2, 2, 1, dtype=torch.float64),
    )
    prev["is_keyframe"] = torch.tensor([[False, False, True]])
    sim = pairwise_alignment(prev, curr, overlap=2)
    # paired offsets: only offset 1 (prev frame 2); ratios 1, 2, 3, 4 -> lower median 2.
    assert sim.scale.item() == 2.0
    assert not math.isnan(sim.scale.item())
