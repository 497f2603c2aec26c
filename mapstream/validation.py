"""Input checks at the public boundary: every failure says what was wrong and what to do."""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

__all__ = [
    "OVERSHOOT", "ValueCheck", "check_count", "check_images", "check_scale_frames", "compute_dtype", "keyframe_flag",
]

log = logging.getLogger(__name__)


def check_images(images: torch.Tensor, patch_size: int, *, check_values: bool = True) -> torch.Tensor:
    """Validate a frame tensor and return it as [B, S, 3, H, W].

    Accepts [S, 3, H, W] (one sequence) or [B, S, 3, H, W], floating point RGB in [0, 1],
    H and W multiples of `patch_size`, at least one frame, no NaN/inf.
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() == 4:
        images = images.unsqueeze(0)
    if images.dim() != 5:
        raise ValueError(
            f"images must have shape [S, 3, H, W] or [B, S, 3, H, W], got {list(images.shape)}"
        )
    batch, frames, channels, height, width = images.shape
    if channels != 3:
        hint = "; channels last ([..., H, W, 3])? move them: x.movedim(-1, -3)" if width == 3 else ""
        raise ValueError(
            f"images must have 3 (RGB) channels in dim -3, got {channels} (shape {list(images.shape)}){hint}"
        )
    if batch == 0 or frames == 0:
        raise ValueError(f"images holds no frame (shape {list(images.shape)})")
    if height == 0 or width == 0:
        raise ValueError(f"images have no pixels: size {height}x{width} (HxW, shape {list(images.shape)})")
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"image size {height}x{width} (HxW) is not a multiple of the patch size {patch_size}; "
            f"resize or crop with mapstream.load_images(..., patch_size={patch_size})"
        )
    if not images.is_floating_point():
        raise ValueError(f"images must be floating point in [0, 1], got {images.dtype}; divide uint8 frames by 255")
    if check_values:
        ValueCheck(images).wait()
    return images


class ValueCheck:
    """The check that frames hold finite values in [0, 1] (give or take `OVERSHOOT`), started
    now and answered by `wait()`.

    Frames on a GPU are checked there: their minimum and maximum come back to the host in one
    asynchronous copy, so a caller can queue work that does not depend on the answer (a
    streaming step's first graph reads no cache) before waiting for it, instead of leaving
    the GPU idle during the round trip every frame."""

    def __init__(
        self, images: torch.Tensor, *, stream: "torch.cuda.Stream | None" = None,
        ready: "torch.cuda.Event | None" = None,
    ) -> None:
        """stream: a CUDA stream to run the check on, beside the current one, once `ready`
        (an event recorded where the frames are written) has passed; without `ready`, after
        all work queued on the current stream so far. A caller that queues work on the
        current stream before starting the check (a session step's first graph) passes the
        event it recorded before that work, so the check does not wait for it."""
        self._images = images
        self._event = None
        if images.is_cuda and stream is not None:
            if ready is None:
                stream.wait_stream(torch.cuda.current_stream(images.device))
            else:
                stream.wait_event(ready)
            with torch.cuda.stream(stream):
                self._start(images)
        else:
            self._start(images)

    def _start(self, images: torch.Tensor) -> None:
        stats = torch.stack(torch.aminmax(images.detach())).float()
        if stats.is_cuda:
            # The copy runs on the current stream (the caller's, or `stream`): the event marks it.
            self._stats = torch.empty(2, dtype=torch.float32, pin_memory=True)
            self._stats.copy_(stats, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(stats.device))
        else:
            self._stats = stats

    def wait(self) -> None:
        """Return once the values are known to be fine; otherwise raise ValueError."""
        if self._event is not None:
            self._event.synchronize()
        lo, hi = self._stats.tolist()
        if lo != lo or hi != hi or lo in (float("inf"), float("-inf")) or hi in (float("inf"), float("-inf")):
            images = self._images
            bad = (~torch.isfinite(images)).flatten(2).any(-1).nonzero()
            where = ", ".join(f"batch {int(b)} frame {int(s)}" for b, s in bad[:5].tolist())
            raise ValueError(f"images contain NaN or inf values (at {where}); check the frame source")
        if lo < -OVERSHOOT or hi > 1.0 + OVERSHOOT:
            raise ValueError(
                f"image values must lie in [0, 1] (up to {OVERSHOOT} beyond, as a resize's overshoot, is accepted), "
                f"got [{lo:.4g}, {hi:.4g}]; divide 0-255 data by 255 (mapstream.load_images does this) and give "
                "frames before any mean/std normalization (the model normalizes them itself)"
            )
        if lo < 0.0 or hi > 1.0:
            _tell_overshoot(lo, hi)


OVERSHOOT = 0.25
"""How far beyond [0, 1] frame values may reach. A bicubic or Lanczos resize of an image in
[0, 1] overshoots it near sharp edges (by a few hundredths, up to ≈ 0.1); such frames are used
as they are, as the reference does. Wider ranges are data on another scale (0-255, or
mean/std-normalized), which the model would read as garbage, so they are refused."""

_told_overshoot = False


def _tell_overshoot(lo: float, hi: float) -> None:
    global _told_overshoot
    if not _told_overshoot:
        _told_overshoot = True
        log.warning("frame values reach [%.4g, %.4g], a little beyond [0, 1] (a resize's overshoot?); "
                    "they are used as they are (said once)", lo, hi)


def keyframe_flag(keyframe) -> bool | None:
    """A step's keyframe override as True, False or None (policy decides). NumPy and 0-d
    torch booleans and the ints 0/1 are taken; anything else is refused, so that a string
    such as "False" is not stored as a keyframe for being truthy."""
    if keyframe is None or isinstance(keyframe, bool):
        return keyframe
    if isinstance(keyframe, torch.Tensor) and keyframe.dtype == torch.bool and keyframe.numel() == 1:
        return bool(keyframe)
    if isinstance(keyframe, np.bool_) or (isinstance(keyframe, int) and keyframe in (0, 1)):
        return bool(keyframe)
    raise TypeError(f"keyframe must be True, False or None (the policy decides), got {keyframe!r}")


_COMPUTE_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                   "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}


def compute_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`dtype` (a torch dtype or its short name: bf16, fp16, fp32) as one of the floating-point
    dtypes the kernels run in, or a ValueError naming the choices."""
    if isinstance(dtype, str):
        if dtype not in _COMPUTE_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(_COMPUTE_DTYPES)}")
        dtype = _COMPUTE_DTYPES[dtype]
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"cast_for_inference takes bf16, fp16 or fp32 (a floating-point dtype the kernels "
                         f"run in), got {dtype!r}")
    return dtype


def check_count(name: str, value: Any, least: int = 1) -> None:
    """ValueError unless ``value`` is an integer (NumPy's too; not a bool, a float or a
    string, which would otherwise be rounded or compared somewhere deep) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")


def check_scale_frames(num_scale_frames: int) -> None:
    """ValueError for a scale phase of no frame (every sequence starts with at least one)."""
    check_count("num_scale_frames", num_scale_frames)
