"""Where the page's path fields may write: the run's folder and the folders named on the
command line, nowhere else.

Whoever reaches the page (anyone on the network with ``--host 0.0.0.0``) can type a path into
the "GLB path", "PNG path" and "video path" fields. Without a bound that is a way to replace
any file the user can write. A typed path is therefore taken relative to the run's folder,
resolved (``..`` and every link followed, the last part too), and written only when it lies
inside one of :class:`ExportFolders` and is none of the run's own files (its inputs and outputs,
``protected``); otherwise the page says so and nothing is written.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = ["EXPORT_DIR_FLAG", "ExportFolders", "OutsideExportFolders", "RefusedPath", "RunOwnFile"]

EXPORT_DIR_FLAG = "--export-dir"
"""The ``mapstream view`` flag that adds a folder (named in the refusal)."""


class RefusedPath(ValueError):
    """A path typed into the page that the viewer does not write."""


class OutsideExportFolders(RefusedPath):
    """A path typed into the page lies outside the folders the viewer may write to."""


class RunOwnFile(RefusedPath):
    """A path typed into the page names one of the run's own inputs or outputs."""


class ExportFolders:
    """The folders the page may write into: ``folders[0]`` (the run's folder) is where
    relative paths start; the others are further folders the user named. ``protected`` says
    whether a path (links followed) is one of the run's own inputs or outputs, never written
    (`mapstream.pipeline.own_files.run_own_files(...).owns`)."""

    def __init__(
        self, folders: Iterable[str | os.PathLike[str]], protected: Callable[[Path], bool] | None = None
    ) -> None:
        self.protected = protected
        self.folders: Sequence[Path] = tuple(dict.fromkeys(Path(f).expanduser().absolute() for f in folders))
        if not self.folders:
            raise ValueError("the viewer needs at least one folder to write its exports to")
        for folder in self.folders:
            if folder.exists() and not folder.is_dir():
                raise ValueError(f"{folder} is a file, not a folder; give a folder for the viewer's exports")

    @property
    def base(self) -> Path:
        """Where relative paths start: the run's folder."""
        return self.folders[0]

    def default(self, name: str) -> str:
        """A field's initial value: ``name`` in :attr:`base`."""
        return str(self.base / name)

    def place(self, typed: str) -> Path:
        """The file that the path ``typed`` in the page names (relative to :attr:`base`), made
        absolute without following links, once checked to lie inside one of the folders
        with every link followed, and to be none of the run's own files.

        Raises:
            OutsideExportFolders: it does not lie inside; the message names the folders allowed.
            RunOwnFile: it is one of the run's inputs or outputs.
        """
        target = Path(os.path.normpath(self.base / Path(typed.strip()).expanduser()))
        real = os.path.realpath(target)
        for folder in self.folders:
            root = os.path.realpath(folder)
            if real != root and os.path.commonpath([real, root]) == root:
                if self.protected is not None and self.protected(Path(real)):
                    raise RunOwnFile(
                        f"`{typed.strip()}` is one of the run's own inputs or outputs, which the viewer never "
                        "writes over; type a new file name (e.g. view.glb)"
                    )
                return target
        shown = ", ".join(str(f) for f in self.folders)
        raise OutsideExportFolders(
            f"`{typed.strip()}` is outside the folders this viewer writes to ({shown}); type a path inside "
            f"{'it' if len(self.folders) == 1 else 'one of them'}, or start `mapstream view` with "
            f"{EXPORT_DIR_FLAG} FOLDER to allow another"
        )
