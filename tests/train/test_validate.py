"""Validation during training: the error measures by hand, the held-out clips, and the
val_* values a run records at its validation steps."""
from __future__ import annotations

import json
import math

import pytest
import torch

from mapstream.geometry import extri_intri_to_pose_encoding, quat_to_mat
from mapstream.train.config import TrainConfig
from mapstream.train.data import ProceduralClips, seed_split
from mapstream.train.trainer import train
from mapstream.train.validate import Validation, camera_errors_deg, depth_abs_rel, pair_auc

HW = (28, 42)


def _poses(rotations_deg, centres) -> torch.Tensor:
    """[1, S, 4, 4] camera-to-world: a turn about the camera's y axis, then the centre."""
    T = torch.eye(4, dtype=torch.float64).repeat(len(centres), 1, 1)
    for i, (angle, centre) in enumerate(zip(rotations_deg, centres)):
        half = math.radians(angle) / 2
        T[i, :3, :3] = quat_to_mat(torch.tensor([0.0, math.sin(half), 0.0, math.cos(half)], dtype=torch.float64))
        T[i, :3, 3] = torch.tensor(centre, dtype=torch.float64)
    return T[None]


def _encode(T: torch.Tensor) -> torch.Tensor:
    K = torch.tensor([[30.0, 0, 21], [0, 30.0, 14], [0, 0, 1]], dtype=torch.float64).expand(*T.shape[:2], 3, 3)
    return extri_intri_to_pose_encoding(T[..., :3, :], K, HW)


def test_camera_errors_are_the_angles_between_rotations_and_between_centres():
    truth = _encode(_poses([0, 10, 20], [(0, 0, 0), (1, 0, 0), (0, 0, 2)]))
    assert camera_errors_deg(truth, truth, HW) == pytest.approx((0.0, 0.0), abs=1e-5)
    # Rotations off by 5° and 15°; the second centre seen 45° away, the third along its truth (scaled).
    pred = _encode(_poses([0, 15, 35], [(0, 0, 0), (1, 0, 1), (0, 0, 5)]))
    rotation, translation = camera_errors_deg(pred, truth, HW)
    assert rotation == pytest.approx((5 + 15) / 2, abs=1e-4)
    assert translation == pytest.approx((45 + 0) / 2, abs=1e-4)
    # A frame whose true centre is the first one's has no direction: left out.
    still = _encode(_poses([0, 0], [(0, 0, 0), (0, 0, 0)]))
    assert math.isnan(camera_errors_deg(still, still, HW)[1])


def test_pair_auc_is_eval_s_pose_auc_over_each_clip_s_pairs_averaged_over_the_clips():
    truth = _encode(_poses([0, 10, 20], [(0, 0, 0), (1, 0, 0), (2, 0, 1)]))
    assert pair_auc(truth, truth, HW) == pytest.approx(1.0)
    # Frame 2's centre moved: seen 63 degrees off from frames 0 and 1, so the pairs (0, 2) and
    # (1, 2) fail every threshold up to 30 degrees and the pair (0, 1), exact, passes them all.
    off = _encode(_poses([0, 10, 20], [(0, 0, 0), (1, 0, 0), (2 - 2.0, 0, 1 + 2.0)]))
    one_clip = pair_auc(off, truth, HW)
    assert one_clip == pytest.approx(1 / 3, abs=1e-9)
    both = torch.cat((truth, off))
    assert pair_auc(both, torch.cat((truth, truth)), HW) == pytest.approx((1 + 1 / 3) / 2, abs=1e-9)


def test_depth_abs_rel_scales_each_frame_by_its_medians_and_skips_empty_frames():
    gt = torch.tensor([[[[1.0, 2.0], [4.0, 8.0]], [[1.0, 1.0], [1.0, 1.0]]]])  # [1, 2, 2, 2]
    valid = torch.ones_like(gt, dtype=torch.bool)
    valid[0, 1] = False  # the second frame has no valid pixel
    assert depth_abs_rel(3 * gt, gt, valid) == pytest.approx(0.0, abs=1e-12)  # a scale is forgiven
    pred = gt.clone()
    pred[0, 0, 1, 1] = 16.0  # one pixel twice too far; the medians stay 3 and 3
    assert depth_abs_rel(pred, gt, valid) == pytest.approx((16 - 8) / 8 / 4)


def test_validation_scores_held_out_clips_and_leaves_the_training_mode(tmp_path):
    validation = Validation(3, 3, HW, torch.device("cpu"))
    seeds = validation.batch["seed"].tolist()
    assert seeds == ProceduralClips(3, 3, HW, split="val").seeds(0) and {seed_split(s) for s in seeds} == {"val"}

    class Constant(torch.nn.Module):  # predicts the truth's cameras and depth, whatever the images
        def forward(self, images):
            return {"pose_enc": validation.gt_pose_enc.float(), "pose_enc_list": [validation.gt_pose_enc.float()],
                    "depth": 2 * validation.batch["depth"][..., None], "depth_conf": torch.ones_like(validation.batch["depth"])}

    module = Constant().train()
    values = validation(module)
    assert module.training
    assert values["val_rotation_deg"] == pytest.approx(0.0, abs=1e-4)
    assert values["val_translation_deg"] == pytest.approx(0.0, abs=1e-3)
    assert values["val_depth_abs_rel"] == pytest.approx(0.0, abs=1e-6)
    assert values["val_auc30"] == pytest.approx(1.0)
    assert values["val_camera"] == pytest.approx(0.0, abs=1e-9) and values["val_depth"] > 0
    assert set(values) >= {"val_loss", "val_camera_rotation", "val_depth_gradient"}


def test_the_reference_levels_are_what_a_still_camera_and_a_zero_flow_score(tmp_path):
    """Validation.references: the val_rotation_deg and val_flow that a network predicting the
    identity rotation and no motion for every patch records on the same clips."""
    from mapstream.train.losses import LossWeights

    validation = Validation(3, 3, HW, torch.device("cpu"), loss=LossWeights(flow=1.0), frame_step=3)
    still = validation.gt_pose_enc.float().clone()
    still[..., 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    patches = (HW[0] // 14) * (HW[1] // 14)

    def forward(images):
        return {"pose_enc": still, "pose_enc_list": [still], "depth": validation.batch["depth"][..., None],
                "depth_conf": torch.ones_like(validation.batch["depth"]),
                "patch_flow": torch.zeros(*images.shape[:2], patches, 4)}

    values = validation(forward)
    levels = validation.references(patch_size=14)
    assert set(levels) == {"val_rotation_deg", "val_flow"}
    assert levels["val_rotation_deg"] == pytest.approx(values["val_rotation_deg"], abs=1e-6)
    assert levels["val_flow"] == pytest.approx(values["val_flow"], rel=1e-6)
    assert levels["val_rotation_deg"] > 1.0 and levels["val_flow"] > 0  # these clips turn and move
    assert set(validation.references()) == {"val_rotation_deg"}


def test_a_run_records_validation_at_its_validation_steps(tmp_path):
    config = TrainConfig(model="tiny", frames=2, image_hw=(28, 28), num_scale_frames=1, batch_size=1, warmup_steps=1,
                         log_every=1, val_every=2, val_clips=2, steps=3, tensorboard=False, device="cpu", out=tmp_path)
    train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    with_val = [r["step"] for r in records if "val_loss" in r]
    assert with_val == [2, 3]  # every second step and the last
    levels = json.loads((tmp_path / "val_references.json").read_text())
    assert levels == pytest.approx(Validation(2, 2, (28, 28), torch.device("cpu")).references())
    for record in records:
        if "val_loss" in record:
            assert all(math.isfinite(record[k]) for k in ("val_loss", "val_rotation_deg", "val_depth_abs_rel"))
    with pytest.raises(ValueError, match="val_every .* must be a multiple of log_every"):
        TrainConfig(val_every=3, log_every=2)


def test_held_out_clips_can_be_longer_and_have_other_scale_frames_than_the_training_clips(tmp_path):
    """--val-frames / --val-scale-frames / --val-frame-step: a run on short clips is scored at the
    length and with the scale frames it streams with (or at the motion it trains on); the
    recorded values are those of the final weights on exactly such clips."""
    import mapstream
    from mapstream.train.forward import clip_forward

    config = TrainConfig(model="tiny", frames=2, image_hw=(28, 42), num_scale_frames=1, batch_size=1, warmup_steps=1,
                         log_every=1, val_every=1, val_clips=2, val_frames=5, val_scale_frames=3, val_frame_step=2,
                         steps=1,
                         tensorboard=False, device="cpu", out=tmp_path)
    train(config, progress=False)
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    model = mapstream.load_model(tmp_path / "model.safetensors", preset="tiny")

    def forward(images, num_scale_frames=1):
        return clip_forward(model, images, num_scale_frames=num_scale_frames)

    five_frames = Validation(2, 5, (28, 42), torch.device("cpu"), num_scale_frames=3, frame_step=2)
    assert five_frames.batch["images"].shape[:2] == (2, 5)
    # the paths of 9-frame clips, every second camera (rotations relative to the same first one)
    stepped, nine = five_frames.batch["T_world_cam"], Validation(2, 9, (28, 42), torch.device("cpu")).batch["T_world_cam"]
    torch.testing.assert_close(stepped[:, :, :3, :3], nine[:, ::2, :3, :3])
    expected = five_frames(forward)
    for key in ("val_loss", "val_rotation_deg", "val_translation_deg", "val_depth_abs_rel"):
        assert record[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    one_scale_frame = Validation(2, 5, (28, 42), torch.device("cpu"))(forward)
    assert one_scale_frame["val_loss"] != pytest.approx(expected["val_loss"], rel=1e-6)  # the option reaches the forward
    with pytest.raises(ValueError, match="scale frames exceed"):
        TrainConfig(frames=4, num_scale_frames=2, val_frames=6, val_scale_frames=7)
    with pytest.raises(ValueError, match="val_frame_step"):
        TrainConfig(val_frame_step=0)
    with pytest.raises(ValueError, match="scale frames exceed"):
        TrainConfig(frames=8, num_scale_frames=4, val_frames=3)
