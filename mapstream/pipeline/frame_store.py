"""Finished frames of a run, kept on disk as they come: nothing is lost on interruption.

Frames are buffered in memory and written as numbered shards (`<out>/.frames/shard_*.npz`,
atomically) every `shard_frames` frames; `progress.json` records the run's configuration
and the frames finished. A later run with the same configuration reads the shards back and
resumes after the last finished frame. At the end, `assemble()` gathers every shard into
memory-mapped arrays (bounded RAM however long the run) for the exporters.
"""
from __future__ import annotations

import json
import re
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..export.reconstruction import Reconstruction
from ..io.atomic import atomic_path, atomic_write_text, prepare_dir, remove_stale_temp_files

__all__ = ["FrameStore", "FrameRecord", "stored_scale_frames"]

log = logging.getLogger(__name__)

FrameRecord = dict[str, Any]
"""One frame: image [H,W,3] u8, depth, depth_conf [H,W] f32, T_world_cam [3,4], K [3,3],
pose_enc [9], keyframe bool, scale_frame bool (one of a window's scale frames), name str,
index int, time f64 (seconds, NaN when unknown)."""

_ARRAYS = ("image", "depth", "depth_conf", "T_world_cam", "K", "pose_enc", "keyframe", "scale_frame", "index", "time")
_ADDED_LATER = {"time": np.nan, "scale_frame": False}
"""Columns that shards written before them lack, and what such a shard's frames read."""


def _column(data, key: str) -> np.ndarray:
    """A shard's column; one written before a column existed reads its `_ADDED_LATER` value."""
    if key in _ADDED_LATER and key not in data:
        return np.full(data["index"].shape[0], _ADDED_LATER[key])
    return data[key]


def _read_progress(path: Path) -> dict[str, Any] | None:
    """The progress record of an earlier run in the folder, or None when there is none or it
    cannot be read (then the run starts over, and says so)."""
    if not path.exists():
        return None
    try:
        progress = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s); starting over", path, exc)
        return None
    if not isinstance(progress, dict):
        log.warning("%s is not a progress record; starting over", path)
        return None
    return progress


_SHAPES = {  # each array's shape after the frame axis ("H", "W": the frame's size) and dtype kinds
    "image": (("H", "W", 3), "u"), "depth": (("H", "W"), "f"), "depth_conf": (("H", "W"), "f"),
    "T_world_cam": ((3, 4), "f"), "K": ((3, 3), "f"), "pose_enc": ((9,), "f"), "keyframe": ((), "b"),
    "scale_frame": ((), "b"), "index": ((), "iu"), "time": ((), "f"),
}
_FINITE = ("T_world_cam", "K", "pose_enc")  # a camera with NaN in it cannot be exported


class _Unreadable(Exception):
    """A shard that cannot be read back as the frames progress.json says it holds."""


def _check_shard(shard: Path, frames: int, frame_hw: tuple[int, int] | None) -> tuple[int, int]:
    """Read ``shard`` whole and check that it holds ``frames`` frames of size ``frame_hw``
    (None: any size, as the first shard sets it); returns the frames' size. Every array is
    read, so that the zip's checksums are checked: one flipped byte would otherwise pass here
    and fail the export. Raises _Unreadable saying what is wrong."""
    try:
        with np.load(shard) as data:
            for key, (tail, kinds) in _SHAPES.items():
                if key in _ADDED_LATER and key not in data.files:
                    continue  # written before this column existed
                if key not in data.files:
                    raise _Unreadable(f"it has no {key!r} array")
                array = data[key]
                if frame_hw is None and key == "image" and array.ndim == 4:
                    frame_hw = tuple(array.shape[1:3])
                sizes = {"H": frame_hw[0], "W": frame_hw[1]} if frame_hw is not None else {}
                expected = (frames, *(sizes.get(d, d) for d in tail))
                if array.shape != expected or array.dtype.kind not in kinds:
                    raise _Unreadable(f"its {key!r} is {array.dtype} {list(array.shape)}, expected {list(expected)}")
                if key in _FINITE and not np.isfinite(array).all():
                    raise _Unreadable(f"its {key!r} holds NaN or infinity")
    except _Unreadable:
        raise
    # Any failure to read a file damaged on disk or cut short (a bad checksum, a zip without
    # its directory, a header that does not parse...) means the same: compute it again.
    except Exception as exc:  # noqa: BLE001
        raise _Unreadable(f"{type(exc).__name__}: {exc}") from exc
    return frame_hw


class FrameStore:
    def __init__(
        self, out_dir: Path, config: dict[str, Any], *, shard_frames: int = 64, shard_seconds: float = 2.0,
        resume: bool = True, recorded_later: dict[str, Any] | None = None,
        same_as_now: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.out = prepare_dir(out_dir)
        self.dir = prepare_dir(self.out / ".frames")
        self.config = config
        # Settings that progress files written before they were recorded ran with: such a
        # run still resumes when this one uses the same values.
        self.recorded_later = dict(recorded_later or {})
        # How an earlier run's recorded settings read today (e.g. its input path resolved).
        self.same_as_now = same_as_now or (lambda config: config)
        self.shard_frames = shard_frames
        self.shard_seconds = shard_seconds  # an interruption loses at most this much work
        self._last_flush = time.monotonic()
        self._buffer: list[FrameRecord] = []
        self._shards: list[tuple[Path, int]] = []  # (path, frames)
        self._names: list[str] = []
        self.finished = 0
        # Shards of an earlier run that this one does not continue. They stay, resumable by a
        # run with their configuration, until this run has frames of its own to write: a rerun
        # with another setting that is stopped at once loses nothing.
        self._replaced: list[Path] = []
        remove_stale_temp_files(self.dir)  # half-written shards of an interrupted run
        progress = _read_progress(self.out / "progress.json") if resume else None
        if progress is None or not self._resume(progress):
            self._replaced = sorted(self.dir.glob("shard_*.npz"))
            if self._replaced:
                log.info("%d finished-frame files of an earlier run in %s are replaced once this run "
                         "finishes its first frames", len(self._replaced), self.out)

    def _resume(self, progress: dict[str, Any]) -> bool:
        """Continue the earlier run of `progress` if it had this configuration (True)."""
        if self.same_as_now({**self.recorded_later, **progress.get("config", {})}) != self.config:
            log.warning("existing outputs in %s come from another configuration; starting over", self.out)
            return False
        frame_hw = None  # the finished frames' size, as the first shard holds them
        for entry in progress.get("shards", []):
            try:
                path, frames, names = self.dir / entry["file"], int(entry["frames"]), list(entry["names"])
                if not re.fullmatch(r"shard_\d{6}\.npz", entry["file"]):  # only the store's own files
                    raise ValueError(entry["file"])
            except (TypeError, KeyError, ValueError):
                log.warning("progress.json in %s lists a shard it does not describe; resuming before it", self.out)
                break
            try:
                if len(names) != frames:
                    raise _Unreadable(f"progress.json gives it {frames} frames and {len(names)} names")
                frame_hw = _check_shard(path, frames, frame_hw)
            except _Unreadable as fault:  # lost or damaged: its frames, and those after, are computed again
                log.warning("finished-frames file %s cannot be read back (%s); its frames and those after it "
                            "are computed again", path, fault)
                break
            self._shards.append((path, frames))
            self._names.extend(names)
        self.finished = sum(n for _, n in self._shards)
        log.info("resuming: %d frames already finished in %s", self.finished, self.out)
        return True

    def finished_name(self, index: int) -> str:
        """The name of finished frame ``index`` (0 <= index < finished), as the source gave it."""
        return self._names[index]

    def add(self, record: FrameRecord) -> None:
        self._buffer.append(record)
        if len(self._buffer) >= self.shard_frames or time.monotonic() - self._last_flush > self.shard_seconds:
            self.flush()

    def flush(self) -> None:
        """Write buffered frames as a shard and update progress.json (both atomically)."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        if self._replaced:
            self._drop_replaced()
        path = self.dir / f"shard_{len(self._shards):06d}.npz"
        arrays = {key: np.stack([np.asarray(r[key]) for r in self._buffer]) for key in _ARRAYS}
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
        names = [r["name"] for r in self._buffer]
        self._shards.append((path, len(self._buffer)))
        self._names.extend(names)
        self.finished += len(self._buffer)
        self._buffer = []
        shards = []
        for i, (p, n) in enumerate(self._shards):
            start = sum(m for _, m in self._shards[:i])
            shards.append({"file": p.name, "frames": n, "names": self._names[start : start + n]})
        atomic_write_text(
            self.out / "progress.json", json.dumps({"config": self.config, "frames": self.finished, "shards": shards}, indent=1)
        )

    def _drop_replaced(self) -> None:
        """Forget the earlier run: first its progress record (so that no later run reads this
        run's shards under its configuration), then its shards."""
        atomic_write_text(self.out / "progress.json", json.dumps({"config": self.config, "frames": 0, "shards": []}))
        for old in self._replaced:
            old.unlink(missing_ok=True)
        self._replaced = []

    def last_records(self, count: int) -> list[FrameRecord]:
        """The last `count` finished frames (for re-anchoring a resumed run)."""
        self.flush()
        records: list[FrameRecord] = []
        for path, _ in reversed(self._shards):
            with np.load(path) as data:
                columns = {key: _column(data, key) for key in _ARRAYS}  # each read once
                for j in reversed(range(columns["index"].shape[0])):
                    records.insert(0, {key: column[j] for key, column in columns.items()})
                    if len(records) == count:
                        return records
        return records

    @property
    def total(self) -> int:
        return self.finished + len(self._buffer)

    def assemble(self, fps: float | None = None) -> Reconstruction:
        """Every finished frame as a Reconstruction backed by memory-mapped arrays (a copy of
        the shards in one file per array, `discard_assembled` once read)."""
        self.flush()
        if not self._shards:
            raise ValueError("no frame was finished; nothing to export")
        work = prepare_dir(self._assembled)
        with np.load(self._shards[0][0]) as first:
            shapes = {key: _column(first, key).shape[1:] for key in _ARRAYS}
            dtypes = {key: _column(first, key).dtype for key in _ARRAYS}
        total = self.finished
        arrays = {
            key: np.lib.format.open_memmap(work / f"{key}.npy", mode="w+", dtype=dtypes[key], shape=(total, *shapes[key]))
            for key in _ARRAYS
        }
        at = 0
        for path, n in self._shards:
            with np.load(path) as data:
                for key in _ARRAYS:
                    arrays[key][at : at + n] = _column(data, key)
            at += n
        return Reconstruction(
            images=arrays["image"],
            depth=arrays["depth"],
            depth_conf=arrays["depth_conf"],
            T_world_cam=arrays["T_world_cam"],
            K=arrays["K"],
            pose_enc=arrays["pose_enc"],
            names=list(self._names),
            keyframe=np.asarray(arrays["keyframe"], dtype=bool),
            timestamps=_timestamps(arrays["time"]),
            fps=fps,
        )

    def scale_frames(self) -> np.ndarray:
        """Which finished frames were a window's scale frames (bool [finished]): where a
        windowed stream joins two windows, which the global map weighs as such."""
        self.flush()
        return _scale_frames([path for path, _ in self._shards])

    @property
    def _assembled(self) -> Path:
        return self.out / ".frames" / "assembled"

    def discard_assembled(self) -> None:
        """Remove `assemble`'s arrays: as large as every finished frame together, and the
        shards hold the same for a resume. A Reconstruction made from them stays readable
        while it lives (the files are unlinked; their mappings hold the data)."""
        shutil.rmtree(self._assembled, ignore_errors=True)


def _scale_frames(shards: list[Path]) -> np.ndarray:
    parts = []
    for path in shards:
        with np.load(path) as data:
            parts.append(np.asarray(_column(data, "scale_frame"), dtype=bool))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def stored_scale_frames(out_dir: Path) -> np.ndarray:
    """The scale-frame marks of the frames a finished (or interrupted) run in `out_dir` stored,
    in order: what `FrameStore.scale_frames` gives that run (e.g. to replay its global map)."""
    progress = _read_progress(Path(out_dir) / "progress.json")
    if progress is None:
        raise ValueError(f"{out_dir} holds no run's progress.json")
    return _scale_frames([Path(out_dir) / ".frames" / entry["file"] for entry in progress.get("shards", [])])


def _timestamps(times: np.ndarray) -> np.ndarray | None:
    """The frames' own times when every frame has one (video, live capture), else None:
    the reconstruction then numbers them by the sampling rate."""
    times = np.asarray(times, dtype=np.float64)
    return times.copy() if times.size and np.isfinite(times).all() else None
