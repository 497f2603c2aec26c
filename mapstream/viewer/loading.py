"""Find and read a run's ``predictions.npz`` with errors that say what is wrong."""
from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path

from mapstream.export import Reconstruction

logger = logging.getLogger(__name__)

__all__ = ["PREDICTIONS_NAME", "load_run", "predictions_path"]

PREDICTIONS_NAME = "predictions.npz"


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
        if (path / "progress.json").is_file():  # `pipeline.frame_store`: frames kept, no export yet
            raise FileNotFoundError(
                f"{candidate} not found: the run in {path} stopped before writing its outputs; "
                "run the same `mapstream run` command again to resume and finish it"
            )
        raise FileNotFoundError(f"{candidate} not found: is {path} the --out folder of `mapstream run`?")
    return candidate


def load_run(run: str | os.PathLike[str]) -> Reconstruction:
    """The :class:`Reconstruction` saved in a run folder (or a ``predictions.npz`` path).

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
    return recon
