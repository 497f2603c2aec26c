"""A job without Ray: its inputs one after another in this process, with one model."""
from __future__ import annotations

import logging

from .tracker import Tracker
from .worker import BeforeInput, ModelHolder, run_input

__all__ = ["run_here"]

log = logging.getLogger(__name__)


def run_here(tracker: Tracker, before_input: BeforeInput | None = None) -> int:
    """Run the tracker's inputs here, each until it succeeds or runs out of attempts. An
    interrupt (Ctrl-C) or an exit stops the job: the input's folder keeps its finished
    frames for a rerun. Returns the workers used (one)."""
    holder = ModelHolder()
    try:
        for item, opts in tracker.todo:
            attempt = 1
            while True:
                try:
                    result = run_input(item, opts, holder, attempt, before_input)
                except Exception as err:  # noqa: BLE001 - any failure of one input is that input's, told in the summary
                    if tracker.failed(item, attempt, f"{type(err).__name__}: {err}"):
                        attempt += 1
                        continue
                    break
                tracker.succeeded(result)
                break
    finally:
        holder.close()
    return 1
