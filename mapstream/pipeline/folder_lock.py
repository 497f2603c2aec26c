"""One writer at a time in an output folder: an advisory lock on ``<folder>/.lock``.

`mapstream run` and `mapstream export` both hold it while they write, since two of them in
one folder would write the same files. A run that fails before writing anything removes the
lock file again (`RunFolder`), so taking the lock checks that the file locked is still the
one the name points at: a lock taken on a file unlinked meanwhile guards nothing.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "lock_run_folder"]

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
_ATTEMPTS = 5  # a lock file removed between opening and locking it: opened again


@contextlib.contextmanager
def lock_run_folder(out: Path) -> Iterator[None]:
    """Hold ``out`` for one writer: another (process, or the same one) is refused with a
    RuntimeError naming the holder. Released when the block ends, even by a crash; on a
    system or file system without POSIX locks, writers are not guarded."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    path = Path(out) / LOCK_NAME
    for _ in range(_ATTEMPTS):
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise RuntimeError(
                    f"another mapstream run ({holder}) is writing to {out}; "
                    "wait for it to end or give another output folder"
                ) from None
            except OSError as err:  # a file system without locks (some network mounts)
                log.debug("cannot lock %s (%s); writers into it are not guarded against each other", out, err)
                yield
                return
            if not _still_named(path, handle.fileno()):
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}")
            handle.flush()
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
            return
    raise RuntimeError(f"could not lock {path}: it keeps being replaced; is another program removing it?")


def _still_named(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the open file ``fd`` (a holder that gave up may have
    removed it after this process opened it)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
