"""The output folder of one run: held, resumed from, cleaned and recorded by one object.

A run's folder may hold an earlier run's outputs, a run stopped while exporting, and the
user's own files. `RunFolder` is the one place that decides what happens to them:

- it holds the folder (`folder_lock`) for the run's whole length, and a run that fails
  before writing anything leaves the folder as it found it (a folder it made goes again);
- its `FrameStore` keeps the finished frames and resumes them;
- before exporting, run.json says that the folder is being rewritten (a run stopped there
  leaves no run.json vouching for the folder as one finished run);
- after exporting, it removes what earlier runs wrote and this one did not write again:
  only names of its own format table for the frames of this run's input
  (`outputs.format_paths`), never a path or a frame name read from the earlier run.json,
  whose format names only choose among the table's entries;
- last, it writes this run's run.json.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..export import write_run_json
from ..io.atomic import prepare_dir
from .folder_lock import LOCK_NAME, lock_run_folder
from .frame_store import FrameStore
from .outputs import (
    FORMAT_OUTPUTS, format_paths, remove_files, remove_folders_left_empty, remove_interrupted_writes,
    tell_foreign_files, written_paths,
)

__all__ = ["RunFolder"]

log = logging.getLogger(__name__)

RUN_RECORD = "run.json"
_FRAMES = ".frames"  # `FrameStore`'s folder
_BEING_REPLACED = (
    "a run into this folder was writing its outputs and did not finish: the folder may hold part of them beside an "
    "earlier run's files; run it again (its settings are under replaced_by) to complete it"
)


@dataclass(frozen=True)
class _EarlierRun:
    """What a run takes from the run.json an earlier run left: the record itself (kept while
    this run marks the folder), the formats that run wrote, and, for each run stopped while
    replacing it, the formats it was writing and when it began. Format names not in the
    table are dropped: they choose table entries, nothing else."""

    info: dict[str, Any]
    formats: tuple[str, ...]
    stopped: tuple[tuple[tuple[str, ...], float], ...]

    @classmethod
    def read(cls, out: Path) -> _EarlierRun:
        try:
            info = json.loads((out / RUN_RECORD).read_text())
        except (OSError, ValueError):
            info = {}
        info = info if isinstance(info, dict) else {}
        outputs = info.get("outputs")
        formats = tuple(name for name in outputs if name in FORMAT_OUTPUTS) if isinstance(outputs, dict) else ()
        stopped = []
        for entry in _stopped_entries(info):
            names, since = entry.get("formats"), entry.get("since")
            if isinstance(names, list) and isinstance(since, (int, float)) and not isinstance(since, bool):
                stopped.append((tuple(n for n in names if isinstance(n, str) and n in FORMAT_OUTPUTS), float(since)))
        return cls(info, formats, tuple(stopped))


def _stopped_entries(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of the runs that stopped while replacing the run of run.json ``info``."""
    entries = info.get("replaced_by", [])
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


class RunFolder:
    """One run's output folder ``path``; ``inputs``: the input's files (resolved), which no
    cleanup removes. Use `held` around the whole run, then `frame_store`, `begin_export`
    and `finish` in that order."""

    def __init__(self, path: Path, *, inputs: set[Path] = frozenset()) -> None:
        self.path = Path(path)
        self.inputs = set(inputs)
        self._earlier: _EarlierRun | None = None
        self._formats: tuple[str, ...] = ()

    @contextlib.contextmanager
    def held(self) -> Iterator[RunFolder]:
        """Create the folder if needed and hold it for this run (another run there is refused);
        remove the temp files a killed write left. A run that fails before writing anything
        leaves no trace: not the lock file, not an empty `.frames`, not a folder it made."""
        made = _first_missing(self.path)
        prepare_dir(self.path)
        had = set(os.listdir(self.path))
        try:
            with lock_run_folder(self.path):
                try:
                    remove_interrupted_writes(self.path)
                    yield self
                except BaseException:
                    self._take_back(had)  # while the lock is held: no other run is starting here
                    raise
        except BaseException:
            if made is not None:
                _remove_empty_folders(self.path, made)
            raise

    def frame_store(self, config: dict[str, Any], **options: Any) -> FrameStore:
        """The run's finished frames: those of an earlier run with the same ``config``, when
        it resumes (`FrameStore` keywords in ``options``)."""
        return FrameStore(self.path, config, **options)

    def begin_export(self, settings: dict[str, Any], formats: tuple[str, ...], stems: list[str]) -> None:
        """Read what the cleanup needs of the earlier run.json, then mark it as being replaced:
        ``state`` says so and ``replaced_by`` gains this run's settings, formats, frame names
        and start time, after those of runs stopped the same way before. The rest of the
        record is kept for the next run. This run's run.json (`finish`) replaces it."""
        self._earlier = _EarlierRun.read(self.path)
        self._formats = tuple(formats)
        entry = {"settings": settings, "formats": list(formats), "frame_stems": stems, "since": time.time()}
        info = self._earlier.info
        write_run_json({**info, "state": _BEING_REPLACED, "replaced_by": [*_stopped_entries(info), entry]},
                       self.path / RUN_RECORD)

    def finish(self, written: dict[str, Path], stems: list[str], info: dict[str, Any]) -> Path:
        """After the exports wrote ``written`` (format name -> path) for frames of file stems
        ``stems``: remove the earlier runs' files this run did not write again, warn about
        files in its per-frame folders it did not write, and write run.json (``info`` with
        the outputs and frame names). Returns run.json's path."""
        if self._earlier is None:
            raise RuntimeError("RunFolder.finish comes after begin_export")
        own_files, own_folders = written_paths(self.path, written, stems)
        files, folders = format_paths(self.path, self._earlier.formats, stems)
        for formats, since in self._earlier.stopped:  # only what changed once that run began is its
            stopped_files, stopped_folders = format_paths(self.path, formats, stems)
            files += [p for p in stopped_files if _changed_since(p, since)]
            folders += stopped_folders
        removed = remove_files(self.path, files, keep=own_files, inputs=self.inputs)
        if removed:
            log.info("removed %d files of an earlier run in %s that this run does not write", removed, self.path)
        remove_folders_left_empty(self.path, [f for f in folders if f not in own_folders])
        for folder in own_folders:  # the per-frame folders (sparse/0 lies deeper and holds COLMAP's own names)
            if folder.parent == self.path and folder.is_dir() and not folder.is_symlink():
                tell_foreign_files(folder, {f"{stem}.png" for stem in stems})
        record = {**info, "outputs": {k: str(v) for k, v in written.items()}, "frame_stems": stems}
        return write_run_json(record, self.path / RUN_RECORD)

    def _take_back(self, had: set[str]) -> None:
        """After a failure: when the run wrote nothing (its only new entries are the lock file
        and a `.frames` without a file), remove those; else leave everything, for a resume."""
        new = set(os.listdir(self.path)) - had
        if not new <= {LOCK_NAME, _FRAMES} or (_FRAMES in new and _holds_a_file(self.path / _FRAMES)):
            return
        if _FRAMES in new:
            shutil.rmtree(self.path / _FRAMES, ignore_errors=True)
        if LOCK_NAME in new:
            (self.path / LOCK_NAME).unlink(missing_ok=True)
        log.debug("the run failed before writing anything: %s is left as it was", self.path)


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself or a parent) that does not exist yet: what
    creating ``path`` makes."""
    missing = None
    folder = Path(os.path.abspath(path))
    while not folder.exists() and not folder.is_symlink():
        missing, folder = folder, folder.parent
    return missing


def _remove_empty_folders(path: Path, made: Path) -> None:
    """Remove ``path`` and its parents up to ``made`` while they are empty."""
    folder = Path(os.path.abspath(path))
    made = Path(os.path.abspath(made))
    while folder == made or made in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty (something was written), or gone
            return
        folder = folder.parent


def _holds_a_file(folder: Path) -> bool:
    return any(not p.is_dir() for p in folder.rglob("*"))


def _changed_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:  # not there: never written
        return False
