"""Validation during training: held-out procedural clips, rendered once, scored at log steps.

A training step's losses change with every batch (other rooms, other paths), so their curve
cannot show a slow change; the same clips scored again and again can. `Validation` renders
``val_clips`` clips of the "val" split (seeds training never draws) once, and each call runs
the clip forward on them without gradients and returns, as ``val_*`` values:

* the loss and its parts (`total_loss`, as the training step computes them);
* ``val_rotation_deg``: the mean angle between predicted and true camera rotations, each
  relative to the clip's first frame (frames after the first);
* ``val_translation_deg``: the mean angle between predicted and true camera centres seen from
  the first frame (frames that moved);
* ``val_auc30``: pose AUC@30 over every pair of frames of a clip (`mapstream eval`'s own
  measure: relative rotation and translation direction both within the threshold), the
  mean over the clips;
* ``val_depth_abs_rel``: depth's mean |d - d_gt| / d_gt after scaling each frame's prediction
  by the ratio of medians, computed by `mapstream eval`'s own depth metrics.

A head that predicts one mean camera for every frame keeps the angles where they start; a
camera that learns brings them down. `Validation.references` gives the levels to read them
against: the rotation error of a camera that never turns and the flow loss of a flow of zero
on the same clips (a run writes them to ``val_references.json``).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor

from ..eval.depth import depth_metrics
from ..eval.trajectory import pose_auc, rotation_angle_deg
from ..geometry import pose_encoding_to_extri_intri
from .data import ProceduralClips
from .flow import patch_flow_targets
from .losses import LossWeights, flow_loss, total_loss
from .normalize import gt_pose_encoding, normalize_clip, valid_mask

__all__ = ["Validation", "camera_errors_deg", "depth_abs_rel", "pair_auc"]


def camera_errors_deg(pred_pose_enc: Tensor, gt_pose_enc: Tensor, image_hw: tuple[int, int]) -> tuple[float, float]:
    """(rotation, translation direction) errors in degrees, means over the frames after the
    first of every clip; both encodings ``[B, S, 9]`` relative to the clip's first frame.
    Frames whose true centre sits on the first one's have no direction and are left out of
    the translation mean (NaN when none moved)."""
    pred_T, _ = pose_encoding_to_extri_intri(pred_pose_enc.double(), image_hw)
    gt_T, _ = pose_encoding_to_extri_intri(gt_pose_enc.double(), image_hw)
    pred_T, gt_T = pred_T[:, 1:], gt_T[:, 1:]
    relative = pred_T[..., :3, :3].transpose(-1, -2) @ gt_T[..., :3, :3]
    rotation = rotation_angle_deg(relative.cpu().numpy()).mean()
    t_pred, t_gt = pred_T[..., :3, 3], gt_T[..., :3, 3]
    moved = t_gt.norm(dim=-1) > 1e-6
    cos_t = torch.nn.functional.cosine_similarity(t_pred, t_gt, dim=-1, eps=1e-12).clamp(-1, 1)
    translation = torch.rad2deg(torch.arccos(cos_t))[moved].mean() if bool(moved.any()) else torch.tensor(math.nan)
    return float(rotation), float(translation)


def pair_auc(pred_pose_enc: Tensor, gt_pose_enc: Tensor, image_hw: tuple[int, int], threshold: int = 30) -> float:
    """Pose AUC at ``threshold`` degrees over every pair of frames of each clip (`mapstream
    eval`'s `pose_auc`), the mean over the clips; encodings ``[B, S, 9]``, ``S >= 2``."""
    pred_T, _ = pose_encoding_to_extri_intri(pred_pose_enc.double(), image_hw)
    gt_T, _ = pose_encoding_to_extri_intri(gt_pose_enc.double(), image_hw)
    pred_T, gt_T = pred_T.cpu().numpy(), gt_T.cpu().numpy()
    return float(sum(pose_auc(p, g, thresholds=(threshold,)).auc[threshold] for p, g in zip(pred_T, gt_T)) / len(pred_T))


def depth_abs_rel(pred: Tensor, gt: Tensor, valid: Tensor) -> float:
    """`mapstream eval`'s depth abs_rel (`mapstream.eval.depth.depth_metrics`: each frame's
    prediction scaled by the ratio of medians, the mean over frames with a valid pixel) of
    ``[B, S, H, W]`` maps, every clip's frames taken together."""
    return depth_metrics(pred.flatten(0, 1), gt.flatten(0, 1), mask=valid.flatten(0, 1))["abs_rel"]


class Validation:
    """The "val" split's first ``clips`` procedural clips of ``frames`` frames at ``image_hw``,
    rendered once on ``device`` (see the module docstring). ``num_scale_frames``, when given,
    is passed to the forward as its keyword of that name (the clips' own scale frames);
    None leaves the forward's. ``frame_step``: every how many cameras of a path the clips take
    (:class:`~mapstream.train.data.ProceduralClips`)."""

    def __init__(self, clips: int, frames: int, image_hw: tuple[int, int], device: torch.device, *,
                 path_kinds=None, loss: LossWeights | None = None, num_scale_frames: int | None = None,
                 frame_step: int = 1) -> None:
        data = ProceduralClips(clips, frames, tuple(image_hw), split="val", device=device, path_kinds=path_kinds,
                               frame_step=frame_step)
        self.batch = normalize_clip(data.batch(0))
        self.image_hw = tuple(int(s) for s in image_hw)
        self.gt_pose_enc = gt_pose_encoding(self.batch, self.image_hw)
        self.loss = loss if loss is not None else LossWeights()
        self.forward_options = {} if num_scale_frames is None else {"num_scale_frames": int(num_scale_frames)}

    @torch.no_grad()
    def __call__(self, forward: Callable[[Tensor], dict[str, Any]], autocast=None) -> dict[str, float]:
        """The ``val_*`` values of the model behind ``forward`` (the clip forward), under
        ``autocast`` (a context manager, or None); restores the module's training mode."""
        module = forward if isinstance(forward, torch.nn.Module) else None
        training = module.training if module is not None else False
        if module is not None:
            module.eval()
        try:
            if autocast is not None:
                with autocast:
                    pred = forward(self.batch["images"], **self.forward_options)
            else:
                pred = forward(self.batch["images"], **self.forward_options)
        finally:
            if module is not None:
                module.train(training)
        _, parts = total_loss(pred, self.batch, self.loss)
        values = {f"val_{name}": float(value) for name, value in parts.items()}
        rotation, translation = camera_errors_deg(pred["pose_enc"], self.gt_pose_enc, self.image_hw)
        values["val_rotation_deg"], values["val_translation_deg"] = rotation, translation
        if self.gt_pose_enc.shape[1] >= 2:
            values["val_auc30"] = pair_auc(pred["pose_enc"], self.gt_pose_enc, self.image_hw)
        values["val_depth_abs_rel"] = depth_abs_rel(pred["depth"][..., 0], self.batch["depth"], valid_mask(self.batch))
        return values

    @torch.no_grad()
    def references(self, patch_size: int | None = None) -> dict[str, float]:
        """The values a network that has learned nothing of the motion scores on these clips:
        ``val_rotation_deg`` of the identity rotation (every frame predicted to face as the
        first) and, given the network's ``patch_size``, ``val_flow`` of predicting zero flow
        for every patch (the flow loss's own weighting and Huber width)."""
        still = self.gt_pose_enc.clone()
        still[..., 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=still.dtype)  # x, y, z, w: no turn
        levels = {"val_rotation_deg": camera_errors_deg(still, self.gt_pose_enc, self.image_hw)[0]}
        if patch_size is not None:
            gt_flow, known = patch_flow_targets(self.batch["depth"], valid_mask(self.batch),
                                                self.batch["T_world_cam"], self.batch["K"], int(patch_size))
            loss, _ = flow_loss(torch.zeros_like(gt_flow), gt_flow, known, delta=self.loss.flow_delta)
            levels["val_flow"] = float(loss)
        return levels
