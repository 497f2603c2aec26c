"""Progress bars for long work (tqdm), with one rule for when they show.

`progress=None` (the library's default) shows a bar only when stderr is a terminal, so an
interactive `model.inference_streaming(...)` shows how far it got while logs, pipes and CI
stay clean; True always shows one, False never. The CLI passes True unless `--quiet`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]


def progress_bar(total: int | None, *, desc: str, unit: str = "frame", progress: bool | None = None,
                 initial: int = 0) -> Any:
    """A tqdm bar (a context manager; `.update(n)`, `.set_postfix_str(s)`); silent when
    `progress` is False, or None and stderr is not a terminal."""
    from tqdm.auto import tqdm

    # tqdm's own `disable=None` is the terminal rule.
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, disable=None if progress is None else not progress)
