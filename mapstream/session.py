"""Online sessions: one stream of frames in, predictions out, caches owned by the session.

    session = model.session(num_scale_frames=8)
    for frame in camera:                      # [3, H, W] in [0, 1]
        for pred in session.step(frame):      # predictions completed by this frame
            use(pred.T_world_cam, pred.depth)
    session.close()

The first `num_scale_frames` frames are buffered and processed together (the scale phase:
they attend to each other bidirectionally and become the sequence's anchors); every later
frame is processed on arrival. `reset()` starts a new sequence (a scene cut); `close()`
returns the cache pages to the pool.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Iterable

import torch

from .config import CacheConfig
from .geometry import invert_se3, pose_encoding_to_extri_intri
from .models.gct import GCTStream, StreamState
from .validation import check_images

__all__ = ["Session", "FramePrediction", "SessionClosedError"]

log = logging.getLogger(__name__)


class SessionClosedError(RuntimeError):
    """A step on a closed session."""


@dataclass
class FramePrediction:
    """Everything predicted for one frame (tensors on the session's output device).

    Conventions: OpenCV camera axes (x right, y down, z forward); `T_world_cam` maps camera
    coordinates to world coordinates (camera-to-world), `T_cam_world` is its inverse; the
    world frame is the first frame's camera frame up to the model's scale.
    """

    index: int
    """Position of the frame in the sequence (0 = first frame after the last reset)."""
    pose_enc: torch.Tensor  # [9]: translation, quaternion xyzw, fov_h, fov_w
    T_world_cam: torch.Tensor  # [3, 4]
    T_cam_world: torch.Tensor  # [3, 4]
    K: torch.Tensor  # [3, 3] pixels
    depth: torch.Tensor  # [H, W]
    depth_conf: torch.Tensor  # [H, W], > 1
    keyframe: bool
    """The frame was stored in the cache (scale frames and keyframes)."""
    scale_frame: bool
    world_points: torch.Tensor | None = None  # [H, W, 3] (point head only)
    world_points_conf: torch.Tensor | None = None
    name: str | None = None


def _autocast(device: torch.device, precision: str):
    if precision == "fp32" or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype)


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> bf16 on CUDA GPUs that support it, fp16 on older ones, fp32 on CPU."""
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {precision!r}")
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"


class Session:
    """An online stream over a `GCTStream` (see module docstring).

    Args:
        model: the network (shared; sessions never change its weights).
        num_scale_frames: frames processed together at the start of a sequence
            (default: the model's scale frames, 8 for the official model).
        keyframe_interval: after the scale phase, frame i is stored iff
            (i - scale) % keyframe_interval == 0 (1 = every frame).
        output_device: where predictions are put (default: the model's device).
        precision: "auto", "fp32", "bf16" or "fp16" for the aggregator (heads are fp32).
        cache: cache policy for this session (default: the model's `cache_config`).
        state: caches to use (default: new ones owned by this session).
    """

    def __init__(
        self,
        model: GCTStream,
        *,
        num_scale_frames: int | None = None,
        keyframe_interval: int = 1,
        output_device: torch.device | str | None = None,
        precision: str = "auto",
        cache: CacheConfig | None = None,
        state: StreamState | None = None,
    ) -> None:
        self.model = model
        scale = num_scale_frames if num_scale_frames is not None else model._default_scale_frames()
        if scale < 1:
            raise ValueError(f"num_scale_frames must be >= 1, got {scale}")
        if keyframe_interval < 0:
            raise ValueError(f"keyframe_interval must be >= 0, got {keyframe_interval}")
        self.num_scale_frames = scale
        self.keyframe_interval = keyframe_interval
        self.output_device = torch.device(output_device) if output_device is not None else None
        self.device = next(model.parameters()).device
        self.precision = resolve_precision(precision, self.device)
        self._owns_state = state is None
        if state is not None and cache is not None:
            raise ValueError("pass either a cache policy or a state, not both")
        self.state = state if state is not None else model.new_state(cache)
        self._closed = False
        self._clear()

    def _clear(self) -> None:
        self._buffer: list[torch.Tensor] = []
        self._names: list[str | None] = []
        self._scale = 0  # scale frames of the current sequence once the scale phase ran
        self._count = 0  # frames of the current sequence that produced predictions

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new sequence (scene cut): drop buffered frames and forget every cached one."""
        self._check_open()
        self.state.reset()
        self._clear()

    def close(self) -> None:
        """Release this session's cache pages. Further steps raise `SessionClosedError`."""
        if self._closed:
            return
        if self._owns_state:
            self.state.release()
        else:
            self.state.reset()
        self._clear()
        self._closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("this session is closed; create a new one with model.session()")

    @property
    def in_scale_phase(self) -> bool:
        return self._scale == 0

    # ------------------------------------------------------------------ stepping
    def is_keyframe(self, index: int) -> bool:
        """The fixed-interval rule for frame `index` of the sequence (after the scale phase)."""
        k = self.keyframe_interval
        return k <= 1 or (index - self._scale) % k == 0

    @torch.no_grad()
    def step(self, frame: torch.Tensor, *, keyframe: bool | None = None, name: str | None = None) -> list[FramePrediction]:
        """Feed one frame [3, H, W] (or [1, 3, H, W]) in [0, 1].

        Returns the predictions completed by this frame: none while the scale phase
        buffers, all scale frames when it completes, then this frame's. `keyframe`
        overrides the session's rule after the scale phase (scale frames are always stored).
        """
        self._check_open()
        frames = check_images(frame if frame.dim() == 4 else frame.unsqueeze(0), self.model.config.patch_size)
        if frames.shape[:2] != (1, 1):
            raise ValueError(f"step takes one frame [3, H, W]; got shape {list(frame.shape)}")
        if self.in_scale_phase:
            if self._buffer and self._buffer[0].shape != frames.shape:
                raise ValueError(
                    f"frame of size {tuple(frames.shape[-2:])} differs from the sequence's "
                    f"{tuple(self._buffer[0].shape[-2:])}; call reset() before changing resolution"
                )
            self._buffer.append(frames)
            self._names.append(name)
            if len(self._buffer) < self.num_scale_frames:
                return []
            return self.flush()
        store = self.is_keyframe(self._count) if keyframe is None else bool(keyframe)
        out = self._forward(frames, store=store)
        return self._split(out, [name], store=store, scale=False)

    def flush(self) -> list[FramePrediction]:
        """Run the scale phase on the frames buffered so far (e.g. a stream shorter than
        `num_scale_frames`). No-op outside the scale phase."""
        self._check_open()
        if not self.in_scale_phase or not self._buffer:
            return []
        frames = torch.cat(self._buffer, dim=1)
        names = self._names
        self._scale = frames.shape[1]
        self._buffer, self._names = [], []
        out = self._forward(frames, store=True)
        return self._split(out, names, store=True, scale=True)

    @torch.no_grad()
    def run(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Process a whole sequence [S, 3, H, W] or [1, S, 3, H, W] from the current state
        and return stacked outputs like the reference's `inference_streaming`."""
        self._check_open()
        images = check_images(images, self.model.config.patch_size)
        if images.shape[0] != 1:
            raise ValueError(f"run takes one sequence (batch 1), got batch {images.shape[0]}")
        num_frames = images.shape[1]
        outs = []
        start = 0
        if self.in_scale_phase:
            start = min(self.num_scale_frames - len(self._buffer), num_frames)
            frames = torch.cat(self._buffer + [images[:, :start]], dim=1)
            self._scale = frames.shape[1]
            self._buffer, self._names = [], []
            outs.append(self._forward(frames, store=True))
        for i in range(start, num_frames):
            outs.append(self._forward(images[:, i : i + 1], store=self.is_keyframe(self._count)))
        keys = [k for k in outs[0] if k not in ("images", "pose_enc_list")]
        result = {k: torch.cat([o[k] for o in outs], dim=1) for k in keys}
        result["images"] = images.to(self.output_device) if self.output_device is not None else images
        return result

    def _forward(self, frames: torch.Tensor, *, store: bool) -> dict[str, torch.Tensor]:
        frames = frames.to(self.device, non_blocking=True)
        with _autocast(self.device, self.precision):
            out = self.model(frames, num_frame_for_scale=self._scale, keyframe=store, state=self.state)
        self._count += frames.shape[1]
        out.pop("images", None)
        out.pop("pose_enc_list", None)
        if self.output_device is not None:
            out = {k: v.to(self.output_device) for k, v in out.items()}
        return out

    def _split(self, out: dict[str, torch.Tensor], names: list[str | None], *, store: bool, scale: bool) -> list[FramePrediction]:
        num = out["pose_enc"].shape[1] if "pose_enc" in out else out["depth"].shape[1]
        first = self._count - num
        image_hw = tuple(out["depth"].shape[2:4]) if "depth" in out else None
        preds = []
        T_world_cam = K = None
        if "pose_enc" in out and image_hw is not None:
            T_world_cam, K = pose_encoding_to_extri_intri(out["pose_enc"][0], image_hw)
        for j in range(num):
            preds.append(
                FramePrediction(
                    index=first + j,
                    pose_enc=out["pose_enc"][0, j],
                    T_world_cam=T_world_cam[j],
                    T_cam_world=invert_se3(T_world_cam[j]),
                    K=K[j],
                    depth=out["depth"][0, j, ..., 0],
                    depth_conf=out["depth_conf"][0, j],
                    keyframe=store,
                    scale_frame=scale,
                    world_points=out["world_points"][0, j] if "world_points" in out else None,
                    world_points_conf=out["world_points_conf"][0, j] if "world_points_conf" in out else None,
                    name=names[j],
                )
            )
        return preds

    def stats(self) -> dict[str, object]:
        """Cache statistics of this session's aggregator and camera-head caches."""
        return {
            "aggregator": self.state.aggregator.stats(),
            "camera": self.state.camera.stats() if self.state.camera is not None else None,
        }

    def run_frames(self, frames: Iterable[torch.Tensor]) -> list[FramePrediction]:
        """Step through an iterable of [3, H, W] frames and flush; returns every prediction."""
        preds: list[FramePrediction] = []
        for frame in frames:
            preds.extend(self.step(frame))
        preds.extend(self.flush())
        return preds
