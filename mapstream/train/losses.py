"""Training losses: camera pose encoding, confidence-aware depth and world points.

What each term is and where it comes from is written down in ``docs/TRAINING.md`` (section
"Losses"). In short, for one clip of ``S`` frames:

* camera: a robust (Huber) distance between the predicted and the true pose encoding,
  translation, quaternion (up to its sign) and field of view separately, over every
  refinement iteration of the camera head with weight ``gamma ** (n - 1 - i)``, and
  optionally ``1 - cos`` between predicted and true translation (its direction) and between
  the predicted and true direction in which each frame sees every later one (pairs);
* depth / points: ``conf * |r| + conf * |grad r| - alpha * log(conf)`` averaged over the
  valid pixels, ``r`` the residual and ``grad r`` its finite differences across the image;
* placed points (optional): the distance between each valid pixel's true world point and
  its predicted depth unprojected by its predicted camera, the points a fused cloud is made
  of, which ties the scale of the predicted translations to that of the predicted depth;
* patch flow (training from scratch, optional): a robust distance between each patch's
  predicted and true displacement to the first and the previous frame, over the patches
  whose flow is known (:mod:`mapstream.train.flow`).

Reduction: every term is first averaged within each clip (over its frames, or its valid
pixels), then over the ``B`` clips of the batch. A clip weighs the same whatever its number of
valid pixels, a clip with no valid pixel adds 0, and the mean over a batch split across
processes (DDP averages the processes' gradients) equals the mean over the whole batch.

All functions take fp32 (or fp64) tensors, are batched and differentiable, and return
``(loss, parts)``: ``loss`` a 0-d tensor carrying the gradient, ``parts`` a dict of detached
0-d tensors for logging.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mapstream.geometry import pose_encoding_to_extri_intri, quat_to_mat, unproject_depth
from mapstream.train.flow import patch_flow_targets
from mapstream.train.normalize import gt_pose_encoding, normalize_clip, world_points

__all__ = [
    "LossWeights",
    "camera_loss",
    "confidence_regression",
    "depth_loss",
    "flow_loss",
    "huber",
    "pair_directions",
    "placed_points_loss",
    "point_loss",
    "total_loss",
]


@dataclass(frozen=True)
class LossWeights:
    """The weights of the loss terms and their hyper-parameters (defaults: the choices
    ``docs/TRAINING.md`` explains)."""

    camera: float = 1.25
    """Weight of the camera loss in the total. The camera loss sums the head's iterations
    (4 by default) where VGGT's released recipe averages them with weight 5; 5 / 4 keeps
    that recipe's balance between the camera and the depth terms."""
    depth: float = 1.0
    """Weight of the depth loss in the total."""
    points: float = 1.0
    """Weight of the world-point loss in the total (used only when the predictions hold
    ``world_points``, i.e. the point head is built)."""
    camera_gamma: float = 0.6
    """Decay over the camera head's iterations: iteration ``i`` of ``n`` weighs
    ``gamma ** (n - 1 - i)``, the last one 1."""
    camera_delta: float = 0.05
    """Width of the Huber loss's quadratic zone, in the encoding's units (normalised length,
    quaternion component, radian); 0 gives the plain L1 distance."""
    camera_translation: float = 1.0
    """Weight of the translation part within the camera loss."""
    camera_rotation: float = 1.0
    """Weight of the quaternion part within the camera loss."""
    camera_fov: float = 0.5
    """Weight of the field-of-view part within the camera loss."""
    camera_direction: float = 0.0
    """Weight of the translation-direction part within the camera loss: ``1 - cos`` of the
    angle between predicted and true translation, frames that moved only. Scale-free: it
    asks for the direction of a small motion as firmly as of a large one, where the
    translation part's Huber distance barely tells a small motion from none."""
    camera_pairs: float = 0.0
    """Weight of the pairwise direction part within the camera loss: for every pair of frames
    ``i < j`` of a clip whose true centres differ, ``1 - cos`` of the angle between the
    predicted and the true direction of frame j's centre in camera i's axes. Pose AUC scores
    every pair by this angle (and the relative rotation); the direction part above scores
    only the pairs of the first frame, and the translation part barely the near pairs, whose
    relative motion is small."""
    depth_alpha: float = 0.2
    """Weight ``alpha`` of the depth confidence's ``-alpha * log(conf)`` regulariser."""
    depth_gradient: float = 1.0
    """Weight of the depth gradient term relative to the depth residual term."""
    points_alpha: float = 0.2
    """Weight ``alpha`` of the point confidence's ``-alpha * log(conf)`` regulariser."""
    points_gradient: float = 1.0
    """Weight of the point-map gradient term relative to the point residual term."""
    placed: float = 0.0
    """Weight of the placed-points loss (:func:`placed_points_loss`): the predicted depth
    unprojected by the predicted camera against the true world points, on the steps that
    predict depth. The other terms score the depth and the cameras apart, so the scale of a
    predicted path may disagree with the depth's, which misplaces every frame of a fused
    cloud; this term scores them together."""
    flow: float = 0.0
    """Weight of the patch-flow loss in the total (used only when the predictions hold
    ``patch_flow``: the trainer's flow head, on when this weight is above 0)."""
    flow_delta: float = 0.25
    """Width of the patch-flow loss's quadratic (Huber) zone, in patches."""
    gradient_scales: int = 1
    """Number of image scales of the gradient terms (scale ``k`` compares every ``2**k``-th
    pixel, so later scales see the shape of larger regions); the terms average over them."""


def huber(x: Tensor, delta: float) -> Tensor:
    """Elementwise robust distance: ``x**2 / (2 delta)`` where ``|x| < delta``, else
    ``|x| - delta / 2``.

    This is the Huber function divided by ``delta``: its slope far from 0 is 1, the slope of
    the L1 distance, so ``delta`` chooses only where it turns quadratic (smooth at 0, where
    L1's gradient jumps) and not the loss's overall scale. ``delta = 0`` is exactly ``|x|``.
    """
    if delta < 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    a = x.abs()
    if delta == 0:
        return a
    return torch.where(a < delta, 0.5 * a * a / delta, a - 0.5 * delta)


def _masked_clip_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over ``mask`` within each clip (dim 0), then over the clips; a clip
    with an empty mask adds 0. ``torch.where`` (not a product) keeps a non-finite value
    outside the mask out of the result."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    per_clip = torch.where(mask, values, zero).flatten(1).sum(1)
    count = mask.flatten(1).sum(1).clamp(min=1)
    return (per_clip / count).mean()


def _norm(x: Tensor) -> Tensor:
    """Euclidean norm over the last dim with a zero (not NaN) gradient at 0, so that a perfect
    prediction still back-propagates finite values."""
    if x.shape[-1] == 1:
        return x.squeeze(-1).abs()
    sq = (x * x).sum(-1)
    positive = sq > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, sq, torch.ones_like(sq))), torch.zeros_like(sq))


def _check_iterations(pose_enc_list: Sequence[Tensor] | Tensor, gt: Tensor) -> list[Tensor]:
    iterations = [pose_enc_list] if isinstance(pose_enc_list, Tensor) else list(pose_enc_list)
    if not iterations:
        raise ValueError("pose_enc_list holds no iteration")
    for i, pred in enumerate(iterations):
        if pred.shape != gt.shape or gt.shape[-1] != 9:
            raise ValueError(
                f"pose_enc_list[{i}] has shape {list(pred.shape)}; the ground truth's is {list(gt.shape)} ([B, S, 9])"
            )
    return iterations


def camera_loss(
    pose_enc_list: Sequence[Tensor] | Tensor,
    gt: Tensor,
    *,
    gamma: float = 0.6,
    delta: float = 0.05,
    translation_weight: float = 1.0,
    rotation_weight: float = 1.0,
    fov_weight: float = 0.5,
    direction_weight: float = 0.0,
    pairs_weight: float = 0.0,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Robust loss between predicted and true pose encodings, over the head's iterations.

    For one iteration and one frame, with ``h`` = :func:`huber` (``delta``):

    * translation: mean of ``h`` over the 3 components of ``t``;
    * rotation: ``min(sum h(q - q_gt), sum h(q + q_gt)) / 4``: ``q`` and ``-q`` are the same
      rotation, and the head's quaternion is not normalised (its length is pulled to 1 by
      the unit-length ground truth);
    * field of view: mean of ``h`` over ``(fov_h, fov_w)``;
    * direction (computed when ``direction_weight`` > 0): ``1 - cos(t, t_gt)``, over the
      frames whose true ``t`` is not 0 (a clip's first frame has none);
    * pairs (computed when ``pairs_weight`` > 0): ``1 - cos(d_ij, d_ij_gt)`` with
      ``d_ij = R_i^T (t_j - t_i)`` (frame j's centre in camera i's axes, ``R_i`` the
      rotation of ``q_i``), over the pairs ``i < j`` of frames in ``mask`` whose true centres
      differ.

    Each part is averaged over the frames of a clip (those of ``mask``), then over the clips,
    and summed over iterations ``i = 0 .. n-1`` with weight ``gamma ** (n - 1 - i)``.

    Args:
        pose_enc_list: the head's iterations, each ``[B, S, 9]`` (a single tensor counts as
            one iteration).
        gt: ``[B, S, 9]`` (:func:`mapstream.train.normalize.gt_pose_encoding`).
        gamma: iteration decay.
        delta: Huber width.
        translation_weight, rotation_weight, fov_weight, direction_weight, pairs_weight: the
            parts' weights in the loss.
        mask: ``[B, S]`` bool, the frames that count (all when None).

    Returns:
        ``(loss, parts)``, parts ``camera_translation``, ``camera_rotation``,
        ``camera_fov`` and, with their weights, ``camera_direction`` and ``camera_pairs`` (each
        summed over iterations with the decay, before the parts' weights) and ``camera`` (=
        loss).
    """
    iterations = _check_iterations(pose_enc_list, gt)
    if mask is None:
        mask = torch.ones(gt.shape[:-1], dtype=torch.bool, device=gt.device)
    elif mask.shape != gt.shape[:-1]:
        raise ValueError(f"mask must have shape {list(gt.shape[:-1])} ([B, S]), got {list(mask.shape)}")
    n = len(iterations)
    total_t = total_r = total_f = None
    total_d = gt.new_zeros(())
    total_p = gt.new_zeros(())
    if direction_weight:
        moved = mask & (_norm(gt[..., 0:3]) > 1e-6)
    if pairs_weight:
        first, second = torch.triu_indices(gt.shape[1], gt.shape[1], 1, device=gt.device)
        gt_pairs = pair_directions(gt, first, second)
        apart = mask[:, first] & mask[:, second] & (_norm(gt_pairs) > 1e-6)
    for i, pred in enumerate(iterations):
        weight = gamma ** (n - 1 - i)
        diff = pred - gt
        loss_t = huber(diff[..., 0:3], delta).mean(-1)
        q, q_gt = pred[..., 3:7], gt[..., 3:7]
        loss_r = torch.minimum(huber(q - q_gt, delta).sum(-1), huber(q + q_gt, delta).sum(-1)) / 4
        loss_f = huber(diff[..., 7:9], delta).mean(-1)
        parts = [weight * _masked_clip_mean(x, mask) for x in (loss_t, loss_r, loss_f)]
        if direction_weight:
            cos = F.cosine_similarity(pred[..., 0:3], gt[..., 0:3], dim=-1, eps=1e-8)
            total_d = total_d + weight * _masked_clip_mean(1 - cos, moved)
        if pairs_weight:
            cos = F.cosine_similarity(pair_directions(pred, first, second), gt_pairs, dim=-1, eps=1e-8)
            total_p = total_p + weight * _masked_clip_mean(1 - cos, apart)
        if total_t is None:
            total_t, total_r, total_f = parts
        else:
            total_t, total_r, total_f = total_t + parts[0], total_r + parts[1], total_f + parts[2]
    loss = translation_weight * total_t + rotation_weight * total_r + fov_weight * total_f
    parts = {
        "camera_translation": total_t.detach(),
        "camera_rotation": total_r.detach(),
        "camera_fov": total_f.detach(),
    }
    if direction_weight:
        loss = loss + direction_weight * total_d
        parts["camera_direction"] = total_d.detach()
    if pairs_weight:
        loss = loss + pairs_weight * total_p
        parts["camera_pairs"] = total_p.detach()
    parts["camera"] = loss.detach()
    return loss, parts


def pair_directions(pose_enc: Tensor, first: Tensor, second: Tensor) -> Tensor:
    """``R_i^T (t_j - t_i)`` for the frame pairs ``(first[k], second[k])`` of ``pose_enc``
    ``[B, S, 9]``: where frame j's centre lies in camera i's axes, ``[B, K, 3]`` (the relative
    translation whose direction pose AUC scores)."""
    R = quat_to_mat(pose_enc[..., 3:7])
    t = pose_enc[..., 0:3]
    offset = t[:, second] - t[:, first]
    return (R[:, first].transpose(-1, -2) @ offset.unsqueeze(-1)).squeeze(-1)


def _gradient_residual(r: Tensor, valid: Tensor) -> Tensor:
    """Per pixel ``|r(right) - r(here)| + |r(below) - r(here)|``, ``[B, S, H, W]``, each
    difference counted only where both of its pixels are valid (0 otherwise, and 0 in the last
    column / row, which has no forward neighbour)."""
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    both_x = (valid[..., :, 1:] & valid[..., :, :-1])[..., None]
    both_y = (valid[..., 1:, :] & valid[..., :-1, :])[..., None]
    dx = torch.where(both_x, r[..., :, 1:, :] - r[..., :, :-1, :], zero)
    dy = torch.where(both_y, r[..., 1:, :, :] - r[..., :-1, :, :], zero)
    pad = torch.nn.functional.pad
    return pad(_norm(dx), (0, 1)) + pad(_norm(dy), (0, 0, 0, 1))


def confidence_regression(
    pred: Tensor,
    conf: Tensor,
    gt: Tensor,
    valid: Tensor,
    *,
    alpha: float = 0.2,
    gradient_weight: float = 1.0,
    gradient_scales: int = 1,
    name: str = "depth",
) -> tuple[Tensor, dict[str, Tensor]]:
    """The confidence-aware regression shared by depth and points.

    Per valid pixel ``p`` of a clip, with ``r = pred - gt`` and ``|.|`` the Euclidean norm
    over the channels (the absolute value for depth):

        conf(p) |r(p)|  +  gradient_weight * conf(p) |grad r|(p)  -  alpha log conf(p)

    where ``|grad r|(p) = |r(p + x) - r(p)| + |r(p + y) - r(p)|`` (forward differences to the
    right and downward neighbour, each only where both pixels are valid), averaged over the
    clip's valid pixels, then over the clips. With ``gradient_scales = k`` the gradient term
    is the mean over the grids of every ``2**j``-th pixel, ``j < k`` (each normalised by its
    own valid count). A perfect prediction leaves exactly ``-alpha * mean log conf``.

    Args:
        pred: ``[B, S, H, W, C]``.
        conf: ``[B, S, H, W]``, > 0 (the heads give ``1 + exp(.)``).
        gt: ``[B, S, H, W, C]`` (values outside ``valid`` are never read).
        valid: ``[B, S, H, W]`` bool.

    Returns:
        ``(loss, parts)``, parts ``{name}_residual``, ``{name}_gradient`` (before
        ``gradient_weight``), ``{name}_reg`` and ``{name}`` (= loss).
    """
    if pred.ndim != 5 or gt.shape != pred.shape:
        raise ValueError(
            f"{name}: prediction {list(pred.shape)} and ground truth {list(gt.shape)} must both be [B, S, H, W, C]"
        )
    if conf.shape != pred.shape[:-1] or valid.shape != pred.shape[:-1]:
        raise ValueError(
            f"{name}: confidence {list(conf.shape)} and valid {list(valid.shape)} must be [B, S, H, W]"
            f" = {list(pred.shape[:-1])}"
        )
    if gradient_scales < 1:
        raise ValueError(f"gradient_scales must be >= 1, got {gradient_scales}")
    valid = valid.to(torch.bool)
    # Ground truth outside the mask may hold anything (inf, NaN): it is replaced before the
    # subtraction so that neither the value nor the gradient of the residual can see it.
    gt = torch.where(valid[..., None], gt, torch.zeros((), dtype=gt.dtype, device=gt.device))
    r = pred - gt

    residual = _masked_clip_mean(conf * _norm(r), valid)
    reg = _masked_clip_mean(-alpha * torch.log(conf), valid)
    gradient = torch.zeros((), dtype=pred.dtype, device=pred.device)
    for j in range(gradient_scales):
        step = 2**j
        v = valid[..., ::step, ::step]
        grad_r = _gradient_residual(r[..., ::step, ::step, :], v)
        gradient = gradient + _masked_clip_mean(conf[..., ::step, ::step] * grad_r, v)
    gradient = gradient / gradient_scales

    loss = residual + gradient_weight * gradient + reg
    parts = {
        name: loss.detach(),
        f"{name}_residual": residual.detach(),
        f"{name}_gradient": gradient.detach(),
        f"{name}_reg": reg.detach(),
    }
    return loss, parts


def depth_loss(
    depth: Tensor,
    conf: Tensor,
    gt_depth: Tensor,
    valid: Tensor,
    *,
    alpha: float = 0.2,
    gradient_weight: float = 1.0,
    gradient_scales: int = 1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Confidence-aware depth loss (:func:`confidence_regression` with one channel).

    Args:
        depth: predicted depth ``[B, S, H, W, 1]`` (or ``[B, S, H, W]``).
        conf: ``depth_conf`` ``[B, S, H, W]``.
        gt_depth: ``[B, S, H, W]`` (or with a trailing 1).
        valid: ``[B, S, H, W]`` bool.

    Returns:
        ``(loss, parts)`` with parts ``depth``, ``depth_residual``, ``depth_gradient``,
        ``depth_reg``.
    """
    if depth.ndim == 4:
        depth = depth[..., None]
    if gt_depth.ndim == 4:
        gt_depth = gt_depth[..., None]
    return confidence_regression(
        depth, conf, gt_depth.to(depth.dtype), valid,
        alpha=alpha, gradient_weight=gradient_weight, gradient_scales=gradient_scales, name="depth",
    )


def point_loss(
    points: Tensor,
    conf: Tensor,
    gt_points: Tensor,
    valid: Tensor,
    *,
    alpha: float = 0.2,
    gradient_weight: float = 1.0,
    gradient_scales: int = 1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Confidence-aware world-point loss (:func:`confidence_regression` on xyz, Euclidean
    residual).

    Args:
        points: predicted ``world_points`` ``[B, S, H, W, 3]``.
        conf: ``world_points_conf`` ``[B, S, H, W]``.
        gt_points: ``[B, S, H, W, 3]`` (:func:`mapstream.train.normalize.world_points` of a
            normalised batch).
        valid: ``[B, S, H, W]`` bool.

    Returns:
        ``(loss, parts)`` with parts ``points``, ``points_residual``, ``points_gradient``,
        ``points_reg``.
    """
    return confidence_regression(
        points, conf, gt_points.to(points.dtype), valid,
        alpha=alpha, gradient_weight=gradient_weight, gradient_scales=gradient_scales, name="points",
    )


def placed_points_loss(
    depth: Tensor, pose_enc: Tensor, gt_points: Tensor, valid: Tensor, image_hw: Sequence[int]
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean distance between the true world point of each valid pixel and its predicted depth
    placed by its predicted camera (``T_world_cam`` and ``K`` of ``pose_enc``), averaged over
    each clip's valid pixels, then over the clips. Gradients reach both the depth and the
    camera: a path whose length disagrees with the depth's scale costs here.

    Args:
        depth: predicted depth ``[B, S, H, W, 1]`` (or ``[B, S, H, W]``).
        pose_enc: the camera head's final ``pose_enc`` ``[B, S, 9]``.
        gt_points: ``[B, S, H, W, 3]`` (:func:`mapstream.train.normalize.world_points` of a
            normalised batch).
        valid: ``[B, S, H, W]`` bool.
        image_hw: ``(H, W)`` of the frames the encoding's fields of view refer to.

    Returns:
        ``(loss, {"placed": loss})``.
    """
    if depth.ndim == 5:
        depth = depth.squeeze(-1)
    if depth.shape != valid.shape or gt_points.shape != (*valid.shape, 3) or pose_enc.shape[:2] != valid.shape[:2]:
        raise ValueError(f"placed points: depth {list(depth.shape)}, pose_enc {list(pose_enc.shape)}, true points "
                         f"{list(gt_points.shape)} and valid {list(valid.shape)} do not describe the same frames")
    valid = valid.to(torch.bool)
    zero = torch.zeros((), dtype=depth.dtype, device=depth.device)
    # Pixels outside the mask are zeroed before the camera multiplies them: a non-finite
    # depth there would otherwise reach the camera's gradient (0 * NaN) through the sum.
    depth = torch.where(valid, depth, zero)
    T_world_cam, K = pose_encoding_to_extri_intri(pose_enc, image_hw)
    placed = unproject_depth(depth, K, T_world_cam)
    gt = torch.where(valid[..., None], gt_points.to(placed.dtype), zero.to(placed.dtype))
    loss = _masked_clip_mean(_norm(placed - gt), valid)
    return loss, {"placed": loss.detach()}


def flow_loss(flow: Tensor, gt_flow: Tensor, known: Tensor, *, delta: float = 0.25) -> tuple[Tensor, dict[str, Tensor]]:
    """Patch-flow loss: ``huber(|flow - gt|, delta)`` per patch and reference frame, averaged
    over the known ones.

    Args:
        flow: predicted ``patch_flow`` ``[B, S, P, 2R]`` (patches; a (du, dv) pair per reference).
        gt_flow, known: :func:`mapstream.train.flow.patch_flow_targets` (``[B, S, P, 2R]``,
            ``[B, S, P, R]`` bool).

    Returns:
        ``(loss, {"flow": loss})``.
    """
    if flow.shape != gt_flow.shape or known.shape != (*flow.shape[:-1], flow.shape[-1] // 2):
        raise ValueError(f"patch_flow {list(flow.shape)} does not fit the true flow {list(gt_flow.shape)} "
                         f"and its mask {list(known.shape)}")
    error = _norm((flow - gt_flow.to(flow.dtype)).unflatten(-1, (-1, 2)))  # [B, S, P, R]
    loss = _masked_clip_mean(huber(error, delta), known)
    return loss, {"flow": loss.detach()}


def _patch_size(image_hw: tuple[int, int], num_patches: int) -> int:
    """The patch size that tiles an ``image_hw`` frame into ``num_patches`` patches."""
    patch = round((image_hw[0] * image_hw[1] / num_patches) ** 0.5)
    if patch < 1 or (image_hw[0] // patch) * (image_hw[1] // patch) != num_patches:
        raise ValueError(f"patch_flow has {num_patches} patches a frame, which no patch size fits to "
                         f"{image_hw[0]} x {image_hw[1]} frames")
    return patch


def _fp(x: Tensor) -> Tensor:
    """Half-precision predictions (an autocast region) are compared in fp32."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def total_loss(
    pred: Mapping[str, Any], batch: Mapping[str, Any], weights: LossWeights = LossWeights()
) -> tuple[Tensor, dict[str, Tensor]]:
    """The training objective: ``camera * L_camera + depth * L_depth + points * L_points``
    (``+ placed * L_placed`` where that weight is set, ``+ flow * L_flow`` with a flow head).

    ``batch`` is normalised first (:func:`mapstream.train.normalize.normalize_clip`) unless it
    already carries ``scale``. The camera term uses ``pose_enc_list`` (``pose_enc`` alone when
    the list is absent); a clip with no valid pixel has no scale and adds 0 to every term. A
    term whose weight is 0, or whose prediction is absent (``world_points`` without a point
    head), is not computed.

    Returns:
        ``(loss, parts)``: parts ``loss`` and those of :func:`camera_loss`,
        :func:`depth_loss`, :func:`point_loss` for the terms computed, all detached 0-d
        tensors.
    """
    if "scale" not in batch:
        batch = normalize_clip(batch)
    valid = batch["valid"]
    image_hw = tuple(batch["images"].shape[-2:]) if "images" in batch else tuple(valid.shape[-2:])
    terms: list[Tensor] = []
    parts: dict[str, Tensor] = {}

    if weights.camera and ("pose_enc_list" in pred or "pose_enc" in pred):
        listed = pred.get("pose_enc_list")
        iterations = [_fp(p) for p in (listed if listed is not None else [pred["pose_enc"]])]
        gt = gt_pose_encoding(batch, image_hw).to(iterations[-1].dtype)
        has_scale = valid.flatten(2).any(-1).any(-1, keepdim=True).expand(gt.shape[:-1])
        loss, camera_parts = camera_loss(
            iterations, gt,
            gamma=weights.camera_gamma, delta=weights.camera_delta,
            translation_weight=weights.camera_translation, rotation_weight=weights.camera_rotation,
            fov_weight=weights.camera_fov, direction_weight=weights.camera_direction,
            pairs_weight=weights.camera_pairs, mask=has_scale,
        )
        terms.append(weights.camera * loss)
        parts.update(camera_parts)

    if weights.depth and "depth" in pred:
        loss, depth_parts = depth_loss(
            _fp(pred["depth"]), _fp(pred["depth_conf"]), batch["depth"], valid,
            alpha=weights.depth_alpha, gradient_weight=weights.depth_gradient,
            gradient_scales=weights.gradient_scales,
        )
        terms.append(weights.depth * loss)
        parts.update(depth_parts)

    # Both terms read the true world points: computed once, where either applies.
    with_points = bool(weights.points) and "world_points" in pred
    with_placed = bool(weights.placed) and "depth" in pred and "pose_enc" in pred
    gt_points = world_points(batch) if with_points or with_placed else None

    if with_points:
        loss, point_parts = point_loss(
            _fp(pred["world_points"]), _fp(pred["world_points_conf"]), gt_points, valid,
            alpha=weights.points_alpha, gradient_weight=weights.points_gradient,
            gradient_scales=weights.gradient_scales,
        )
        terms.append(weights.points * loss)
        parts.update(point_parts)

    if with_placed:
        loss, placed_parts = placed_points_loss(_fp(pred["depth"]), _fp(pred["pose_enc"]), gt_points, valid, image_hw)
        terms.append(weights.placed * loss)
        parts.update(placed_parts)

    if weights.flow and "patch_flow" in pred:
        flow = _fp(pred["patch_flow"])
        patch = _patch_size(image_hw, flow.shape[-2])
        gt_flow, known = patch_flow_targets(batch["depth"], valid, batch["T_world_cam"], batch["K"], patch)
        loss, flow_parts = flow_loss(flow, gt_flow, known, delta=weights.flow_delta)
        terms.append(weights.flow * loss)
        parts.update(flow_parts)

    if not terms:
        raise ValueError(f"no loss term applies: the predictions hold {sorted(pred)} and the weights are {weights}")
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    parts["loss"] = total.detach()
    return total, parts
