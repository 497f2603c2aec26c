"""Online sessions: one stream of frames in, predictions out, caches owned by the session.

    session = model.session(num_scale_frames=8)
    for frame in camera:                      # [3, H, W] in [0, 1]
        for pred in session.step(frame):      # predictions completed by this frame
            use(pred.T_world_cam, pred.depth)
    session.close()

The first `num_scale_frames` frames are buffered and processed together (the scale phase:
they attend to each other bidirectionally and become the sequence's anchors); every later
frame is processed on arrival. `reset()` starts a new sequence (a scene cut); `close()`
returns the cache pages to the pool. Several sessions can share one batched forward per
frame: `mapstream.step_together` (mapstream/multistream.py), which drives the parts of a
step that `step` itself runs in turn: `check_frame`, then `step_checked` for a session on
its own, or `plan_step`, a forward of its own and `complete_step`.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Iterable

import torch

from .config import StreamConfig
from .fast import GraphedStep, graphed_step
from .keyframes import make_policy
from .models.aggregator import kv_dtype
from .models.gct import GCTNetwork
from .models.state import StreamState
from .progress import progress_bar
from .validation import ValueCheck, check_images, compute_dtype, keyframe_flag

__all__ = ["Session", "FramePrediction", "SessionClosedError", "StepPlan", "resolve_precision"]

log = logging.getLogger(__name__)


# Frame sizes whose captured steps a session keeps (each holds its graphs' memory pool).
_GRAPHED_SIZES = 4

class SessionClosedError(RuntimeError):
    """A step on a closed session."""


@dataclass
class FramePrediction:
    """Everything predicted for one frame (tensors on the session's output device).

    Conventions: OpenCV camera axes (x right, y down, z forward); `T_world_cam` maps camera
    coordinates to world coordinates (camera-to-world), `T_cam_world` is its inverse; the
    world frame is the first frame's camera frame, in the model's (arbitrary) scale.
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
    """The frame is stored in the cache (scale frames and keyframes)."""
    scale_frame: bool
    provisional: bool = False
    """A scale-phase frame predicted before the scale phase completed (see Session)."""
    world_points: torch.Tensor | None = None  # [H, W, 3] (point head only)
    world_points_conf: torch.Tensor | None = None
    name: str | None = None


def _autocast(device: torch.device, precision: str):
    if precision == "fp32" or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    # No cast cache: autocast keeps its casts of fp32 weights only until the context exits,
    # and a CUDA graph captured inside it would read those copies after they were freed
    # (and their memory reused). Without the cache every use casts again, inside the graph
    # when captured; an eager forward uses each weight once, so it costs it nothing.
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


def resolve_precision(precision: str, device: torch.device) -> str:
    """"auto" -> bf16 on CUDA GPUs that support it, fp16 on older ones, fp32 on CPU."""
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, bf16 or fp16, got {precision!r}")
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16"


# The settings that shape a stream's caches (fixed when its state is made).
_CACHE_SETTINGS = {
    "cache_scale_frames", "sliding_window", "trajectory_capacity", "cross_frame_special", "include_scale_frames",
    "camera_only", "kv_dtype",
}


@dataclass(frozen=True)
class StepPlan:
    """What a single-frame step after the scale phase does (`Session.plan_step`): the forward
    that runs it takes `store` and `scale`, and `Session.complete_step` finishes it."""

    index: int
    """The frame's position in the sequence."""
    store: bool
    """The forward stores the frame in the caches."""
    scale: int
    """The sequence's scale frames (the forward's `num_frame_for_scale`)."""
    decide_after: bool
    """The policy decides after seeing the prediction (and stores the frame then)."""
    name: str | None


class Session:
    """An online stream over a network (see module docstring).

    Args:
        model: the network (shared; sessions never change its weights).
        config: the stream's settings (`StreamConfig`; default: the model's `stream_config`),
            with `settings` (its field names as keywords) changed. Those a session reads:
            num_scale_frames, keyframe_interval (None: every frame), precision, backend,
            provisional, fast, the cache's retention (cache_scale_frames, sliding_window,
            trajectory_capacity, cross_frame_special, include_scale_frames, camera_only) and
            its storage (kv_dtype).
            fast: single-frame steps replayed from CUDA graphs (`mapstream.fast`; on a CPU
            True runs the same decomposition eagerly): "whole" replays the entire step as one
            graph (least host work; fast only with an attention backend that reads key
            ranges on the device, such as "triton"), "pieces" replays graphs between the
            aggregator's eager cache attentions, True takes "whole" where the backend reads
            key ranges on the device and "pieces" elsewhere, "auto" is True on CUDA devices
            whose aggregator weights are in the compute dtype (`cast_for_inference`).
        output_device: where predictions are put (default: the model's device).
        state: caches to use, which keep what they were made to keep (default: new ones,
            owned by this session).
    """

    def __init__(
        self,
        model: GCTNetwork,
        config: StreamConfig | None = None,
        *,
        output_device: torch.device | str | None = None,
        state: StreamState | None = None,
        **settings,
    ) -> None:
        if state is not None and _CACHE_SETTINGS & set(settings):
            raise ValueError(
                f"pass either cache settings ({', '.join(sorted(_CACHE_SETTINGS & set(settings)))}) or a state, "
                "not both: a state's caches keep what they were made to keep"
            )
        self.model = model
        self.config = (config or model.stream_config).with_settings(**settings)
        self.num_scale_frames = self.config.num_scale_frames
        self.policy = make_policy(self.config.stored_interval)
        self.output_device = torch.device(output_device) if output_device is not None else None
        self.device = next(model.parameters()).device
        self.precision = resolve_precision(self.config.precision, self.device)
        self.provisional = self.config.provisional
        self.fast = self._resolve_fast(self.config.fast)
        self._graphed: dict[tuple[int, int], GraphedStep] = {}  # frame size -> its graphed step
        self.batched_slot = None
        """Where the batched fast step of this session's `step_together` batches lives
        (`mapstream.multistream.BatchedSlot`), held by its sessions (the module keeps only a
        weak reference)."""
        self._owns_state = state is None
        self.state = state if state is not None else model.new_state(self.config)
        self._closed = False
        self._told_scale_keyframes = False  # the warning that scale frames are always stored
        self._clear()

    def _resolve_fast(self, fast: bool | str) -> bool | str:
        """`fast="auto"`: graphs on a CUDA device whose aggregator weights are in the compute
        dtype (`cast_for_inference`); weights of another dtype would be cast again in every
        replayed step, so those run eagerly."""
        if fast != "auto":
            return fast
        if self.device.type != "cuda":
            return False
        return self.model.aggregator.camera_token.dtype == compute_dtype(self.precision)

    def _clear(self) -> None:
        self._buffer: list[torch.Tensor] = []
        self._names: list[str | None] = []
        self._scale = 0  # scale frames of the current sequence once the scale phase ran
        self._size: tuple[int, int] | None = None  # the sequence's frame size once its scale phase ran
        self._count = 0  # frames of the current sequence that produced final predictions
        # (shape, dtype, device) of the last frame that passed the shape checks after the
        # scale phase: a frame like it skips them (the step's start is on the GPU's idle time).
        # It belongs to the sequence: after a reset a frame of the last one's size is checked.
        self._accepted: tuple | None = None
        self.policy.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new sequence (scene cut): drop buffered frames and forget every cached one."""
        self._check_open()
        self.state.reset()
        self._clear()

    def close(self) -> None:
        """Release this session's cache pages and its captured graphs (their memory pools hold
        GPU memory for as long as they live). Further steps raise `SessionClosedError`."""
        if self._closed:
            return
        if self._owns_state:
            self.state.release()
        else:
            self.state.reset()
        self._clear()
        self._graphed.clear()
        self.batched_slot = None
        self._closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("this session is closed; create a new one with model.session()")

    def autocast(self):
        """The autocast context of this session's precision on its device (none in fp32 or
        off CUDA), which its forwards run in."""
        return _autocast(self.device, self.precision)

    @property
    def in_scale_phase(self) -> bool:
        return self._scale == 0

    @property
    def frames_processed(self) -> int:
        """Frames of the current sequence with final predictions."""
        return self._count

    def is_keyframe(self, index: int) -> bool:
        """The fixed-interval rule for frame `index` (policies that decide before seeing)."""
        if self.policy.needs_prediction:
            raise ValueError(f"{self.policy!r} decides after seeing the frame")
        return self.policy.decide(index, self._scale)

    # ------------------------------------------------------------------ stepping
    @torch.no_grad()
    def step(self, frame: torch.Tensor, *, keyframe: bool | None = None, name: str | None = None) -> list[FramePrediction]:
        """Feed one frame [3, H, W] (or [1, 3, H, W]) in [0, 1].

        Returns the predictions completed by this frame: none while the scale phase buffers
        (or a provisional one, see `provisional`), all scale frames when it completes, then
        this frame's. `keyframe` (True, False or None) overrides the policy after the scale
        phase; scale frames are always stored.
        """
        self._check_open()
        keyframe = keyframe_flag(keyframe)
        frames = self._check_frame(frame, values=False)
        graphs = self._graphed_step(frames)
        if graphs is None:
            ValueCheck(frames).wait()
            return self.step_checked(frames, keyframe=keyframe, name=name)
        # One copy to the device, which the started step and `_forward` both use.
        if frames.device != self.device:
            frames = frames.to(self.device, non_blocking=True)
        # The graphed step's first part reads no cache: launched first, the GPU embeds the
        # frame while the host starts the frame's value check beside it and waits for the
        # answer. A frame that fails the check is never attended to or stored.
        started = self._start_graphed(graphs, frames)
        started.values.wait()
        return self.step_checked(frames, keyframe=keyframe, name=name, started=started)

    def _start_graphed(self, graphs, frames: torch.Tensor):
        """`graphs.start` (a `GraphedStep`) of this frame, already on the session's device.
        Autocast only matters while the first graph is still to be captured: a replay runs
        what was captured (and entering autocast costs the idle GPU tens of µs a frame)."""
        if graphs.first_graph_captured:
            return graphs.start(frames, self.state)
        with _autocast(self.device, self.precision):
            return graphs.start(frames, self.state)

    def check_frame(self, frame: torch.Tensor) -> torch.Tensor:
        """`frame` checked for the next step of this open session (shape, size, values) as
        [1, 1, 3, H, W], for `step_checked` or `plan_step`; a clear error otherwise. Changes
        nothing."""
        self._check_open()
        return self._check_frame(frame)

    def step_checked(
        self, frames: torch.Tensor, *, keyframe: bool | None = None, name: str | None = None, started=None
    ) -> list[FramePrediction]:
        """`step` for a frame that already passed `check_frame` ([1, 1, 3, H, W]) and a
        keyframe flag that passed `validation.keyframe_flag`; `started`: its
        `GraphedStep.start`, if begun."""
        if self.in_scale_phase:
            if keyframe is False and not self._told_scale_keyframes:
                log.warning("keyframe=False for a frame of the scale phase: scale frames are always stored "
                            "(the override applies from frame %d on)", self.num_scale_frames)
                self._told_scale_keyframes = True
            self._buffer.append(frames)
            self._names.append(name)
            if len(self._buffer) >= self.num_scale_frames:
                return self.flush()
            return self._provisional() if self.provisional else []
        plan = self.plan_step(keyframe, name)
        graphs = started if started is not None else self._graphed_step(frames)
        with self.state.step(plan.store):  # through the outputs' copy and the frame's count
            out = self._forward(frames, store=plan.store, scale=plan.scale, graphs=graphs, to_output=False)
            return self.complete_step(plan, out)

    def _check_frame(self, frame: torch.Tensor, *, values: bool = True) -> torch.Tensor:
        """A valid frame for this sequence as [1, 1, 3, H, W], or a clear error (values:
        also check them, which waits for the device; otherwise the caller does)."""
        if not isinstance(frame, torch.Tensor):
            raise TypeError(
                f"a frame must be a torch.Tensor [3, H, W] in [0, 1], got {type(frame).__name__} "
                "(for an HxWx3 uint8 array: torch.from_numpy(a).permute(2, 0, 1) / 255)"
            )
        signature = (frame.shape, frame.dtype, frame.device)
        if not values and not self.in_scale_phase and signature == self._accepted:
            return frame.view(1, 1, *frame.shape[-3:])
        frames = check_images(
            frame if frame.dim() == 4 else frame.unsqueeze(0), self.model.config.patch_size, check_values=values
        )
        if frames.shape[:2] != (1, 1):
            raise ValueError(f"step takes one frame [3, H, W]; got shape {list(frame.shape)}")
        self._expect_size(frames)
        if not self.in_scale_phase:
            self._accepted = signature
        return frames

    def _expect_size(self, frames: torch.Tensor) -> None:
        """A sequence keeps one frame size (its first buffered frame's, then its scale
        phase's): a frame of another size, even one of as many patches, is refused."""
        expected = tuple(self._buffer[0].shape[-2:]) if self._buffer else self._size
        size = tuple(frames.shape[-2:])
        if expected is not None and size != expected:
            raise ValueError(
                f"frame of size {size} differs from the sequence's {expected}; call reset() before changing resolution"
            )

    def plan_step(self, keyframe: bool | None = None, name: str | None = None) -> StepPlan:
        """The next single-frame step after the scale phase: whether it stores the frame
        (decided now, or after seeing the prediction for policies that need it). Its forward
        runs on this session's state with the plan's `store` and `scale`; `complete_step`
        finishes it."""
        if self.in_scale_phase:
            raise RuntimeError("plan_step is for steps after the scale phase; step_checked buffers scale frames")
        index = self._count
        decide_after = keyframe is None and self.policy.needs_prediction
        if decide_after:
            store = False
        else:
            store = self.policy.decide(index, self._scale) if keyframe is None else bool(keyframe)
        return StepPlan(index, store, self._scale, decide_after, name)

    def complete_step(self, plan: StepPlan, out: dict[str, torch.Tensor]) -> list[FramePrediction]:
        """Turn a planned step's model outputs (batch 1, one frame) into its prediction, on
        the output device, and update the policy."""
        out = self._to_output(out)
        self._count += 1
        pred = self._split(out, [plan.name], first=plan.index, store=plan.store, scale=False)[0]
        if plan.decide_after and self.policy.decide(plan.index, self._scale, pred):
            with self.state.step(store=True):  # both caches take the frame, or neither is used again
                self.state.aggregator.store_last()
                if self.state.camera is not None:
                    self.state.camera.store_last()
            pred.keyframe = True
            self.policy.stored(plan.index, pred)
        elif plan.store:
            self.policy.stored(plan.index, pred)
        return [pred]

    @torch.no_grad()
    def flush(self) -> list[FramePrediction]:
        """Run the scale phase on the frames buffered so far (e.g. a stream shorter than
        `num_scale_frames`). No-op outside the scale phase."""
        self._check_open()
        if not self.in_scale_phase or not self._buffer:
            return []
        frames = torch.cat(self._buffer, dim=1)
        names = self._names
        with self.state.step(store=True):
            out = self._scale_phase(frames)
            preds = self._split(out, names, first=0, store=True, scale=True)
        for pred in preds:
            self.policy.stored(pred.index, pred)
        return preds

    def _scale_phase(self, frames: torch.Tensor) -> dict[str, torch.Tensor]:
        """Start the sequence with the scale phase on `frames` [1, S, 3, H, W] (the buffered
        frames and any given with them): its outputs, the buffer emptied, the sequence's
        scale frames, count and frame size set. Callers hold the state's step."""
        self._buffer, self._names = [], []
        self._scale = self._count = frames.shape[1]
        self._size = tuple(frames.shape[-2:])
        return self._forward(frames, store=True, scale=self._scale)

    def _provisional(self) -> list[FramePrediction]:
        frames = torch.cat(self._buffer, dim=1)
        out = self._forward(frames, store=False, scale=frames.shape[1])
        last = {k: v[:, -1:] for k, v in out.items()}
        pred = self._split(last, [self._names[-1]], first=frames.shape[1] - 1, store=False, scale=True)[0]
        pred.provisional = True
        return [pred]

    @torch.no_grad()
    def run(self, images: torch.Tensor, *, progress: bool | None = None) -> dict[str, torch.Tensor]:
        """Process a whole sequence [S, 3, H, W] or [1, S, 3, H, W] from the current state
        and return stacked outputs like the reference's `inference_streaming`. progress: a
        bar over the frames (None: when stderr is a terminal, `mapstream.progress`)."""
        self._check_open()
        images = check_images(images, self.model.config.patch_size)
        if images.shape[0] != 1:
            raise ValueError(
                f"a session is one stream: run takes one sequence (batch 1), got batch {images.shape[0]}; "
                "model.inference_streaming takes a batch of independent sequences, or give each its own session"
            )
        self._expect_size(images)
        num_frames = images.shape[1]
        with progress_bar(num_frames, desc="streaming", progress=progress) as bar:
            return self._run(images, bar)

    def _run(self, images: torch.Tensor, bar) -> dict[str, torch.Tensor]:
        num_frames = images.shape[1]
        outs = []
        start = 0
        # Frames `step` buffered for the scale phase are predicted here too: the outputs'
        # images hold them, so that every prediction has its image at the same index.
        shown = torch.cat([*self._buffer, images], dim=1) if self.in_scale_phase and self._buffer else images
        if self.in_scale_phase:
            start = min(self.num_scale_frames - len(self._buffer), num_frames)
            with self.state.step(store=True):
                outs.append(self._scale_phase(torch.cat(self._buffer + [images[:, :start]], dim=1)))
            bar.update(start)
        if self.policy.needs_prediction:
            preds = []
            for i in range(start, num_frames):
                preds.append(self.step(images[0, i]))
                bar.update(1)
            stacked = self._stack(outs)
            return self._merge(stacked, preds, shown)
        for i in range(start, num_frames):
            store = self.policy.decide(self._count, self._scale)
            frame = images[:, i : i + 1]
            with self.state.step(store):  # through the outputs' copy and the frame's count, as `step`
                outs.append(self._forward(frame, store=store, scale=self._scale, graphs=self._graphed_step(frame)))
                self._count += 1
            bar.update(1)
        result = self._stack(outs)
        result["images"] = shown.to(self.output_device) if self.output_device is not None else shown
        return result

    @staticmethod
    def _stack(outs: list[dict]) -> dict[str, torch.Tensor]:
        if not outs:
            return {}
        return {k: torch.cat([o[k] for o in outs], dim=1) for k in outs[0]}

    def _merge(self, stacked: dict, preds: list[list[FramePrediction]], images: torch.Tensor) -> dict:
        flat = [p for ps in preds for p in ps]
        per_frame = {
            "pose_enc": [p.pose_enc for p in flat],
            "depth": [p.depth[..., None] for p in flat],
            "depth_conf": [p.depth_conf for p in flat],
        }
        if flat and flat[0].world_points is not None:
            per_frame["world_points"] = [p.world_points for p in flat]
            per_frame["world_points_conf"] = [p.world_points_conf for p in flat]
        result = dict(stacked)
        for key, values in per_frame.items():
            if values:
                new = torch.stack(values)[None]
                result[key] = torch.cat((result[key], new), dim=1) if key in result else new
        result["images"] = images.to(self.output_device) if self.output_device is not None else images
        return result

    def _forward(
        self, frames: torch.Tensor, *, store: bool, scale: int, graphs=None, to_output: bool = True
    ) -> dict[str, torch.Tensor]:
        """The model on `frames`; graphs: the `GraphedStep` (or its started step) to run a
        single frame after the scale phase through, None for the plain forward. The caller
        says which: a scale phase of one frame is a single frame too, but it takes the scale
        frames' tokens and attention, which the graphs do not hold. to_output: the outputs
        moved to the output device (else the model's)."""
        frames = frames.to(self.device, non_blocking=True)
        with _autocast(self.device, self.precision):
            backend = self.backend_for(kv_dtype(frames))
            if graphs is not None:
                with self.state.step(store):
                    out = graphs(frames, self.state, store=store, backend=backend)
            else:
                out = self.model(
                    frames, self.state, store=store, num_frame_for_scale=scale, backend=backend, validate=False
                )
        out.pop("pose_enc_list", None)
        return self._to_output(out) if to_output else out

    def backend_for(self, dtype: torch.dtype):
        """The aggregator's cache-attention backend of this session's setting for K/V of `dtype`
        (the autocast dtype under autocast, else the weights')."""
        return self.model.attention_backend(self.device, dtype, self.config.backend)

    def _to_output(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.output_device is not None:
            out = {k: v.to(self.output_device) for k, v in out.items()}
        return out

    def _graphed_step(self, frames: torch.Tensor):
        """The `GraphedStep` for these frames when they take the fast path (one frame after
        the scale phase, `fast` on), else None."""
        if not self.fast or self.in_scale_phase or frames.shape[1] != 1:
            return None
        return self._graphs_for(frames)

    @property
    def whole_step(self) -> bool:
        """Whether the fast path replays each step as one graph (`fast`: "whole", or True
        with a backend that reads key ranges on the device) rather than in pieces."""
        if self.fast is True:
            if self.device.type != "cuda":
                return False
            # The backend the step's cache attention gets: the one for the cache's dtype (the
            # autocast dtype, or the weights' without autocast).
            with _autocast(self.device, self.precision):
                dtype = kv_dtype(self.model.aggregator.camera_token)
            return self.backend_for(dtype).device_range
        return self.fast == "whole"

    def _graphs_for(self, frames: torch.Tensor) -> GraphedStep:
        size = tuple(frames.shape[-2:])
        if size not in self._graphed:
            if len(self._graphed) >= _GRAPHED_SIZES:  # a session lent to inputs of ever-new sizes stays bounded
                self._graphed.clear()
            with _autocast(self.device, self.precision):
                self._graphed[size] = graphed_step(
                    self.model, size, capture=self.device.type == "cuda", whole=self.whole_step
                )
        return self._graphed[size]

    def _split(self, out: dict, names: list, *, first: int, store: bool, scale: bool) -> list[FramePrediction]:
        num = out["pose_enc"].shape[1]
        image_hw = tuple(out["depth"].shape[2:4])
        T_world_cam, T_cam_world, K = self.model.camera_matrices(out["pose_enc"][0], image_hw)
        return [
            FramePrediction(
                index=first + j,
                pose_enc=out["pose_enc"][0, j],
                T_world_cam=T_world_cam[j],
                T_cam_world=T_cam_world[j],
                K=K[j],
                depth=out["depth"][0, j, ..., 0],
                depth_conf=out["depth_conf"][0, j],
                keyframe=store,
                scale_frame=scale,
                world_points=out["world_points"][0, j] if "world_points" in out else None,
                world_points_conf=out["world_points_conf"][0, j] if "world_points_conf" in out else None,
                name=names[j],
            )
            for j in range(num)
        ]

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
