"""Progress bars for long work (tqdm), with one rule for when they show.

`progress=None` (the library's default) shows a bar only when stderr is a terminal, so an
interactive `model.inference_streaming(...)` shows how far it got while logs, pipes and CI
stay clean; True always shows one, False never. The CLI follows the same rule: bars on a
terminal, or where `--no-quiet` asks for them; none with `--quiet` (`mapstream.cli.main`).
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar", "stderr_is_terminal"]


def stderr_is_terminal() -> bool:
    """Whether stderr, where bars are drawn, is a terminal (not a file, a pipe, or closed)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def progress_bar(total: int | None, *, desc: str, unit: str = "frame", progress: bool | None = None,
                 initial: int = 0) -> Any:
    """A tqdm bar (a context manager; `.update(n)`, `.set_postfix_str(s)`); silent when
    `progress` is False, or None and stderr is not a terminal."""
    from tqdm.auto import tqdm

    # tqdm's own `disable=None` is the terminal rule.
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, disable=None if progress is None else not progress)
