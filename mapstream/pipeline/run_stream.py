"""The run's stream: frames fed one at a time to a session, each finished frame stored as it
comes, and a resumed stream aligned to the frames an earlier run finished.

A resume restarts the stream on the last finished frames (as its scale frames): their new
predictions only estimate the Sim(3) that maps the new stream onto the finished one, and
every later frame is warped by it.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..geometry import invert_se3, unit_quaternion_encoding
from ..io.intrinsics import KnownIntrinsics, frame_intrinsics
from ..progress import progress_bar
from ..session import FramePrediction
from ..windowed import pairwise_alignment
from ..windowed.online import predictions_as_window, warp_prediction
from .frame_store import FrameStore

__all__ = ["Streamed", "stream_frames"]

log = logging.getLogger(__name__)

FrameCallback = Callable[[FramePrediction, torch.Tensor, int], None]


@dataclass(frozen=True)
class Streamed:
    resumed_from: int  # frames an earlier run had finished
    new_frames: int  # frames this run finished
    in_callback: float  # seconds spent in the caller's `on_frame`: not the run's
    intrinsics: dict | None = None  # known intrinsics: what they were on the frames, beside the network's (run.json)


def stream_frames(
    session, source, store: FrameStore, *, scale_frames: int, out: Path, progress: bool | None,
    on_frame: FrameCallback | None, intrinsics: KnownIntrinsics | None = None,
) -> Streamed:
    """Feed ``source`` to ``session`` after the frames ``store`` has finished, storing each
    new frame. With `intrinsics`, every new frame's K is the known camera's, carried onto the
    frame as it was preprocessed (what the store, `on_frame` and every export receive). Raises
    ValueError when the input is not the one whose frames were finished."""
    resume_at = store.finished
    overlap = _resume_overlap(resume_at, source.expected_length, scale_frames)
    offset = resume_at - overlap
    realign = _Realigner(store.last_records(overlap)) if overlap else None
    bar = progress_bar(source.expected_length, desc="mapstream", progress=progress, initial=resume_at)
    known = _KnownCamera(intrinsics) if intrinsics is not None else None
    sink = _FrameSink(store, offset, realign, on_frame, bar, known)
    keep = 4 * max(scale_frames, getattr(session, "overlap", 0), 8)  # inputs awaiting a late prediction
    try:
        read = 0
        for index, (name, frame) in enumerate(source):
            read = index + 1
            if index < resume_at and name != store.finished_name(index):
                raise ValueError(
                    f"the input is not the one the earlier run in {out} read: its frame {index} was "
                    f"{store.finished_name(index)!r}, now it is {name!r} (frames added or removed before the end?); "
                    "give the same input to resume, or start over (--no-resume; RunOptions(resume=False))"
                )
            if index < offset:
                continue
            sink.frames[index] = frame, source.last_time, known.frame_K(source) if known is not None else None
            sink.emit(session.step(frame, name=name))
            for stale in [i for i in sink.frames if i < index - keep]:
                sink.frames.pop(stale)
        if read < resume_at:
            raise ValueError(
                f"the input is not the one the earlier run in {out} read: it has {read} frames, that run "
                f"finished {resume_at} (frames removed?); give the same input to resume, or start over "
                "(--no-resume; RunOptions(resume=False))"
            )
        sink.emit(session.flush())
    finally:
        bar.close()
        store.flush()
        session.close()
    return Streamed(resume_at, sink.new, sink.in_callback, known.record() if known is not None else None)


def _resume_overlap(resume_at: int, expected: int | None, scale_frames: int) -> int:
    """How many finished frames the stream is fed again, to align the new ones to (none when
    nothing was finished, or everything: then the input is only read for its names)."""
    complete = bool(resume_at) and expected is not None and resume_at >= expected
    overlap = 0 if complete else min(resume_at, max(scale_frames, 2))
    if complete:
        log.info("all %d frames of this input were finished by an earlier run with these settings: "
                 "writing the outputs again (--no-resume runs the model again)", resume_at)
    elif resume_at:  # the cache of the interrupted stream is gone: say what the new frames come from
        log.warning(
            "resuming after %d finished frames: the stream restarts with the last %d of them as its scale frames and "
            "is aligned to them by Sim(3), so the frames after differ from an uninterrupted run's "
            "(--no-resume starts over)", resume_at, overlap,
        )
    return overlap


class _FrameSink:
    """Where the session's predictions go: aligned when resuming, stored with their input
    frame, handed to the caller, counted."""

    def __init__(self, store: FrameStore, offset: int, realign: _Realigner | None, on_frame: FrameCallback | None,
                 bar, known: _KnownCamera | None = None) -> None:
        self.store, self.offset, self.realign, self.on_frame, self.bar = store, offset, realign, on_frame, bar
        self.known = known
        # Inputs awaiting their prediction (scale phase), with the time the source gave them
        # and the known K on the frame (None: the network's stays).
        self.frames: dict[int, tuple[torch.Tensor, float | None, torch.Tensor | None]] = {}
        self.new = 0
        self.in_callback = 0.0

    def emit(self, preds: list[FramePrediction]) -> None:
        for pred in preds:
            seq_index = pred.index + self.offset
            if self.realign is not None:
                pred = self.realign.take(pred, seq_index)
                if pred is None:  # a re-fed frame: it only anchors the alignment
                    continue
            frame, when, K = self.frames.pop(seq_index)
            if K is not None:
                self.known.predicted.append(pred.K.float().cpu())
                pred = dataclasses.replace(pred, K=K.to(pred.K.device, pred.K.dtype))
            self.store.add(_frame_record(pred, frame, when))
            if self.on_frame is not None:
                called = time.perf_counter()
                self.on_frame(pred, frame, seq_index)
                self.in_callback += time.perf_counter() - called
            self.new += 1
            self.bar.update(1)


def _frame_record(pred: FramePrediction, frame: torch.Tensor, when: float | None) -> dict[str, Any]:
    image = (frame.permute(1, 2, 0).clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()
    return {
        "image": image,
        "depth": pred.depth.float().cpu().numpy(),
        "depth_conf": pred.depth_conf.float().cpu().numpy(),
        "T_world_cam": pred.T_world_cam.float().cpu().numpy(),
        "K": pred.K.float().cpu().numpy(),
        # One way for every frame: the network's quaternion has any length, a re-encoded one
        # (a resumed or windowed run's aligned frames) unit length.
        "pose_enc": unit_quaternion_encoding(pred.pose_enc.float()).cpu().numpy(),
        "keyframe": bool(pred.keyframe),
        "scale_frame": bool(pred.scale_frame),
        "index": int(pred.index),
        "name": pred.name or f"frame_{pred.index:06d}",
        "time": float("nan") if when is None else float(when),
    }


def _as_prediction(record: dict[str, Any]) -> FramePrediction:
    t = {k: torch.as_tensor(np.asarray(record[k])) for k in ("pose_enc", "depth", "depth_conf", "T_world_cam", "K")}
    return FramePrediction(
        index=int(record["index"]), pose_enc=t["pose_enc"], T_world_cam=t["T_world_cam"],
        T_cam_world=invert_se3(t["T_world_cam"]),
        K=t["K"], depth=t["depth"], depth_conf=t["depth_conf"], keyframe=bool(record["keyframe"]),
        scale_frame=bool(record["scale_frame"]),
    )


class _KnownCamera:
    """A known camera's K on each frame, as the frame was preprocessed from its image, and the
    network's K beside it for the record."""

    def __init__(self, intrinsics: KnownIntrinsics) -> None:
        self.intrinsics = intrinsics
        self._by_map: dict[tuple, torch.Tensor] = {}
        self.predicted: list[torch.Tensor] = []
        self.first: torch.Tensor | None = None

    def frame_K(self, source) -> torch.Tensor:
        """The known K on the frame `source` yielded last."""
        key = (source.last_picture_size, source.last_pixel_map.round(9).tobytes())
        if key not in self._by_map:
            K = frame_intrinsics(self.intrinsics.for_size(*source.last_picture_size), source.last_pixel_map)
            self._by_map[key] = torch.from_numpy(K).float()
        if self.first is None:
            self.first = self._by_map[key]
        return self._by_map[key]

    def record(self) -> dict | None:
        """run.json's "intrinsics": the source, the first frame's known fx, fy, cx, cy and the
        median of the network's over the new frames (how far its focal length was off)."""
        if self.first is None:
            return None
        record = {"source": self.intrinsics.source, "frame_fx_fy_cx_cy": _fx_fy_cx_cy(self.first)}
        if self.predicted:
            predicted = torch.stack(self.predicted).median(dim=0).values
            record["network_median_fx_fy_cx_cy"] = _fx_fy_cx_cy(predicted)
            record["network_focal_error"] = float(predicted[0, 0] / self.first[0, 0] - 1)
        return record


def _fx_fy_cx_cy(K: torch.Tensor) -> list[float]:
    return [round(float(v), 4) for v in (K[0, 0], K[1, 1], K[0, 2], K[1, 2])]


class _Realigner:
    """Maps a resumed stream onto the finished frames: predictions of the re-fed frames
    (those already finished) only estimate the Sim(3); later ones are warped by it."""

    def __init__(self, anchors: list[dict[str, Any]]) -> None:
        self.anchors = [_as_prediction(r) for r in anchors]
        self.shared: list[FramePrediction] = []
        self.sim = None

    def take(self, pred: FramePrediction, seq_index: int) -> FramePrediction | None:
        if self.sim is None and len(self.shared) < len(self.anchors):
            self.shared.append(pred)
            if len(self.shared) == len(self.anchors):
                self.sim = pairwise_alignment(
                    predictions_as_window(self.anchors), predictions_as_window(self.shared), len(self.shared)
                )
                log.info("resumed stream aligned: scale %.4f", float(self.sim.scale[0]))
            return None
        return warp_prediction(pred, self.sim, index=seq_index)
