"""Atomic file writes: write to a temp file in the destination folder, then ``os.replace``.

A reader (or a resumed run) therefore sees either the complete old file or the complete new
one, never a partial file: if writing fails, the temp file is deleted and an existing file at
the destination is left untouched. The temp file lives in the same folder as the destination
(``os.replace`` is only atomic within one file system) and keeps the destination's suffix, so
libraries that pick the format from the extension (PIL, matplotlib, trimesh) still work:

    with atomic_path("out/summary.png") as tmp:     # tmp = out/.summary.png.tmp-1a2b3c4d.png
        figure.savefig(tmp)
    with atomic_open("out/trajectory.txt", "w") as f:
        f.write(...)
    atomic_write_text("out/run.json", text)

A process killed mid-write (SIGKILL, power loss) can leave a hidden ``.<name>.tmp-*`` file;
:func:`remove_stale_temp_files` deletes them (e.g. when resuming into an output folder).
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal

logger = logging.getLogger(__name__)

__all__ = [
    "atomic_open",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "prepare_dir",
    "remove_stale_temp_files",
    "temp_file_target",
]

_TEMP_MARKER = ".tmp-"


def prepare_dir(folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` (and its parents) if needed and check that files can be created in it.

    Raises:
        PermissionError: the folder cannot be created or written to; the message names it.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        raise PermissionError(
            f"cannot create output folder {folder}: a path component is an existing file ({error})"
        ) from error
    except OSError as error:
        raise PermissionError(f"cannot create output folder {folder}: {error.strerror or error}") from error
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"output folder {folder} is not writable")
    return folder


def _temp_sibling(path: Path) -> Path:
    """A fresh, exclusively created, empty temp file next to ``path`` with the same suffix."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}{_TEMP_MARKER}{secrets.token_hex(4)}{path.suffix}")
        try:
            # 0o666 minus the umask, like a normally created file (mkstemp would give 0o600).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as error:
            raise PermissionError(f"cannot write in output folder {path.parent}: {error.strerror or error}") from error
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temp file next to {path}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temp path to write; on normal exit it is moved onto ``path`` atomically.

    The destination folder is created if needed. If the body raises, the temp file is removed,
    ``path`` is left as it was (absent, or the previous complete file) and the error propagates.

    Args:
        path: final destination.
        fsync: flush the temp file to disk before the rename (survives a power loss).

    Yields:
        The temp file path (same folder and suffix as ``path``; it exists, empty).
    """
    path = Path(path)
    prepare_dir(path.parent)
    tmp = _temp_sibling(path)
    try:
        mode = stat.S_IMODE(tmp.stat().st_mode)
        yield tmp
        if stat.S_IMODE(tmp.stat().st_mode) != mode:
            # A writer that replaced the temp file with its own (safetensors makes them
            # private, 0o600): the result gets a new file's permissions all the same.
            os.chmod(tmp, mode)
        if fsync:
            _fsync_file(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            # A full disk or a failing device reports no file: name the one being written.
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.debug("wrote %s", path)


@contextmanager
def atomic_open(
    path: str | os.PathLike[str],
    mode: Literal["w", "wb"] = "w",
    *,
    encoding: str = "utf-8",
    fsync: bool = True,
) -> Iterator[IO]:
    """Open a temp file for writing (text ``"w"``, UTF-8 with ``\\n`` newlines, or ``"wb"``);
    it replaces ``path`` atomically when the block ends without an error (see :func:`atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path, fsync=fsync) as tmp:
        if mode == "w":
            with open(tmp, "w", encoding=encoding, newline="\n") as handle:
                yield handle
        else:
            with open(tmp, "wb") as handle:
                yield handle


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``Path(path)``."""
    with atomic_open(path, "wb", fsync=fsync) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``Path(path)``."""
    with atomic_open(path, "w", fsync=fsync) as handle:
        handle.write(text)
    return Path(path)


_TEMP_NAME = re.compile(rf"\.(?P<name>.+){re.escape(_TEMP_MARKER)}[0-9a-f]{{8}}(?P<suffix>.*)")


def temp_file_target(path: str | os.PathLike[str]) -> str | None:
    """The destination name of an atomic write's temp file ``.<name>.tmp-<8 hex><suffix of
    name>`` (see `atomic_path`), or None for any other name."""
    match = _TEMP_NAME.fullmatch(Path(path).name)
    if match is None or match["suffix"] != Path(match["name"]).suffix:
        return None
    return match["name"]


def remove_stale_temp_files(
    folder: str | os.PathLike[str], *, recursive: bool = True, targets: Callable[[str], bool] | None = None
) -> list[Path]:
    """Delete temp files left by interrupted atomic writes (``.<name>.tmp-<hex><suffix>``),
    only those whose destination name ``targets`` accepts when it is given.

    Only call this when no other process is writing such files into ``folder``. Returns the
    removed paths.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = f".*{_TEMP_MARKER}*"
    candidates = folder.rglob(pattern) if recursive else folder.glob(pattern)
    removed = []
    for path in candidates:
        target = temp_file_target(path)
        if target is not None and (targets is None or targets(target)) and path.is_file() and not path.is_symlink():
            removed.append(path)
    for stale in removed:
        stale.unlink(missing_ok=True)
        logger.info("removed stale temp file %s", stale)
    return removed
