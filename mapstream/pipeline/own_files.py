"""The files a run folder holds as the run's own: its outputs and the input it read.

Other tools that write into a run folder (the viewer's "export GLB", "screenshot" and "record
video" fields) must never replace one of them: an output replaced is a run no longer what its
run.json says, an input replaced is a photo lost.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .folder_lock import LOCK_NAME
from .outputs import FORMAT_OUTPUTS, RUN_FILES

__all__ = ["RunOwnFiles", "run_own_files"]

_OWN_FOLDERS = (".frames", "input")
"""Folders a run keeps besides its formats' (the frame store; the demo's rendered input)."""


class RunOwnFiles:
    """Paths (links followed) that are a run's own: ``files`` one by one, and everything below
    ``folders``."""

    def __init__(self, files: list[Path], folders: list[Path]) -> None:
        self.files = frozenset(Path(os.path.realpath(f)) for f in files)
        self.folders = tuple(dict.fromkeys(Path(os.path.realpath(f)) for f in folders))

    def owns(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` (links followed) is one of the run's files or lies in one of its folders."""
        real = Path(os.path.realpath(path))
        return real in self.files or any(real == f or f in real.parents for f in self.folders)


def run_own_files(out: str | os.PathLike[str]) -> RunOwnFiles:
    """The run folder ``out``'s own files: every file and folder its formats write
    (`outputs.FORMAT_OUTPUTS`), run.json, progress.json, its lock, the frame store, and the
    input its run.json names (a file; a folder's files, which the run read; a glob's matches)."""
    out = Path(out)
    entries = [e for paths in FORMAT_OUTPUTS.values() for e in paths]
    files = [out / name for name in (*RUN_FILES, LOCK_NAME)]
    folders = [out / e for e in entries if not Path(e).suffix] + [out / name for name in _OWN_FOLDERS]
    files += _input_files(out)
    return RunOwnFiles(files, folders)


def _input_files(out: Path) -> list[Path]:
    """The files of the input that ``out``'s run.json names (none when it names none)."""
    from ..io.sources import glob_files, is_glob

    try:
        config = json.loads((out / "run.json").read_text()).get("config", {})
        spec = config.get("input") if isinstance(config, dict) else None
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(spec, str) or not spec or spec == "demo" or "://" in spec:
        return []
    path = Path(spec)
    if path.is_dir():
        return [p for p in path.iterdir() if p.is_file()]
    if path.is_file():
        return [path]
    return [Path(m) for m in glob_files(spec)] if is_glob(spec) else []
