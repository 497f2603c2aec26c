"""A job over many inputs: which inputs still need a run, retries, progress and the summary.

`run_many` expands the inputs (`inputs.expand_inputs`), leaves out those whose folder holds a
finished run of the same settings, hands the rest to an executor (`local` without Ray,
`ray_backend` with it) and writes the job's summary, ``job.json``, atomically into the job's
output folder. Each input's folder is written by `mapstream.pipeline.run` itself, which
resumes an interrupted one, so a rerun of the job completes what an earlier one left.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..export import write_run_json
from ..pipeline import RunOptions
from ..pipeline.run_folder import RUN_RECORD
from ..progress import progress_bar
from .inputs import JOB_RECORD, JobInput, expand_inputs
from .worker import BeforeInput, InputResult

__all__ = ["JobOptions", "JobSummary", "Tracker", "input_options", "run_many"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOptions:
    """How a job runs. ``ray``: on Ray (a local instance unless ``ray_address`` names a
    running cluster, which also implies Ray); ``workers``: Ray actors (default: one per GPU of
    the cluster, else one), or ignored without Ray; ``cpus_per_worker``: CPU cores an actor
    takes and its torch threads; ``retries``: further attempts at a failed input."""

    ray: bool = False
    ray_address: str | None = None
    workers: int | None = None
    cpus_per_worker: int = 1
    retries: int = 2

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.cpus_per_worker < 1:
            raise ValueError(f"cpus_per_worker must be >= 1, got {self.cpus_per_worker}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    @property
    def uses_ray(self) -> bool:
        return self.ray or self.ray_address is not None


@dataclass(frozen=True)
class JobSummary:
    """What a job did: one result an input, in the inputs' order, and the job's totals."""

    out: Path
    results: tuple[InputResult, ...]
    seconds: float
    backend: str
    workers: int

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def failed(self) -> list[InputResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.results)

    @property
    def new_frames(self) -> int:
        return sum(r.new_frames for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": len(self.results), "done": self.count("done"), "finished_before": self.count("finished_before"),
            "failed": self.count("failed"), "not_run": self.count("not_run"), "frames": self.frames,
            "new_frames": self.new_frames,
            "seconds": self.seconds, "fps": self.new_frames / max(self.seconds, 1e-9), "backend": self.backend,
            "workers": self.workers, "results": [asdict(r) for r in self.results],
        }


def input_options(options: RunOptions, item: JobInput) -> RunOptions:
    """The options of one input's run: the job's, with its input and its folder."""
    return replace(options, input=item.input, out=item.out, demo=False)


def finished_before(opts: RunOptions) -> InputResult | None:
    """The result of a finished run in ``opts.out`` whose recorded options are these ones, if
    there is one (its run.json has no ``state`` and records the same options as a run of
    ``opts`` would): such an input needs no run."""
    try:
        info = json.loads((Path(opts.out) / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or "state" in info or not isinstance(info.get("config"), dict):
        return None
    options = {**asdict(opts), **asdict(opts.stream)}
    options.pop("stream")
    if info["config"].get("options") != {k: str(v) for k, v in options.items()}:
        return None
    frames = info.get("frames")
    return InputResult("", str(opts.input), str(opts.out), "finished_before", frames if isinstance(frames, int) else 0)


class Tracker:
    """The job's bookkeeping, which executors report to: attempts, retries, results and the
    one progress bar (inputs done, frames, frames per second)."""

    def __init__(self, todo: Sequence[tuple[JobInput, RunOptions]], retries: int, total: int, initial: int,
                 progress: bool | None) -> None:
        self.todo = list(todo)
        self.retries = retries
        self.results: dict[str, InputResult] = {}
        self._started = time.perf_counter()
        self._frames = 0
        self._bar = progress_bar(total=total, desc="inputs", unit="input", initial=initial, progress=progress)

    def succeeded(self, result: InputResult) -> None:
        self.results[result.name] = result
        self._frames += result.new_frames
        log.info("%s: %d frames in %.1f s (attempt %d)", result.name, result.frames, result.seconds, result.attempts)
        self._advance()

    def failed(self, item: JobInput, attempt: int, error: str) -> bool:
        """Record a failed attempt; returns whether the input is tried again."""
        if attempt <= self.retries:
            log.warning("%s failed (attempt %d of %d), trying again: %s", item.name, attempt, self.retries + 1, error)
            return True
        log.error("%s failed after %d attempts: %s", item.name, attempt, error)
        self.results[item.name] = InputResult(item.name, item.input, str(item.out), "failed", attempts=attempt,
                                              error=error)
        self._advance()
        return False

    def _advance(self) -> None:
        elapsed = time.perf_counter() - self._started
        failed = sum(r.status == "failed" for r in self.results.values())
        self._bar.set_postfix_str(f"{self._frames} frames, {self._frames / max(elapsed, 1e-9):.2f} FPS, "
                                  f"{failed} failed")
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def run_many(inputs: Sequence[str], options: RunOptions, ray_address: str | None = None, workers: int | None = None,
             *, ray: bool | None = None, job: JobOptions | None = None, progress: bool | None = None,
             before_input: BeforeInput | None = None) -> JobSummary:
    """Run ``options`` (a `RunOptions` whose ``out`` is the job's folder) on each of
    ``inputs`` (paths, globs, ``.txt`` lists: `expand_inputs`), one folder each under
    ``options.out``, and write ``job.json`` there. On Ray when ``ray`` is true or
    ``ray_address`` is given (``job`` sets everything at once); else one input after another
    here. A failed input is tried again ``retries`` times, then reported, and the job goes on.
    ``before_input``: a hook the worker calls before each attempt (for tests)."""
    if job is None:
        job = JobOptions(ray=bool(ray), ray_address=ray_address, workers=workers)
    elif ray is not None or ray_address is not None or workers is not None:
        raise ValueError("give ray, ray_address and workers either in job or as arguments, not both")
    if options.demo:
        raise ValueError("--demo renders one sequence of its own: give the inputs instead")
    root = Path(options.out)
    items = expand_inputs(inputs, root)
    planned = [(item, input_options(options, item)) for item in items]
    from ..pipeline import check_options

    for _, opts in planned:  # every input's options and paths checked before any run starts
        check_options(opts)
    started = time.perf_counter()
    before: dict[str, InputResult] = {}
    for item, opts in planned:
        found = finished_before(opts)
        if found is not None:
            before[item.name] = replace(found, name=item.name, input=item.input)
    todo = [(item, opts) for item, opts in planned if item.name not in before]
    log.info("%d inputs: %d finished before, %d to run", len(items), len(before), len(todo))
    tracker = Tracker(todo, job.retries, total=len(items), initial=len(before), progress=progress)
    backend, used = ("ray" if job.uses_ray else "local") if todo else "none", 0
    try:
        if todo and job.uses_ray:
            from .ray_backend import run_on_ray

            used = run_on_ray(tracker, job, before_input)
        elif todo:
            from .local import run_here

            used = run_here(tracker, before_input)
    finally:
        # Also when the job is stopped (Ctrl-C): the summary then lists the inputs it did not reach.
        tracker.close()
        results = {**before, **tracker.results}
        summary = JobSummary(root, tuple(
            results.get(item.name) or InputResult(item.name, item.input, str(item.out), "not_run") for item in items
        ), time.perf_counter() - started, backend, used)
        root.mkdir(parents=True, exist_ok=True)
        write_run_json(summary.to_dict(), root / JOB_RECORD)
    return summary
