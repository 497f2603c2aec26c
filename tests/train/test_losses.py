"""The training losses and the ground truth's normalisation, on hand-made cases with known
values (fp64, so that "equal" means equal to rounding)."""
from __future__ import annotations

import math

import pytest
import torch

from mapstream.geometry import invert_se3, mat_to_quat, pose_encoding_to_extri_intri, quat_to_mat
from mapstream.train.losses import (
    LossWeights,
    camera_loss,
    confidence_regression,
    depth_loss,
    huber,
    point_loss,
    total_loss,
)
from mapstream.train.normalize import gt_pose_encoding, normalize_clip, valid_mask, world_points

F64 = torch.float64


def _poses(B: int, S: int, generator: torch.Generator) -> torch.Tensor:
    """Random camera-to-world transforms [B, S, 4, 4]."""
    q = torch.randn(B, S, 4, generator=generator, dtype=F64)
    T = torch.zeros(B, S, 4, 4, dtype=F64)
    T[..., :3, :3] = quat_to_mat(q)
    T[..., :3, 3] = 3 * torch.randn(B, S, 3, generator=generator, dtype=F64)
    T[..., 3, 3] = 1
    return T


def _batch(B: int = 2, S: int = 3, H: int = 6, W: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    depth = 1 + 4 * torch.rand(B, S, H, W, generator=g, dtype=F64)
    depth[torch.rand(B, S, H, W, generator=g, dtype=F64) < 0.2] = 0  # holes: no measurement
    K = torch.zeros(B, S, 3, 3, dtype=F64)
    K[..., 0, 0] = 9 + torch.rand(B, S, generator=g, dtype=F64)
    K[..., 1, 1] = 7 + torch.rand(B, S, generator=g, dtype=F64)
    K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = W / 2, H / 2, 1
    images = torch.rand(B, S, 3, H, W, generator=g, dtype=F64)
    return {"images": images, "depth": depth, "T_world_cam": _poses(B, S, g), "K": K}


def _scaled(batch, factor: float):
    out = dict(batch)
    T = batch["T_world_cam"].clone()
    T[..., :3, 3] *= factor
    out.update(T_world_cam=T, depth=batch["depth"] * factor)
    return out


def _assert_same_normalised(a, b):
    for key in ("T_world_cam", "depth", "K", "images"):
        torch.testing.assert_close(a[key], b[key], rtol=1e-12, atol=1e-12, msg=key)
    assert torch.equal(a["valid"], b["valid"])


# ----------------------------------------------------------------------------------------------
# Ground truth normalisation


def test_normalised_clip_starts_at_the_identity_with_unit_mean_point_distance():
    batch = normalize_clip(_batch())
    assert torch.equal(batch["T_world_cam"][:, 0], torch.eye(4, dtype=F64).expand(2, 4, 4))
    distance = world_points(batch).norm(dim=-1)
    valid = batch["valid"]
    for b in range(2):
        assert distance[b][valid[b]].mean().item() == pytest.approx(1, abs=1e-12)
    # Every pose stays rigid, and every frame's relative pose is the input's.
    R = batch["T_world_cam"][..., :3, :3]
    torch.testing.assert_close(R @ R.transpose(-1, -2), torch.eye(3, dtype=F64).expand_as(R), rtol=0, atol=1e-12)


def test_relative_poses_and_points_are_the_inputs_in_the_first_cameras_frame():
    raw = _batch()
    batch = normalize_clip(raw)
    scale = batch["scale"]
    T = raw["T_world_cam"]
    want = invert_se3(T[:, :1]) @ T
    want[..., :3, 3] /= scale[:, None, None]
    torch.testing.assert_close(batch["T_world_cam"], want, rtol=1e-12, atol=1e-12)
    # A valid pixel's world point is the raw world point seen from camera 0, divided by the scale.
    raw_points = world_points(raw)
    T0_inv = invert_se3(T[:, 0])
    seen = torch.einsum("bij,bshwj->bshwi", T0_inv[:, :3, :3], raw_points) + T0_inv[:, None, None, None, :3, 3]
    want = seen / scale[:, None, None, None, None]
    valid = batch["valid"]
    torch.testing.assert_close(world_points(batch)[valid], want[valid], rtol=1e-12, atol=1e-12)


def test_scaling_the_scene_by_seven_gives_the_same_normalised_clip():
    raw = _batch()
    a, b = normalize_clip(raw), normalize_clip(_scaled(raw, 7.0))
    _assert_same_normalised(a, b)
    torch.testing.assert_close(b["scale"], 7 * a["scale"], rtol=1e-12, atol=0)


def test_the_world_frame_does_not_matter():
    raw = _batch()
    moved = dict(raw)
    G = _poses(1, 1, torch.Generator().manual_seed(5))[0, 0]
    moved["T_world_cam"] = G @ raw["T_world_cam"]
    a, b = normalize_clip(raw), normalize_clip(moved)
    _assert_same_normalised(a, b)
    torch.testing.assert_close(a["scale"], b["scale"], rtol=1e-12, atol=0)


def test_normalising_twice_changes_nothing_but_the_scale():
    once = normalize_clip(_batch())
    twice = normalize_clip(once)
    _assert_same_normalised(once, twice)
    torch.testing.assert_close(twice["scale"], torch.ones(2, dtype=F64), rtol=1e-12, atol=0)


def test_valid_pixels_need_a_finite_positive_depth_and_the_given_mask():
    raw = _batch(B=1, S=1, H=2, W=2)
    raw["depth"] = torch.tensor([[[[2.0, 0.0], [float("nan"), float("inf")]]]], dtype=F64)
    assert valid_mask(raw).flatten().tolist() == [True, False, False, False]
    raw["depth"] = torch.tensor([[[[2.0, 3.0], [4.0, 5.0]]]], dtype=F64)
    raw["valid"] = torch.tensor([[[[True, False], [True, True]]]])
    batch = normalize_clip(raw)
    assert batch["valid"].flatten().tolist() == [True, False, True, True]
    assert batch["depth"][0, 0, 0, 1] == 0  # an invalid pixel reads as "no measurement"


def test_a_clip_without_a_valid_pixel_keeps_unit_scale():
    raw = _batch()
    raw["depth"][1] = 0
    batch = normalize_clip(raw)
    assert batch["scale"][1] == 1
    assert torch.isfinite(batch["T_world_cam"]).all() and torch.isfinite(batch["depth"]).all()
    assert torch.equal(batch["T_world_cam"][1, 0], torch.eye(4, dtype=F64))


def test_world_points_unproject_a_pixel_by_hand():
    batch = _batch(B=1, S=1, H=4, W=6)
    batch["T_world_cam"] = torch.eye(4, dtype=F64).expand(1, 1, 4, 4).clone()
    batch["T_world_cam"][0, 0, :3, 3] = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    K = batch["K"][0, 0]
    d = batch["depth"][0, 0, 1, 5]
    want = torch.stack(((5 - K[0, 2]) * d / K[0, 0] + 1, (1 - K[1, 2]) * d / K[1, 1] + 2, d + 3))
    torch.testing.assert_close(world_points(batch)[0, 0, 1, 5], want, rtol=1e-14, atol=1e-14)


def test_gt_pose_encoding_is_camera_to_world_and_decodes_back():
    batch = normalize_clip(_batch())
    H, W = batch["images"].shape[-2:]
    gt = gt_pose_encoding(batch)
    assert gt.shape == (2, 3, 9)
    # Frame 0: at the origin, identity rotation (x, y, z, w) = (0, 0, 0, 1).
    assert gt[:, 0, :7].tolist() == [[0.0] * 6 + [1.0]] * 2
    # The translation is the camera centre in the first camera's frame (camera-to-world).
    torch.testing.assert_close(gt[..., :3], batch["T_world_cam"][..., :3, 3], rtol=0, atol=0)
    T, K = pose_encoding_to_extri_intri(gt, (H, W))
    torch.testing.assert_close(T, batch["T_world_cam"][..., :3, :], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(K[..., 0, 0], batch["K"][..., 0, 0], rtol=1e-12, atol=0)
    torch.testing.assert_close(K[..., 1, 1], batch["K"][..., 1, 1], rtol=1e-12, atol=0)
    torch.testing.assert_close(gt[..., 7], 2 * torch.atan((H / 2) / batch["K"][..., 1, 1]), rtol=1e-14, atol=0)


# ----------------------------------------------------------------------------------------------
# Camera loss


def test_huber_by_hand():
    x = torch.tensor([0.03, -0.03, 0.3, -0.3, 0.0], dtype=F64)
    # Quadratic inside delta (0.03**2 / (2 * 0.1)), L1 minus delta/2 outside, exact L1 at 0.
    assert huber(x, 0.1).tolist() == pytest.approx([0.0045, 0.0045, 0.25, 0.25, 0.0], abs=1e-15)
    assert huber(x, 0.0).tolist() == [0.03, 0.03, 0.3, 0.3, 0.0]
    # Continuous at |x| = delta.
    assert huber(torch.tensor([0.1], dtype=F64), 0.1).item() == pytest.approx(0.05, abs=1e-15)
    with pytest.raises(ValueError):
        huber(x, -1.0)


def _identity_encoding(B=1, S=1):
    gt = torch.zeros(B, S, 9, dtype=F64)
    gt[..., 6] = 1
    gt[..., 7:9] = torch.tensor([1.0, 1.2], dtype=F64)
    return gt


def test_camera_loss_on_a_hand_computed_case():
    gt = _identity_encoding()
    pred = gt.clone()
    pred[..., 0:3] += torch.tensor([0.3, 0.0, 0.02], dtype=F64)  # h = 0.275, 0, 0.004
    pred[..., 3:7] += torch.tensor([0.0, 0.1, 0.0, -0.01], dtype=F64)  # h = 0, 0.075, 0, 0.001
    pred[..., 7:9] += torch.tensor([-0.2, 0.0], dtype=F64)  # h = 0.175, 0
    loss, parts = camera_loss([pred], gt, delta=0.05)
    t, r, f = (0.275 + 0.004) / 3, (0.075 + 0.001) / 4, 0.175 / 2
    assert parts["camera_translation"].item() == pytest.approx(t, abs=1e-15)
    assert parts["camera_rotation"].item() == pytest.approx(r, abs=1e-15)
    assert parts["camera_fov"].item() == pytest.approx(f, abs=1e-15)
    assert loss.item() == pytest.approx(t + r + 0.5 * f, abs=1e-15)
    custom, _ = camera_loss([pred], gt, delta=0.05, translation_weight=2, rotation_weight=3, fov_weight=4)
    assert custom.item() == pytest.approx(2 * t + 3 * r + 4 * f, abs=1e-15)


def test_a_quaternion_and_its_negative_cost_the_same():
    g = torch.Generator().manual_seed(1)
    gt = torch.randn(2, 4, 9, generator=g, dtype=F64)
    gt[..., 3:7] = torch.nn.functional.normalize(gt[..., 3:7], dim=-1)
    pred = gt + 0.1 * torch.randn(2, 4, 9, generator=g, dtype=F64)
    flipped = pred.clone()
    flipped[..., 3:7] *= -1
    a, pa = camera_loss([pred], gt)
    b, pb = camera_loss([flipped], gt)
    assert a.item() == b.item() and pa == pb
    exact = gt.clone()
    exact[..., 3:7] *= -1
    assert camera_loss([exact], gt)[0].item() == 0


def test_iterations_weigh_gamma_to_the_distance_from_the_last():
    g = torch.Generator().manual_seed(2)
    gt = _identity_encoding(2, 3)
    iterations = [gt + 0.3 * torch.randn(2, 3, 9, generator=g, dtype=F64) for _ in range(4)]
    each = [camera_loss([p], gt, delta=0.05)[0].item() for p in iterations]
    loss, _ = camera_loss(iterations, gt, gamma=0.6, delta=0.05)
    assert loss.item() == pytest.approx(sum(0.6 ** (3 - i) * e for i, e in enumerate(each)), rel=1e-14)
    # The last iteration alone weighs 1, whatever gamma.
    assert camera_loss(iterations[-1:], gt, gamma=0.1)[0].item() == pytest.approx(each[-1], rel=1e-15)


def test_the_direction_part_is_one_minus_the_cosine_over_frames_that_moved():
    gt = _identity_encoding(2, 3)
    gt[0, 1, 0:3] = torch.tensor([0.0, 0.0, 0.05], dtype=F64)  # clip 0: frame 1 moved forward a little
    gt[0, 2, 0:3] = torch.tensor([2.0, 0.0, 0.0], dtype=F64)  # frame 2 far to the right
    gt[1, 1, 0:3] = torch.tensor([0.0, -1.0, 0.0], dtype=F64)  # clip 1: frame 1 up; frame 2 did not move
    pred = gt.clone()
    pred[0, 1, 0:3] = torch.tensor([0.0, 3.0, 3.0], dtype=F64)  # 45 degrees off, any length: 1 - cos = 1 - 1/sqrt 2
    pred[0, 2, 0:3] = torch.tensor([5.0, 0.0, 0.0], dtype=F64)  # the right direction, too long: 0
    pred[1, 1, 0:3] = torch.tensor([0.0, 1.0, 0.0], dtype=F64)  # opposite: 2
    pred[1, 2, 0:3] = torch.tensor([7.0, 7.0, 7.0], dtype=F64)  # a frame that did not move: not counted
    plain_loss, plain = camera_loss([pred], gt, delta=0.05)
    loss, parts = camera_loss([pred], gt, delta=0.05, direction_weight=0.5)
    expected = ((1 - 1 / math.sqrt(2) + 0) / 2 + 2 / 1) / 2  # each clip's moved frames, then the clips
    assert parts["camera_direction"].item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(plain_loss.item() + 0.5 * expected, abs=1e-12)
    assert "camera_direction" not in plain and parts["camera"].item() == loss.item()
    pred.requires_grad_(True)
    camera_loss([pred], gt, direction_weight=1.0)[0].backward()
    assert torch.isfinite(pred.grad).all()


def _yaw(encoding, degrees):
    """``encoding``'s quaternion set to a turn of ``degrees`` about the camera's y axis."""
    half = math.radians(degrees) / 2
    encoding[3:7] = torch.tensor([0.0, math.sin(half), 0.0, math.cos(half)], dtype=F64)


def test_the_pairs_part_scores_where_each_frame_sees_every_later_one():
    gt = _identity_encoding(2, 3)
    gt[0, 1, 0:3] = torch.tensor([1.0, 0.0, 0.0], dtype=F64)  # clip 0: frame 1 to the right,
    gt[0, 2, 0:3] = torch.tensor([1.0, 0.0, 0.0], dtype=F64)  # frame 2 on frame 1's centre
    gt[1, 1, 0:3] = torch.tensor([0.0, 0.0, 1.0], dtype=F64)  # clip 1: frame 1 ahead,
    gt[1, 2, 0:3] = torch.tensor([0.0, 0.0, 2.0], dtype=F64)  # frame 2 further ahead
    pred = gt.clone()
    pred[0, 1, 0:3] = torch.tensor([1.0, 0.0, 1.0], dtype=F64)  # pair (0, 1) 45 degrees off
    pred[0, 2, 0:3] = torch.tensor([3.0, 0.0, 0.0], dtype=F64)  # pair (0, 2) right, any length; (1, 2) no baseline
    _yaw(pred[1, 0], 60.0)  # clip 1: camera 0 turned, so it sees frames 1 and 2 60 degrees off;
    # pair (1, 2) is right
    plain_loss, plain = camera_loss([pred], gt, delta=0.05)
    loss, parts = camera_loss([pred], gt, delta=0.05, pairs_weight=0.5)
    expected = ((1 - 1 / math.sqrt(2) + 0) / 2 + (0.5 + 0.5 + 0) / 3) / 2  # each clip's pairs, then the clips
    assert parts["camera_pairs"].item() == pytest.approx(expected, abs=1e-12)
    assert loss.item() == pytest.approx(plain_loss.item() + 0.5 * expected, abs=1e-12)
    assert "camera_pairs" not in plain and parts["camera"].item() == loss.item()
    # A frame left out of the mask leaves its pairs out: clip 1 without frame 0 has only (1, 2).
    mask = torch.tensor([[True, True, True], [False, True, True]])
    _, masked = camera_loss([pred], gt, pairs_weight=1.0, mask=mask)
    assert masked["camera_pairs"].item() == pytest.approx(((1 - 1 / math.sqrt(2)) / 2 + 0) / 2, abs=1e-12)
    pred.requires_grad_(True)
    camera_loss([pred], gt, pairs_weight=1.0)[0].backward()
    assert torch.isfinite(pred.grad).all() and pred.grad[1, 0, 3:7].abs().sum() > 0  # the turn is asked back


def test_the_pairs_part_is_blind_to_where_the_whole_path_lies_and_its_scale():
    g = torch.Generator().manual_seed(5)
    gt = _identity_encoding(2, 6)
    gt[..., 0:3] = torch.randn(2, 6, 3, generator=g, dtype=F64)
    gt[..., 3:7] = torch.nn.functional.normalize(torch.randn(2, 6, 4, generator=g, dtype=F64), dim=-1)
    # The whole path moved, turned and scaled: every pair's direction in its first camera is kept.
    turn = quat_to_mat(torch.nn.functional.normalize(torch.randn(4, generator=g, dtype=F64), dim=0))
    moved = gt.clone()
    moved[..., 0:3] = 2.5 * gt[..., 0:3] @ turn.T + torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    T_gt, _ = pose_encoding_to_extri_intri(gt, (14, 28))
    moved[..., 3:7] = mat_to_quat(turn @ T_gt[..., :3, :3])
    _, parts = camera_loss([moved], gt, pairs_weight=1.0)
    assert parts["camera_pairs"].item() == pytest.approx(0.0, abs=1e-12)
    _, parts = camera_loss([moved], gt, direction_weight=1.0)  # the first frame's part is not: it sees world axes
    assert parts["camera_direction"].item() > 0.1


def test_the_camera_mask_leaves_frames_and_clips_out():
    gt = _identity_encoding(2, 2)
    pred = gt.clone()
    pred[0, 1, 0] += 1.0  # h = 0.975 on one translation component
    pred[1, :, 0] = float("nan")  # a masked clip's values never reach the loss
    mask = torch.tensor([[True, True], [False, False]])
    loss, parts = camera_loss([pred], gt, delta=0.05, mask=mask)
    # Clip 0: mean over its two frames of 0.975 / 3; clip 1 adds 0; mean over the 2 clips.
    assert parts["camera_translation"].item() == pytest.approx(0.975 / 3 / 2 / 2, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# Depth and point losses


def test_a_perfect_depth_leaves_exactly_the_regulariser():
    batch = normalize_clip(_batch())
    gt = batch["depth"]
    conf = torch.full_like(gt, 3.0)
    loss, parts = depth_loss(gt[..., None], conf, gt, batch["valid"], alpha=0.2)
    assert parts["depth_residual"].item() == 0 and parts["depth_gradient"].item() == 0
    assert parts["depth_reg"].item() == pytest.approx(-0.2 * math.log(3.0), rel=1e-15)
    assert loss.item() == parts["depth_reg"].item()
    # A varying confidence: the mean of -alpha log conf over each clip's valid pixels.
    conf = 1 + torch.rand(gt.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    _, parts = depth_loss(gt, conf, gt, batch["valid"], alpha=0.5)
    valid = batch["valid"]
    want = sum(-0.5 * torch.log(conf[b][valid[b]]).mean() for b in range(2)) / 2
    assert parts["depth_reg"].item() == pytest.approx(want.item(), rel=1e-14)


def _ramp(H=4, W=5, slope=0.1):
    u = torch.arange(W, dtype=F64).expand(1, 1, H, W)
    gt = torch.full((1, 1, H, W), 2.0, dtype=F64)
    return gt, gt + slope * u


def test_gradient_residual_on_a_ramp():
    H, W = 4, 5
    gt, pred = _ramp(H, W)
    valid = torch.ones(1, 1, H, W, dtype=torch.bool)
    conf = torch.ones(1, 1, H, W, dtype=F64)
    _, parts = depth_loss(pred, conf, gt, valid, alpha=0.0)
    # Residual 0.1 u: mean over u = 0..4 is 0.2; its x-difference 0.1 in all but the last column.
    assert parts["depth_residual"].item() == pytest.approx(0.2, abs=1e-15)
    assert parts["depth_gradient"].item() == pytest.approx(0.1 * (W - 1) / W, abs=1e-15)
    # The confidence weighs the gradient term at the pixel the difference starts from.
    conf2 = conf.clone()
    conf2[..., 0] = 3.0
    _, parts = depth_loss(pred, conf2, gt, valid, alpha=0.0)
    assert parts["depth_gradient"].item() == pytest.approx(0.1 * (W - 1 + 2) / W, abs=1e-15)
    # An offset without slope has no gradient residual; a ramp along y appears in y only.
    _, parts = depth_loss(gt + 0.5, conf, gt, valid, alpha=0.0)
    assert parts["depth_gradient"].item() == 0 and parts["depth_residual"].item() == 0.5
    v = torch.arange(H, dtype=F64)[:, None].expand(1, 1, H, W)
    _, parts = depth_loss(gt + 0.2 * v, conf, gt, valid, alpha=0.0)
    assert parts["depth_gradient"].item() == pytest.approx(0.2 * (H - 1) / H, abs=1e-15)


def test_a_difference_needs_both_pixels_valid():
    H, W = 1, 5
    gt, pred = _ramp(H, W)
    valid = torch.ones(1, 1, H, W, dtype=torch.bool)
    valid[..., 2] = False
    gt[..., 2] = float("nan")  # never read
    conf = torch.ones(1, 1, H, W, dtype=F64)
    _, parts = depth_loss(pred, conf, gt, valid, alpha=0.0)
    # Pairs (0,1) and (3,4) remain, over 4 valid pixels; residual (0 + .1 + .3 + .4) / 4.
    assert parts["depth_gradient"].item() == pytest.approx(0.2 / 4, abs=1e-15)
    assert parts["depth_residual"].item() == pytest.approx(0.8 / 4, abs=1e-15)


def test_gradient_scales_average_the_subsampled_grids():
    H, W = 4, 8
    gt, pred = _ramp(H, W)
    valid = torch.ones(1, 1, H, W, dtype=torch.bool)
    conf = torch.ones(1, 1, H, W, dtype=F64)
    _, parts = depth_loss(pred, conf, gt, valid, alpha=0.0, gradient_scales=2)
    # Scale 1: 0.1 * 7/8; scale 2 (every 2nd pixel, 4 columns): 0.2 * 3/4.
    assert parts["depth_gradient"].item() == pytest.approx((0.1 * 7 / 8 + 0.2 * 3 / 4) / 2, abs=1e-15)


def test_point_residual_is_euclidean():
    gt = torch.zeros(1, 1, 1, 2, 3, dtype=F64)
    pred = gt.clone()
    pred[..., 0, :] = torch.tensor([3.0, 4.0, 0.0], dtype=F64)
    pred[..., 1, :] = torch.tensor([3.0, 4.0, 0.0], dtype=F64)
    conf = torch.full((1, 1, 1, 2), 2.0, dtype=F64)
    valid = torch.ones(1, 1, 1, 2, dtype=torch.bool)
    loss, parts = point_loss(pred, conf, gt, valid, alpha=0.1)
    assert parts["points_residual"].item() == 10.0 and parts["points_gradient"].item() == 0
    assert loss.item() == pytest.approx(10 - 0.1 * math.log(2), rel=1e-15)


def test_empty_masks_add_zero_not_nan():
    gt, pred = _ramp()
    pred = torch.cat((pred, pred)).requires_grad_()
    conf = torch.full_like(pred, 2.0).requires_grad_()
    valid = torch.zeros(pred.shape, dtype=torch.bool)
    valid[0] = True
    full, parts_full = depth_loss(pred[:1], conf[:1], gt, valid[:1])
    half, _ = depth_loss(pred, conf, torch.cat((gt, gt)), valid)
    assert half.item() == pytest.approx(full.item() / 2, rel=1e-15)  # clip 1 adds 0, divisor B = 2
    none, parts = depth_loss(pred, conf, torch.cat((gt, gt)), torch.zeros_like(valid))
    assert none.item() == 0 and all(v.item() == 0 for v in parts.values())
    (half + none).backward()
    assert torch.isfinite(pred.grad).all() and torch.isfinite(conf.grad).all()
    assert pred.grad[1].abs().sum() == 0


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match="depth"):
        confidence_regression(
            torch.zeros(1, 1, 2, 2, 1), torch.ones(1, 1, 2, 3), torch.zeros(1, 1, 2, 2, 1),
            torch.ones(1, 1, 2, 2, dtype=torch.bool),
        )
    with pytest.raises(ValueError, match="pose_enc_list"):
        camera_loss([torch.zeros(1, 2, 9)], torch.zeros(1, 3, 9))


# ----------------------------------------------------------------------------------------------
# Total loss


def _perfect_prediction(batch, conf=2.0, iterations=4):
    norm = normalize_clip(batch)
    gt = gt_pose_encoding(norm)
    return {
        "pose_enc_list": [gt.clone() for _ in range(iterations)],
        "pose_enc": gt.clone(),
        "depth": norm["depth"][..., None].clone(),
        "depth_conf": torch.full_like(norm["depth"], conf),
        "world_points": world_points(norm),
        "world_points_conf": torch.full_like(norm["depth"], conf),
    }


def test_total_loss_of_a_perfect_prediction_is_the_regularisers():
    batch = _batch()
    pred = _perfect_prediction(batch)
    w = LossWeights()
    loss, parts = total_loss(pred, batch, w)
    assert parts["camera"].item() == 0
    assert parts["depth_residual"].item() == 0 and parts["points_residual"].item() == 0
    assert parts["depth_reg"].item() == pytest.approx(-w.depth_alpha * math.log(2), rel=1e-15)
    assert parts["points_reg"].item() == pytest.approx(-w.points_alpha * math.log(2), rel=1e-15)
    want = w.depth * parts["depth_reg"].item() + w.points * parts["points_reg"].item()
    assert loss.item() == pytest.approx(want, rel=1e-15)
    assert parts["loss"].item() == loss.item()


def test_total_loss_normalises_unless_the_batch_is_normalised_and_ignores_the_scene_scale():
    batch = _batch()
    g = torch.Generator().manual_seed(4)
    pred = {k: v + 0.05 * torch.rand(v.shape, generator=g, dtype=F64) if torch.is_tensor(v) else [p + 0.1 for p in v]
            for k, v in _perfect_prediction(batch).items()}
    a, pa = total_loss(pred, batch)
    b, _ = total_loss(pred, normalize_clip(batch))
    c, _ = total_loss(pred, _scaled(batch, 7.0))
    assert a.item() == b.item()
    assert c.item() == pytest.approx(a.item(), rel=1e-12)
    assert set(pa) == {
        "loss", "camera", "camera_translation", "camera_rotation", "camera_fov",
        "depth", "depth_residual", "depth_gradient", "depth_reg",
        "points", "points_residual", "points_gradient", "points_reg",
    }


def test_the_batch_mean_is_the_mean_of_the_clips():
    """What makes a batch split across processes (whose gradients DDP averages) train like one."""
    batch = _batch(B=2)
    batch["depth"][1, :, :3] = 0  # clips with different numbers of valid pixels
    g = torch.Generator().manual_seed(6)
    pred = {k: v + 0.05 * torch.rand(v.shape, generator=g, dtype=F64) if torch.is_tensor(v) else [p + 0.1 for p in v]
            for k, v in _perfect_prediction(batch).items()}

    def clip(d, b):
        return {k: (v[b:b + 1] if torch.is_tensor(v) else [p[b:b + 1] for p in v]) for k, v in d.items()}

    whole, _ = total_loss(pred, batch)
    halves = [total_loss(clip(pred, b), clip(batch, b))[0] for b in range(2)]
    assert whole.item() == pytest.approx((halves[0].item() + halves[1].item()) / 2, rel=1e-14)


def test_gradients_flow_and_stay_finite_with_an_empty_clip():
    batch = _batch()
    batch["depth"][1] = 0  # clip 1: no valid pixel, no scale
    pred = _perfect_prediction(batch)
    leaves = {}
    for key, value in pred.items():
        if torch.is_tensor(value):
            leaves[key] = value.float().requires_grad_()
        else:
            leaves[key] = [p.float().requires_grad_() for p in value]
    # Not the perfect prediction: every term has a gradient.
    perturbed = {k: (v + 0.01 if torch.is_tensor(v) else [p + 0.01 for p in v]) for k, v in leaves.items()}
    perturbed["depth_conf"] = leaves["depth_conf"]
    perturbed["world_points_conf"] = leaves["world_points_conf"]
    loss, parts = total_loss(perturbed, {k: v.float() for k, v in batch.items()})
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in parts.values())
    loss.backward()
    for key, value in leaves.items():
        if key == "pose_enc":
            continue
        grads = [value.grad] if torch.is_tensor(value) else [p.grad for p in value]
        for grad in grads:
            assert grad is not None and torch.isfinite(grad).all(), key
            assert grad[0].abs().sum() > 0, key
            assert grad[1].abs().sum() == 0, key  # the empty clip adds nothing
    # pose_enc_list carries the camera loss; pose_enc (its last entry) is not read twice.
    assert leaves["pose_enc"].grad is None


def test_zero_weights_skip_terms_and_half_precision_is_compared_in_fp32():
    batch = {k: v.float() for k, v in _batch().items()}
    pred = {k: (v.to(torch.bfloat16) if torch.is_tensor(v) else [p.to(torch.bfloat16) for p in v])
            for k, v in _perfect_prediction(batch).items()}
    loss, parts = total_loss(pred, batch, LossWeights(camera=0, points=0))
    assert loss.dtype == torch.float32
    assert "camera" not in parts and "points" not in parts and "depth" in parts
    with pytest.raises(ValueError, match="no loss term"):
        total_loss({"depth": pred["depth"], "depth_conf": pred["depth_conf"]}, batch, LossWeights(depth=0))


def test_loss_weights_are_frozen_and_documented():
    import dataclasses
    import inspect

    w = LossWeights()
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.camera = 1.0  # type: ignore[misc]
    source = inspect.getsource(LossWeights)
    for field in dataclasses.fields(LossWeights):
        assert f'{field.name}: ' in source
        after = source.split(f"{field.name}: ", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), f"{field.name} has no docstring"


def test_placed_points_are_exact_for_the_true_depth_and_cameras_and_measure_a_path_too_long():
    from mapstream.train.losses import placed_points_loss

    batch = normalize_clip(_batch(B=2, S=3, H=6, W=8, seed=3))
    valid, hw = batch["valid"], (6, 8)
    gt = world_points(batch)
    pose = gt_pose_encoding(batch, hw)
    loss, parts = placed_points_loss(batch["depth"], pose, gt, valid, hw)
    assert loss.item() < 1e-12 and parts["placed"].item() == loss.item()
    # Every translation k times too long, the depth right: each pixel of frame s lies off by
    # (k - 1) |t_s|, so a clip scores the valid-pixel-weighted mean of those lengths.
    k = 1.5
    long = pose.clone()
    long[..., :3] *= k
    loss, _ = placed_points_loss(batch["depth"], long, gt, valid, hw)
    lengths = batch["T_world_cam"][..., :3, 3].norm(dim=-1)  # [B, S]
    counts = valid.flatten(2).sum(-1).to(F64)
    expected = ((k - 1) * (lengths * counts).sum(1) / counts.sum(1)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-12)
    # Depth and cameras both receive gradients, and a pixel outside the mask (even NaN) none.
    depth = batch["depth"].clone()
    depth[~valid] = float("nan")
    depth.requires_grad_(True)
    long.requires_grad_(True)
    loss, _ = placed_points_loss(depth[..., None], long, gt, valid, hw)
    loss.backward()
    assert torch.isfinite(loss) and long.grad[..., :3].abs().sum() > 0 and depth.grad[valid].abs().sum() > 0
    assert (depth.grad[~valid] == 0).all()
    with pytest.raises(ValueError, match="do not describe the same frames"):
        placed_points_loss(batch["depth"], pose[:, :2], gt, valid, hw)


def test_the_placed_term_enters_the_total_only_with_a_weight_and_a_depth_prediction():
    batch = normalize_clip(_batch(B=1, S=3, H=6, W=8, seed=4))
    pose = gt_pose_encoding(batch, (6, 8)).clone()
    pose[..., :3] *= 2.0
    pred = {"pose_enc": pose, "pose_enc_list": [pose], "depth": batch["depth"][..., None],
            "depth_conf": torch.ones_like(batch["depth"])}
    plain, parts = total_loss(pred, batch, LossWeights())
    assert "placed" not in parts
    weighted, parts = total_loss(pred, batch, LossWeights(placed=0.5))
    torch.testing.assert_close(weighted, plain + 0.5 * parts["placed"])
    assert parts["placed"] > 0
    camera_only = {k: v for k, v in pred.items() if not k.startswith("depth")}
    assert "placed" not in total_loss(camera_only, batch, LossWeights(placed=0.5))[1]
