"""Windowed inference over a whole sequence: each window runs on a clean cache, windows are
aligned to the first one and stitched."""
from __future__ import annotations

import logging

import torch

from ..config import StreamConfig
from ..progress import progress_bar
from ..sequences import each_sequence
from ..session import Session
from ..validation import check_images
from .align import Sim3, pairwise_alignment, stitch_windows, warp_predictions
from .plan import WindowPlan, plan_windows, warn_if_windows_evict

__all__ = ["windowed_inference", "run_window", "FRAME_SCALE", "FRAME_KEYFRAME", "FRAME_OTHER"]

log = logging.getLogger(__name__)

FRAME_SCALE, FRAME_KEYFRAME, FRAME_OTHER = 0, 1, 2


def run_window(session, images: torch.Tensor) -> dict:
    """Run one window [1, T, 3, H, W] from a clean state; adds frame_type / is_keyframe."""
    session.reset()
    out = session.run(images, progress=False)  # the caller's bar counts windows
    out.pop("images", None)
    length = images.shape[1]
    scale = min(session.num_scale_frames, length)
    types = [FRAME_SCALE] * scale + [
        FRAME_KEYFRAME if session.is_keyframe(i) else FRAME_OTHER for i in range(scale, length)
    ]
    frame_type = torch.tensor([types], dtype=torch.uint8)
    out["frame_type"] = frame_type
    out["is_keyframe"] = frame_type != FRAME_OTHER
    return out


@torch.no_grad()
def windowed_inference(
    model,
    images: torch.Tensor,
    config: StreamConfig | None = None,
    *,
    output_device: torch.device | str | None = None,
    return_windows: bool = False,
    progress: bool | None = None,
) -> dict:
    """Windowed inference over whole sequences: overlapping windows, each on a clean cache,
    aligned to the first by Sim(3) and stitched (docs/WINDOWED.md).

    `config` (default: the model's `stream_config`) gives the windows (window_size, overlap,
    overlap_keyframes, a fixed keyframe_interval), how they are joined (window_join) and how each runs (num_scale_frames,
    precision, backend, the cache's retention). Returns the stitched pose_enc, depth,
    depth_conf (+ world points), frame_type, is_keyframe, and with two or more windows
    chunk_scales [B, n] and chunk_transforms [B, n, 4, 4]; alignment_mode = "scaled"; images;
    with `return_windows` also "windows", the raw per-window predictions before alignment;
    `progress`: a bar over the windows (None: when stderr is a terminal). A batch
    [B, S, 3, H, W] is B independent sequences, run in turn and stacked.
    """
    config = config or model.stream_config
    images = check_images(images, model.config.patch_size)
    return each_sequence(images, lambda sequence: _windowed_sequence(
        model, sequence, config, output_device, return_windows, progress,
    ))


def _windowed_sequence(model, images, config: StreamConfig, output_device, return_windows, progress) -> dict:
    """`windowed_inference` of one sequence [1, S, 3, H, W], already checked."""
    num_frames = images.shape[1]
    keyframe_interval = config.stored_interval
    plan: WindowPlan = plan_windows(
        num_frames,
        window_size=config.window_size,
        scale_frames=config.num_scale_frames,
        overlap_size=config.overlap,
        overlap_keyframes=config.overlap_keyframes,
        keyframe_interval=keyframe_interval,
    )
    log.info("windowed inference: %d frames in %d windows (overlap %d)", num_frames, len(plan.windows), plan.overlap)
    session = Session(
        model, config.with_settings(num_scale_frames=plan.scale_frames, keyframe_interval=keyframe_interval),
        output_device=output_device,
    )
    longest = max(end - start for start, end in plan.windows)
    keyframes = -(-max(longest - plan.scale_frames, 0) // max(keyframe_interval, 1))
    warn_if_windows_evict(plan.scale_frames + keyframes, session.state.aggregator.spec)
    raw = []
    try:
        with progress_bar(len(plan.windows), desc="windows", unit="window", progress=progress) as bar:
            for start, end in plan.windows:
                raw.append(run_window(session, images[:, start:end]))
                bar.update(1)
    finally:
        session.close()
    result_images = images.to(output_device) if output_device is not None else images
    if len(raw) == 1:
        out = dict(raw[0])
        out["alignment_mode"] = "scaled"
        out["images"] = result_images
        if return_windows:
            out["windows"] = raw
        return out
    aligned = [warp_predictions(raw[0], Sim3.identity(images.shape[0], raw[0]["pose_enc"].device))]
    sims = [Sim3.identity(images.shape[0], raw[0]["pose_enc"].device)]
    for window in raw[1:]:
        sim = pairwise_alignment(aligned[-1], window, plan.overlap, config.window_join)
        sims.append(sim)
        aligned.append(warp_predictions(window, sim))
    out = stitch_windows(aligned, plan.overlap)
    out["chunk_scales"] = torch.stack([s.scale for s in sims], dim=1)
    out["chunk_transforms"] = torch.stack([s.matrix() for s in sims], dim=1)
    out["alignment_mode"] = "scaled"
    out["images"] = result_images
    if return_windows:
        out["windows"] = raw
    return out
