"""What a run may write in its output folder, and the only files a run may delete there.

The output folder may hold an earlier run's files and the user's own. What mapstream deletes
is named here and nowhere else: the entries of `FORMAT_OUTPUTS` (what each export format
writes) and, in its per-frame folders, ``<stem>.png`` for the frame names of the input at
hand (a run's input; for `mapstream export`, the run it exports). A name read from a record
or a folder listing never becomes a path to delete, so a crafted or hand-edited run.json
cannot point a run at the user's files. Removal touches only regular files below the folder,
reached without a link, and never an input file.
"""
from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

from ..export import write_run_json

__all__ = [
    "FORMAT_OUTPUTS", "FRAME_FOLDERS", "RUN_FILES", "below_without_links", "entry_paths", "format_paths", "record_export",
    "remove_files", "remove_folders_left_empty", "remove_interrupted_writes", "tell_foreign_files", "written_paths",
]

log = logging.getLogger(__name__)

FORMAT_OUTPUTS = {
    "npz": ("predictions.npz",), "tum": ("trajectory_tum.txt",), "ply": ("points.ply",), "glb": ("scene.glb",),
    "depth": ("depth", "depth_preview"), "images": ("images",), "colmap": ("images", "sparse/0"),
    "nerfstudio": ("images", "transforms.json", "masks"), "summary": ("summary.png",),
}
"""What each export format may write in the output folder (files, or folders of per-frame
files), as `export.export_all` names them."""
_PERFRAME_FOLDERS = ("images", "depth", "depth_preview", "masks")
"""Output folders holding one ``<stem>.png`` a frame (`Reconstruction.file_stems`)."""
FRAME_FOLDERS = (*_PERFRAME_FOLDERS, "sparse")
"""The output folder's subfolders that exports write frame by frame (sparse/: COLMAP's model,
which names every frame's image)."""
_COLMAP_FILES = ("cameras.txt", "images.txt", "points3D.txt")
"""What `write_colmap` writes in ``sparse/0``."""
RUN_FILES = (*(p for paths in FORMAT_OUTPUTS.values() for p in paths if Path(p).suffix), "run.json", "progress.json")
"""The files a run writes directly in its output folder: its formats' files (the entries of
`FORMAT_OUTPUTS` with a suffix; the others are folders), run.json and the frame store's
progress.json."""


def format_paths(out: Path, formats: Iterable[str], stems: Iterable[str]) -> tuple[list[Path], list[Path]]:
    """(files, folders) that ``formats`` write in ``out`` for frames of file stems ``stems``
    (`entry_paths` of their table entries). Unknown format names name nothing."""
    return entry_paths(out, (e for name in formats for e in FORMAT_OUTPUTS.get(name, ())), stems)


def written_paths(out: Path, written: dict[str, Path], stems: Iterable[str]) -> tuple[list[Path], list[Path]]:
    """(files, folders) that an export which returned ``written`` (`export_all`) wrote in
    ``out`` for frames of file stems ``stems``."""
    entries = [os.path.relpath(os.path.abspath(path), os.path.abspath(out)).replace(os.sep, "/")
               for path in written.values()]
    return entry_paths(out, [e for e in entries if not e.startswith("..")], stems)


def entry_paths(out: Path, entries: Iterable[str], stems: Iterable[str]) -> tuple[list[Path], list[Path]]:
    """(files, folders) of table ``entries`` in ``out``: a file entry itself; for a per-frame
    folder ``<stem>.png`` a stem of ``stems``, for sparse/0 COLMAP's files, and the folder."""
    stems = list(stems)
    files: list[Path] = []
    folders: list[Path] = []
    for entry in dict.fromkeys(entries):
        if entry in _PERFRAME_FOLDERS:
            files += [out / entry / f"{stem}.png" for stem in stems]
            folders.append(out / entry)
        elif entry == "sparse/0":
            files += [out / entry / name for name in _COLMAP_FILES]
            folders.append(out / entry)
        else:
            files.append(out / entry)
    return files, folders


def below_without_links(out: Path, path: Path) -> Path | None:
    """``path`` resolved, when it lies below ``out`` with no link on the way down from ``out``
    (``out`` itself may be one); else None. What a removal may touch: a link, or anything
    reached through one, may be the user's."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(out))
    except ValueError:
        return None
    step = Path(os.path.realpath(out))  # where the names below out lie, out's own links followed
    for part in rel.parts:
        step = step / part
        if step.is_symlink():
            return None
    return step if rel.parts else None


def remove_files(out: Path, files: Iterable[Path], *, keep: Iterable[Path] = (), inputs: set[Path] = frozenset(),
                 what: str = "an earlier run's output") -> int:
    """Remove each of ``files`` that is a regular file below ``out`` reached without a link,
    is not among ``keep`` (this run's own outputs) and is not an input file; a file that
    cannot go is told. Returns how many went."""
    kept = {p for p in (below_without_links(out, q) for q in keep) if p is not None}
    removed = 0
    for given in files:
        try:
            path = below_without_links(out, given)
            if path is None or path in kept or path in inputs or not path.is_file():
                continue
            path.unlink()
            removed += 1
            log.debug("removed %s, %s this run does not write", path, what)
        except OSError as exc:
            log.warning("could not remove %s, %s: %s", given, what, exc)
    return removed


def remove_folders_left_empty(out: Path, folders: Iterable[Path]) -> None:
    """Remove each of ``folders`` (output folders of the table, below ``out`` without a link)
    once it is empty, then its parents below ``out`` while they are empty; one that still
    holds files is left, and told (they are an earlier run's frames of another input, or
    the user's)."""
    root = Path(os.path.realpath(out))
    for given in sorted(set(folders), key=lambda f: -len(f.parts)):  # sparse/0 before sparse
        folder = below_without_links(out, given)
        if folder is None or not folder.is_dir():
            continue
        try:
            if any(folder.iterdir()):
                tell_foreign_files(folder, set())
                continue
            while folder != root and root in folder.parents and not any(folder.iterdir()):
                folder.rmdir()
                log.info("removed %s, an earlier run's output folder this run does not write", folder)
                folder = folder.parent
        except OSError as exc:
            log.warning("could not remove %s, an earlier run's output folder: %s", folder, exc)


def tell_foreign_files(folder: Path, own: set[str]) -> None:
    """Warn when ``folder`` holds files other than ``own`` (names): they may pass for this
    run's, and mapstream cannot tell an earlier run's from the user's, so it leaves them."""
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in own)
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        log.warning("%s holds %d files this run did not write (%s): an earlier run's of other frames, or yours; "
                    "left as they are (delete them, or write to a new folder, if they should not pass for this "
                    "run's)", folder, len(foreign), shown)


def remove_interrupted_writes(out: Path) -> None:
    """Delete the temp files of atomic writes that a killed run left behind
    (`io.atomic`: ``.<name>.tmp-<8 hex><suffix>``), and only a run's own: in the output folder
    those of the files it writes there, in its per-frame folders those of PNGs, in sparse/0
    those of COLMAP's files. Nothing below a link is touched, and no other file: another tool
    may be writing its own temp files here (`mapstream render`'s video, the viewer's
    screenshots), which the run's lock does not keep out."""
    from ..io.atomic import remove_stale_temp_files

    removed = remove_stale_temp_files(out, recursive=False, targets=lambda name: name in RUN_FILES)
    for name in _PERFRAME_FOLDERS:
        if not (out / name).is_symlink():
            removed += remove_stale_temp_files(out / name, recursive=False, targets=lambda n: n.endswith(".png"))
    if not (out / "sparse").is_symlink() and not (out / "sparse" / "0").is_symlink():
        removed += remove_stale_temp_files(out / "sparse" / "0", recursive=False, targets=lambda n: n in _COLMAP_FILES)
    if removed:
        log.info("removed %d temp files of an interrupted write in %s", len(removed), out)


def record_export(out: Path, written: dict[str, Path], stems: list[str], *,
                  input_stems: list[str] | None = None) -> None:
    """After `mapstream export` wrote ``written`` (format name -> path) for frames ``stems``
    into ``out``: when ``out`` holds a run (its run.json), run.json lists the export's outputs
    beside the run's, so that the next run there removes them when it does not write them,
    and the files of the run's other frames go from the folders just written (they would
    pass for part of this export). The run's frames are ``input_stems``, by default those of
    the predictions.npz in ``out`` (the export's input when it writes in place). A folder
    without a run.json is the user's export folder: left unrecorded."""
    try:
        earlier = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(earlier, dict):
        return
    if input_stems is None:
        input_stems = _stems_of_run(out) or []
    if input_stems:
        exported = set(stems)
        left_out, _ = written_paths(out, written, [s for s in input_stems if s not in exported])
        keep, _ = written_paths(out, written, stems)
        remove_files(out, left_out, keep=keep, what="a frame this export leaves out")
    listed = earlier.get("outputs")
    outputs = dict(listed) if isinstance(listed, dict) else {}
    outputs.update({name: str(path) for name, path in written.items()})
    listed_stems = earlier.get("frame_stems")
    old_stems = [s for s in listed_stems if isinstance(s, str)] if isinstance(listed_stems, list) else []
    write_run_json({**earlier, "outputs": outputs, "frame_stems": list(dict.fromkeys([*old_stems, *stems]))},
                   out / "run.json")


def _stems_of_run(out: Path) -> list[str] | None:
    """The per-frame file stems of the run saved in ``out`` (the names in its
    predictions.npz, as `Reconstruction.file_stems` derives them); None without one."""
    import numpy as np

    from ..export.reconstruction import Reconstruction

    try:
        with np.load(out / "predictions.npz") as data:
            names = [str(name) for name in data["names"]]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return Reconstruction.file_stems(SimpleNamespace(names=names))  # it reads nothing but the names
