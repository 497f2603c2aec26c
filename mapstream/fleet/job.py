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
from ..pipeline.options import recorded_options
from ..pipeline.run_folder import RUN_RECORD
from .inputs import JOB_RECORD, JobInput, expand_inputs
from .options import JobOptions
from .tracker import Tracker
from .worker import BeforeInput, InputResult

__all__ = ["JobOptions", "JobSummary", "Tracker", "input_options", "run_many"]

log = logging.getLogger(__name__)


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
    if info["config"].get("options") != recorded_options(opts):
        return None
    frames = info.get("frames")
    return InputResult("", str(opts.input), str(opts.out), "finished_before", frames if isinstance(frames, int) else 0)


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
