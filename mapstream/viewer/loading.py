"""Find and read a run's ``predictions.npz`` with errors that say what is wrong, and the warnings its
folder's records call for (a run that did not finish, untrained weights: :mod:`mapstream.viewer.run_notes`)."""
from __future__ import annotations

import json
import logging
import os
import zipfile
from pathlib import Path

from mapstream.export import Reconstruction
from mapstream.viewer.run_notes import PREDICTIONS_NAME, frames_named, read_run_notes

logger = logging.getLogger(__name__)

__all__ = ["PREDICTIONS_NAME", "load_run", "predictions_path", "run_warnings"]


def predictions_path(run: str | os.PathLike[str]) -> Path:
    """``run/predictions.npz`` for a run folder, or ``run`` itself when it is an ``.npz`` file.

    Raises:
        FileNotFoundError: the folder or the predictions file does not exist.
    """
    path = Path(run)
    if path.is_file() and path.suffix == ".npz":
        return path
    if not path.exists():
        raise FileNotFoundError(f"run folder {path} does not exist")
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a run folder nor a .npz file")
    candidate = path / PREDICTIONS_NAME
    if not candidate.is_file():
        raise FileNotFoundError(_why_no_predictions(path, candidate))
    return candidate


def _why_no_predictions(folder: Path, candidate: Path) -> str:
    """What a run folder without predictions.npz is, from what the run left: a finished run's
    run.json (written last, without a ``state``) lists its outputs; frames kept in
    progress.json without one mean the run stopped before its exports."""
    try:
        info = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict) and "state" not in info and isinstance(info.get("outputs"), dict):
        return (f"{candidate} not found: the run in {folder} did not write it (its outputs: "
                f"{', '.join(map(str, info['outputs'])) or 'none'}); run it again with npz among --formats")
    if (folder / "progress.json").is_file():  # `pipeline.frame_store`: frames kept, no finished export
        return (f"{candidate} not found: the run in {folder} stopped before writing its outputs; "
                "run the same `mapstream run` command again to resume and finish it")
    return f"{candidate} not found: is {folder} the --out folder of `mapstream run`?"


def run_warnings(run: str | os.PathLike[str], recon: Reconstruction) -> tuple[str, ...]:
    """What the records of run folder ``run`` (or of its ``predictions.npz`` path) say about
    ``recon``, read from there: that a run into it did not finish (with the frames ``recon``
    holds) and which weights made it when they were untrained or mapstream's small model
    (:func:`~mapstream.viewer.run_notes.read_run_notes`)."""
    notes = read_run_notes(run)
    npz = Path(run) if Path(run).suffix == ".npz" else Path(run) / PREDICTIONS_NAME
    unfinished = () if notes.unfinished is None else (f"{notes.unfinished} {npz} holds {frames_named(recon.names)}.",)
    return (*unfinished, *(() if notes.weights is None else (notes.weights,)))


def load_run(run: str | os.PathLike[str], *, log_notes: bool = True) -> Reconstruction:
    """The :class:`Reconstruction` saved in a run folder (or a ``predictions.npz`` path). With
    ``log_notes``, :func:`run_warnings` (a run that did not finish, which weights) are logged
    as warnings.

    Raises:
        FileNotFoundError: see :func:`predictions_path`.
        ValueError: the file is not a readable mapstream predictions file (corrupt or truncated
            zip, missing keys, inconsistent shapes).
    """
    path = predictions_path(run)
    if not os.access(path, os.R_OK):
        raise ValueError(f"cannot read {path}: permission denied")
    try:
        if not zipfile.is_zipfile(path):
            raise zipfile.BadZipFile("not a zip archive")
        recon = Reconstruction.load_npz(path)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a valid mapstream predictions file: {err}") from err
    except (zipfile.BadZipFile, EOFError, OSError, KeyError) as err:
        raise ValueError(f"{path} is corrupt or truncated ({type(err).__name__}: {err})") from err
    logger.info("loaded %s: %d frames of %dx%d", path, len(recon), recon.image_hw[1], recon.image_hw[0])
    for warning in run_warnings(path, recon) if log_notes else ():
        logger.warning("%s", warning)
    return recon
