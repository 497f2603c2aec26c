"""What a run leaves in its output folder, and how the next run replaces it.

A run writes its formats' files into a folder that may hold an earlier run's (another input,
fewer frames, other formats) and the user's own files. The rules: nothing of another run
passes for this one's (the earlier run's files this run does not write again are removed, and
a run stopped while exporting leaves a mark that says so); nothing that may be the user's is
touched (only names mapstream writes, only regular files, never through a link, never an
input); and a killed write leaves no temp file behind. run.json is the record all of this
reads.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from ..export import write_run_json

__all__ = ["FORMAT_OUTPUTS", "FRAME_FOLDERS", "RUN_FILES", "EarlierRun", "record_export", "remove_interrupted_writes"]

log = logging.getLogger(__name__)

_PERFRAME_FOLDERS = ("images", "depth", "depth_preview", "masks")
"""Output folders holding one ``<stem>.png`` a frame (`Reconstruction.file_stems`)."""
FRAME_FOLDERS = (*_PERFRAME_FOLDERS, "sparse")
"""The output folder's subfolders that exports write frame by frame (sparse/: COLMAP's model,
which names every frame's image)."""
_COLMAP_FILES = ("cameras.txt", "images.txt", "points3D.txt")
"""What `write_colmap` writes in ``sparse/0``."""


_BEING_REPLACED = (
    "a run into this folder was writing its outputs and did not finish: the folder may hold part of them beside an "
    "earlier run's files; run it again (its settings are under replaced_by) to complete it"
)
FORMAT_OUTPUTS = {
    "npz": ("predictions.npz",), "tum": ("trajectory_tum.txt",), "ply": ("points.ply",), "glb": ("scene.glb",),
    "depth": ("depth", "depth_preview"), "images": ("images",), "colmap": ("images", "sparse/0"),
    "nerfstudio": ("images", "transforms.json", "masks"), "summary": ("summary.png",),
}
"""What each export format may write in the output folder (files, or folders of per-frame
files), as `export.export_all` names them; read for a run that stopped while exporting."""


def _mark_being_replaced(out: Path, earlier: dict, settings: dict, formats, stems: list[str]) -> None:
    """Before this run's exports write, run.json says that the folder is being rewritten
    (``state``) and records what this run is about to write (``replaced_by``: its settings,
    formats, frame names and the time, after the entries of runs stopped the same way before),
    keeping what a later run's cleanup reads of the earlier run. A run killed while exporting
    thus leaves no run.json that vouches for the folder as one finished run, and the next run
    removes the files it wrote (`_replacing_outputs`). This run's own run.json, written last,
    replaces it."""
    entry = {"settings": settings, "formats": list(formats), "frame_stems": stems, "since": time.time()}
    write_run_json({**earlier, "state": _BEING_REPLACED, "replaced_by": [*_replacing_runs(earlier), entry]},
                   out / "run.json")


def _replacing_runs(info: dict) -> list[dict]:
    """The runs that stopped while replacing the run of run.json ``info`` (`_mark_being_replaced`)."""
    entries = info.get("replaced_by", [])
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _replacing_outputs(out: Path, info: dict) -> tuple[list[Path], list[Path]]:
    """(files, folders) that runs stopped while replacing the run of ``info`` wrote: the
    outputs of their formats (`FORMAT_OUTPUTS`) and the per-frame files of their own frame
    names, the files among them changed since the run marked the folder (older ones, a user's
    own `points.ply` say, were not written by it); the folders for the cleanup to remove
    once empty."""
    files: list[Path] = []
    folders: list[Path] = []
    for entry in _replacing_runs(info):
        formats, since = entry.get("formats"), entry.get("since")
        if not isinstance(formats, list) or not isinstance(since, (int, float)):
            continue
        outputs = [out / p for name in formats if isinstance(name, str) for p in FORMAT_OUTPUTS.get(name, ())]
        for path in [*outputs, *_known_files(out, outputs, _previous_stems(entry))]:
            try:
                if path.is_dir() and not path.is_symlink():
                    folders.append(path)
                elif path.stat().st_mtime >= since:
                    files.append(path)
            except OSError:  # not there: never written
                continue
    return files, folders


def _earlier_run(out: Path) -> dict:
    """The run.json an earlier run left in ``out``, read once for what the cleanup needs of it
    (empty when there is none or it is unreadable)."""
    try:
        info = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _previous_outputs(out: Path, info: dict) -> list[Path]:
    """The outputs an earlier run in ``out`` listed in its run.json ``info``, as paths under
    ``out`` (none if unreadable). run.json records them as that run was given ``out``, relative
    to its working directory when ``out`` was relative; they are re-rooted here."""
    try:
        listed = info.get("outputs", {})
        old_out = Path(info["config"]["options"]["out"])
    except (KeyError, AttributeError, TypeError):
        return []
    paths = []
    for value in listed.values() if isinstance(listed, dict) else []:
        if not isinstance(value, str):  # a damaged or hand-edited run.json
            continue
        path = Path(value)
        try:
            paths.append(out / path.relative_to(old_out))
        except ValueError:  # not under the out it was given: trusted only if absolute
            if path.is_absolute():
                paths.append(path)
    return paths


def _known_files(out: Path, outputs: dict[str, Path] | list[Path], stems: list[str]) -> list[Path]:
    """The files inside the output folders among ``outputs`` (format name -> path, or paths)
    whose names mapstream writes: ``<stem>.png`` for each stem in each per-frame folder
    directly in ``out``, and COLMAP's three text files in ``out/sparse/0``."""
    paths = outputs.values() if isinstance(outputs, dict) else outputs
    root = Path(os.path.abspath(out))
    files = []
    for folder in (Path(os.path.abspath(p)) for p in paths):
        if folder.parent == root and folder.name in _PERFRAME_FOLDERS:
            files += [folder / f"{stem}.png" for stem in stems]
        elif folder == root / "sparse" / "0":
            files += [folder / name for name in _COLMAP_FILES]
    return files


def _previous_stems(info: dict) -> list[str]:
    """The frame stems an earlier run recorded in its run.json ``info`` (none before they were
    recorded); only plain names that fit a file name with ".png", so that a damaged or
    hand-edited run.json cannot point outside its folders."""
    stems = info.get("frame_stems", [])
    if not isinstance(stems, list):
        return []
    return [s for s in stems if isinstance(s, str) and 0 < len(s.encode()) <= 251 and s not in (".", "..")
            and Path(s).name == s and "\\" not in s and "\0" not in s]


def _below_without_links(out: Path, path: Path) -> Path | None:
    """``path`` resolved, when it lies below ``out`` with no link on the way down from ``out``
    (``out`` itself may be one); else None. What a removal may touch: a link, or anything
    reached through one, may be the user's."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(out))
    except ValueError:
        return None
    root = Path(os.path.realpath(out))  # where the names below out lie, out's own links followed
    step = root
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            return None
    return step if rel.parts else None


def _remove_stale_outputs(out: Path, previous: list[Path], written: dict[str, Path], inputs: set[Path],
                          previous_known: list[Path] = (), known_written: list[Path] = ()) -> None:
    """Remove the files an earlier run in ``out`` wrote and this one did not write again (another
    input, fewer frames, fewer formats), so that no file of another run passes for this one's:
    its listed files (``previous``) and the files of its listed folders that carry names
    mapstream writes (``previous_known``: per-frame PNGs by the stems its run.json recorded,
    COLMAP's files). Only regular files below ``out``, reached without a link, and none of the
    input's files (``inputs``, `_input_files`). A folder of outputs (depth/, images/,
    sparse/0...) goes only once empty: it may hold the user's own files, and is then named in
    a warning. A file that cannot be removed is told: this run's outputs are written by now."""
    keep = {p for p in (_below_without_links(out, q) for q in (*written.values(), *known_written)) if p is not None}
    removed = 0
    for given in [*previous_known, *previous]:  # files first: their folders may empty
        try:
            path = _below_without_links(out, given)
            if path is None or path in keep or path in inputs or not path.exists():
                continue
            if path.is_file():
                path.unlink()
                removed += 1
                log.debug("removed %s, an earlier run's output this run does not write", path)
            elif path.is_dir():
                _remove_if_empty(path, out.resolve())
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("could not remove %s, an earlier run's output: %s", given, exc)
    if removed:
        log.info("removed %d files of an earlier run in %s that this run does not write", removed, out)


def _remove_if_empty(folder: Path, root: Path) -> None:
    """Remove ``folder``, and then its parents below ``root``, while they are empty; warn
    about the first that is not."""
    if any(folder.iterdir()):
        log.warning("%s holds files this run did not write (an earlier run's, or yours); "
                    "left as it was (delete it if it is not needed)", folder)
        return
    while folder != root and root in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        log.info("removed %s, an earlier run's output folder this run does not write", folder)
        folder = folder.parent


RUN_FILES = (*(p for paths in FORMAT_OUTPUTS.values() for p in paths if Path(p).suffix), "run.json", "progress.json")
"""The files a run writes directly in its output folder: its formats' files (the entries of
`FORMAT_OUTPUTS` with a suffix; the others are folders), run.json and the frame store's
progress.json."""


def remove_interrupted_writes(out: Path) -> None:
    """Delete the temp files of atomic writes that a killed run left behind
    (`io.atomic`: ``.<name>.tmp-<8 hex><suffix>``), and only a run's own: in the output folder
    those of the files it writes there, in its per-frame folders those of PNGs, in sparse/0
    those of COLMAP's files. Nothing below a link is touched (as the rerun cleanup), and no
    other file: another tool may be writing its own temp files here (`mapstream render`'s
    video, the viewer's screenshots), which the run's lock does not keep out."""
    from ..io.atomic import remove_stale_temp_files

    removed = remove_stale_temp_files(out, recursive=False, targets=lambda name: name in RUN_FILES)
    for name in _PERFRAME_FOLDERS:
        if not (out / name).is_symlink():
            removed += remove_stale_temp_files(out / name, recursive=False, targets=lambda n: n.endswith(".png"))
    if not (out / "sparse").is_symlink() and not (out / "sparse" / "0").is_symlink():
        removed += remove_stale_temp_files(out / "sparse" / "0", recursive=False, targets=lambda n: n in _COLMAP_FILES)
    if removed:
        log.info("removed %d temp files of an interrupted write in %s", len(removed), out)




class EarlierRun:
    """The run recorded in an output folder's run.json, read before this run's replaces it,
    and what this run does about its files: `mark_being_replaced` before exporting,
    `remove_what_is_not_rewritten` after."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.info = _earlier_run(out)
        stopped_files, stopped_folders = _replacing_outputs(out, self.info)
        listed = _previous_outputs(out, self.info)
        # Its listed outputs and the folders of runs stopped while replacing it; the files in
        # those folders with names mapstream writes, and what the stopped runs wrote.
        self.outputs = list(dict.fromkeys([*listed, *stopped_folders]))
        self.known_files = list(dict.fromkeys([*_known_files(out, listed, _previous_stems(self.info)), *stopped_files]))

    def mark_being_replaced(self, settings: dict, formats, stems: list[str]) -> None:
        """See `_mark_being_replaced`."""
        _mark_being_replaced(self.out, self.info, settings, formats, stems)

    def remove_what_is_not_rewritten(self, written: dict[str, Path], stems: list[str], inputs: set[Path]) -> None:
        """Remove this earlier run's files that this run, having written ``written`` with per-frame
        names ``stems``, did not write again; never one of ``inputs`` (`_remove_stale_outputs`)."""
        _remove_stale_outputs(self.out, self.outputs, written, inputs, self.known_files,
                              _known_files(self.out, written, stems))


def record_export(out: Path, written: dict[str, Path], stems: list[str]) -> None:
    """After `mapstream export` wrote ``written`` (format name -> path) for frames ``stems``
    into ``out``: when ``out`` holds a run (its run.json), the per-frame files of that run's
    other frames in the folders just written go (they would pass for part of this export),
    and run.json lists the export's outputs and frame names beside the run's, so that the next
    run in ``out`` removes what it does not write again. A folder without a run.json is left
    unrecorded: it is the user's export folder, not a run's."""
    earlier = _earlier_run(out)
    if not earlier:
        return
    old_stems = _previous_stems(earlier)
    stale = set(_known_files(out, written, old_stems)) - set(_known_files(out, written, stems))
    _remove_stale_outputs(out, [], written, set(), sorted(stale))
    listed = earlier.get("outputs")
    outputs = dict(listed) if isinstance(listed, dict) else {}
    try:  # as the run recorded its own: under the output folder it was given
        old_out = Path(earlier["config"]["options"]["out"])
    except (KeyError, TypeError):
        old_out = None
    for name, path in written.items():
        relative = Path(os.path.relpath(path, out))
        outputs[name] = str(old_out / relative if old_out is not None else Path(os.path.abspath(path)))
    write_run_json({**earlier, "outputs": outputs, "frame_stems": list(dict.fromkeys([*old_stems, *stems]))},
                   out / "run.json")
