"""Windowed inference as frames arrive: a session that re-anchors every window.

Each window runs on a clean cache (so memory is per-window, for streams of any length) and
starts with the last `overlap` frames of the previous window, re-fed from a small input
buffer. Once the new window has predicted those shared frames, it is aligned to the
previous window's (already aligned) predictions of them with the same Sim(3) estimate as
the offline `windowed_inference`, and every later frame is emitted in window 0's frame.
Poses are re-encoded with unit quaternions (w >= 0) in every window, the first included.

A frame shared by two windows is emitted once. By default (`shared_from="later"`) the
session emits what the offline stitch returns (for two windows or more: a single offline
window keeps its raw quaternions): a window's last `overlap` frames wait until the next
window has predicted them (or the stream ends, when the last window gives them), so each of
them is emitted a few frames later. With `shared_from="earlier"` such a frame is emitted as
soon as the earlier window predicts it; other frames are identical to the offline result.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

import torch

from ..geometry import invert_se3, pose_encoding_to_extri_intri
from ..config import SHARED_FROM, StreamConfig
from ..session import FramePrediction, Session
from .align import Sim3, pairwise_alignment, warp_predictions
from .plan import check_keyframe_interval, effective_overlap, warn_if_windows_evict, warn_overlap_cut

__all__ = [
    "KEPT_TRANSFORMS", "SHARED_FROM", "WindowedSession", "check_window_options", "warp_prediction",
    "predictions_as_window",
]

log = logging.getLogger(__name__)

KEPT_TRANSFORMS = 4096
"""Windows whose Sim(3) a session keeps in `WindowedSession.transforms` (the latest ones)."""


@dataclass
class _Pending:
    """The start of a window: predictions of its shared frames, and new frames held back
    until the window's transform is known."""

    shared: list[FramePrediction]
    held: list[FramePrediction]


def check_window_options(config: StreamConfig) -> None:
    """A clear error for window settings no online windowed session can run with."""
    check_keyframe_interval(config.stored_interval)
    if config.overlap is not None and config.overlap < 1:
        raise ValueError(
            f"an overlap of {config.overlap} frames leaves consecutive windows no frame to align them on; "
            "the online windowed session needs overlap >= 1 (None: the scale frames)"
        )
    if config.overlap_keyframes is not None and config.overlap_keyframes < 1:
        raise ValueError(f"overlap_keyframes must be >= 1 (or unset), got {config.overlap_keyframes}")


class WindowedSession:
    """Online windowed streaming (see module docstring).

    Args:
        model: the network.
        config: the stream's settings (default: the model's `stream_config`) with `settings`
            changed, as for `Session`. Besides a session's, it reads window_size (cache slots
            per window: scale frames + keyframes; a window spans scale + (window_size - scale)
            x interval frames), overlap / overlap_keyframes (frames shared by consecutive
            windows; keyframes x interval when overlap_keyframes is given) and shared_from
            ("later" emits a frame shared by two windows from the later window, as the
            offline `windowed_inference` stitches; "earlier" as soon as the earlier window
            predicts it) and window_join (how a window is aligned on the one before). The
            keyframe interval must be fixed.
        output_device: where predictions are put (default: the model's device).
    """

    def __init__(
        self, model, config: StreamConfig | None = None, *, output_device=None, **settings,
    ) -> None:
        config = (config or model.stream_config).with_settings(**settings)
        check_window_options(config)  # before the session takes any memory
        if config.provisional:
            raise ValueError(
                "provisional predictions are a single cache's, during its scale phase; a windowed session gives "
                "final predictions only: make it with provisional=False (or use a Session for provisional ones)"
            )
        self.config = config
        self.shared_from = config.shared_from
        self._session = Session(model, config, output_device=output_device)
        scale = self._session.num_scale_frames
        window_size = config.window_size
        warn_if_windows_evict(max(window_size, scale), self._session.state.aggregator.spec)
        keyframe_interval = config.stored_interval
        self.span = scale + max(window_size - scale, 0) * max(keyframe_interval, 1)
        overlap = effective_overlap(
            10**9,
            scale_frames=scale,
            overlap_size=config.overlap,
            overlap_keyframes=config.overlap_keyframes,
            keyframe_interval=keyframe_interval,
        )
        self.overlap = min(overlap, self.span - 1)
        if self.overlap < 1:
            raise ValueError(f"windows of {self.span} frames leave no room for an overlap; raise window_size")
        if self.overlap < overlap:  # as the offline plan does (LIMITS 22)
            warn_overlap_cut(overlap, self.span)
        self._clear()

    def _clear(self) -> None:
        self._recent: collections.deque[tuple[torch.Tensor, str | None]] = collections.deque(maxlen=self.overlap)
        # The current window's own predictions of its last `overlap` frames, in the first
        # window's frame: the next window is aligned on them, as offline. (Frames shared by
        # three or more windows were emitted from an earlier window than the previous one.)
        self._window_preds: collections.deque[FramePrediction] = collections.deque(maxlen=self.overlap)
        self._in_window = 0  # frames fed to the current window
        self._window = 0
        self._sim: Sim3 | None = None  # current window -> global; None while pending
        self._pending: _Pending | None = None
        self._frames = 0  # frames of the sequence fed so far
        self._window_start = 0  # sequence index of the current window's first frame
        self._shared_prev: list[FramePrediction] = []  # previous window's aligned shared frames
        # shared_from="later": this window's aligned predictions of its last `overlap` frames,
        # held until the next window predicts them again (or the stream ends).
        self._tail: list[FramePrediction] = []
        # The latest KEPT_TRANSFORMS windows' transforms to the first window's frame, oldest
        # first (all of them while there are no more): an endless stream keeps bounded memory.
        self.transforms: collections.deque[Sim3] = collections.deque(maxlen=KEPT_TRANSFORMS)

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new sequence."""
        self._session.reset()
        self._clear()

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "WindowedSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, object]:
        out = self._session.stats()
        out["windows"] = self._window + 1
        return out

    @property
    def num_scale_frames(self) -> int:
        """Scale frames of each window."""
        return self._session.num_scale_frames

    @property
    def session(self) -> Session:
        """The session that runs the windows, one after another (reset at each window's
        start): between `begin_step` and `end_step` it steps the frame."""
        return self._session

    # ------------------------------------------------------------------ stepping
    @torch.no_grad()
    def step(self, frame: torch.Tensor, *, name: str | None = None) -> list[FramePrediction]:
        """Feed one frame; returns the predictions (in the first window's frame) it completed."""
        out = self.begin_step()
        return out + self.end_step(frame, self._session.step(frame, name=name), name=name)

    # `step` in two halves around the step of `session`, so that `mapstream.step_together` can
    # batch that step with other streams' frames.
    def begin_step(self) -> list[FramePrediction]:
        """Before a frame: a full window gives way to the next, whose shared frames are fed
        again (their own forwards); returns what their predictions release."""
        return self._start_next_window() if self._in_window == self.span else []

    def end_step(self, frame: torch.Tensor, preds: list[FramePrediction], *, name: str | None = None
                 ) -> list[FramePrediction]:
        """After `session` stepped ``frame`` (giving ``preds``): the predictions it completed,
        aligned, and the frame kept for the next window's start."""
        self._in_window += 1
        out = self._route(preds)
        self._recent.append((frame, name))
        self._frames += 1
        return out

    def flush(self) -> list[FramePrediction]:
        """Process frames still buffered (a short stream's scale phase) and release held ones:
        the stream has ended, so the current window is the last and gives all its frames."""
        emitted = self._route(self._session.flush())
        if self._pending is not None:  # the stream ended inside a window's shared frames
            emitted += self._resolve()
        emitted += self._tail
        self._tail = []
        return emitted

    def run_frames(self, frames) -> list[FramePrediction]:
        preds: list[FramePrediction] = []
        for frame in frames:
            preds.extend(self.step(frame))
        preds.extend(self.flush())
        return preds

    # ------------------------------------------------------------------ internals
    def _feed(self, frame, name) -> list[FramePrediction]:
        self._in_window += 1
        return self._route(self._session.step(frame, name=name))

    def _start_next_window(self) -> list[FramePrediction]:
        """Open the next window with the shared frames; returns what their predictions
        release (with shared_from="later", the shared frames themselves)."""
        # The finished window's view of the frames the new window starts with.
        self._shared_prev = list(self._window_preds)[-len(self._recent) :]
        self._window_preds.clear()
        self._window_start = self._frames - len(self._recent)
        self._session.reset()
        self._window += 1
        self._in_window = 0
        self._sim = None
        self._pending = _Pending(shared=[], held=[])
        log.debug("window %d starts %d frames back", self._window, len(self._recent))
        # Re-feed the shared frames: their predictions align the window (and, with
        # shared_from="later", are the ones emitted).
        out: list[FramePrediction] = []
        for frame, name in list(self._recent):
            out += self._feed(frame, name)
        return out

    def _route(self, preds: list[FramePrediction]) -> list[FramePrediction]:
        if self._window == 0:
            if self._sim is None and preds:
                self._sim = Sim3.identity(1, preds[0].pose_enc.device)
                self.transforms.append(self._sim)
            # Through the identity too, so every emitted quaternion is unit with w >= 0
            # (as the offline multi-window output).
            emitted = [self._warp(p) for p in preds]
            self._window_preds.extend(emitted)
            return self._release(emitted)
        emitted: list[FramePrediction] = []
        for pred in preds:
            if self._pending is not None and len(self._pending.shared) < len(self._shared_prev):
                self._pending.shared.append(pred)
            elif self._pending is not None:
                self._pending.held.append(pred)
            else:
                emitted.append(self._warp(pred))
                self._window_preds.append(emitted[-1])
        if self._pending is not None and len(self._pending.shared) == len(self._shared_prev):
            emitted = self._resolve() + emitted
        return self._release(emitted)

    def _release(self, preds: list[FramePrediction]) -> list[FramePrediction]:
        """What of this window's aligned `preds` to emit now. With shared_from="later", a frame
        the next window will start with (the window's last `overlap`) is held in `_tail`."""
        if self.shared_from == "earlier":
            return preds
        last_own = self._window_start + self.span - self.overlap  # first index of the tail
        self._tail.extend(p for p in preds if p.index >= last_own)
        return [p for p in preds if p.index < last_own]

    def _resolve(self) -> list[FramePrediction]:
        pending = self._pending
        assert pending is not None
        prev, curr = self._shared_prev[: len(pending.shared)], pending.shared
        if curr:
            self._sim = pairwise_alignment(
                predictions_as_window(prev), predictions_as_window(curr), len(curr), self.config.window_join
            )
        else:
            self._sim = self.transforms[-1]
        self.transforms.append(self._sim)
        self._pending = None
        shared = [self._warp(p) for p in pending.shared]
        held = [self._warp(p) for p in pending.held]
        self._window_preds.extend(shared + held)
        if self.shared_from == "earlier":
            # The shared frames' predictions of this window are not emitted (the earlier
            # window's were), but the next window may be aligned on them.
            return held
        # The previous window's tail is these shared frames: this window's replace it (any
        # the window did not predict again, were the stream to end early, keep the old ones).
        again = {p.index for p in shared}
        kept = [p for p in self._tail if p.index not in again]
        self._tail = []
        return kept + shared + held

    def _warp(self, pred: FramePrediction) -> FramePrediction:
        """`pred` (window-local) in the first window's frame, with its sequence index."""
        assert self._sim is not None
        return warp_prediction(pred, self._sim, index=self._window_start + pred.index)


def warp_prediction(pred: FramePrediction, sim: Sim3, *, index: int | None = None) -> FramePrediction:
    """A FramePrediction mapped by x -> s R x + t (pose re-encoded with a unit quaternion,
    depth scaled, world points mapped); `index` replaces its index if given."""
    warped = warp_predictions(predictions_as_window([pred]), _to(sim, pred.pose_enc.device))
    pose = warped["pose_enc"][0, 0]
    T_world_cam, K = pose_encoding_to_extri_intri(pose, tuple(pred.depth.shape))
    return FramePrediction(
        index=pred.index if index is None else index,
        pose_enc=pose,
        T_world_cam=T_world_cam,
        T_cam_world=invert_se3(T_world_cam),
        K=K,
        depth=warped["depth"][0, 0, ..., 0],
        depth_conf=pred.depth_conf,
        keyframe=pred.keyframe,
        scale_frame=pred.scale_frame,
        world_points=warped["world_points"][0, 0] if "world_points" in warped else None,
        world_points_conf=pred.world_points_conf,
        name=pred.name,
    )


def predictions_as_window(preds: list[FramePrediction]) -> dict[str, torch.Tensor]:
    """Stack FramePredictions into the window dict the alignment functions take."""
    out = {
        "pose_enc": torch.stack([p.pose_enc for p in preds])[None],
        "depth": torch.stack([p.depth for p in preds])[None, ..., None],
        "is_keyframe": torch.tensor([[p.keyframe for p in preds]]),
    }
    if preds and preds[0].world_points is not None:
        out["world_points"] = torch.stack([p.world_points for p in preds])[None]
    return out


def _to(sim: Sim3, device) -> Sim3:
    return Sim3(sim.scale.to(device), sim.rotation.to(device), sim.translation.to(device))
