"""A job on Ray: one actor a GPU (or CPU worker), each holding a model and running the inputs
it is handed one after another.

The driver keeps the queue: an idle actor gets the next input, `ray.wait` tells which attempt
ended first. A failed attempt goes back into the queue while it has attempts left; an actor
that died (its process killed, or the machine gone) is replaced by a fresh one, and the
attempt it was running counts as failed. Its input's folder keeps the frames it finished, so
the next attempt resumes them.
"""
from __future__ import annotations

import collections
import logging
from typing import Any

from .options import JobOptions
from .tracker import Tracker
from .worker import BeforeInput, ModelHolder, run_input

__all__ = ["run_on_ray"]

log = logging.getLogger(__name__)


class _Worker:
    """The actor's body: a model holder and torch threads matched to the actor's CPUs."""

    def __init__(self, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.holder = ModelHolder()

    def run(self, item, opts, attempt, before_input):
        return run_input(item, opts, self.holder, attempt, before_input)


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise RuntimeError("running on Ray needs Ray: pip install 'mapstream[ray]'") from err
    return ray


def run_on_ray(tracker: Tracker, job: JobOptions, before_input: BeforeInput | None = None) -> int:
    """Run the tracker's inputs on Ray (joined at ``job.ray_address``, or already initialised
    by the caller, or a local instance started here and shut down after). Returns the number
    of actors."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=job.ray_address, include_dashboard=False, log_to_driver=True)
    try:
        return _run(ray, tracker, job, before_input)
    finally:
        if started_here:
            ray.shutdown()


def _actor_class(ray, job: JobOptions, device: str) -> tuple[Any, int]:
    """The actor class with its resources, and how many actors the job takes: one a GPU of the
    cluster when the run may use one, else one (or ``job.workers``)."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    on_gpu = gpus > 0 and not device.startswith("cpu")
    count = job.workers or (gpus if on_gpu else 1)
    # An actor holds its resources for its life: one the cluster cannot place would never run.
    room = gpus if on_gpu else int(resources.get("CPU", 0)) // job.cpus_per_worker
    if count > room:
        log.warning("the Ray cluster has room for %d workers of this size, not %d: taking %d", room, count,
                    max(room, 1))
        count = max(room, 1)
    options = {"num_cpus": job.cpus_per_worker, "num_gpus": 1 if on_gpu else 0, "max_restarts": 0}
    log.info("%d Ray workers, each with %d CPU%s%s", count, job.cpus_per_worker,
             "" if job.cpus_per_worker == 1 else "s", " and one GPU" if on_gpu else "")
    return ray.remote(_Worker).options(**options), count


def _run(ray, tracker: Tracker, job: JobOptions, before_input: BeforeInput | None) -> int:
    device = tracker.todo[0][1].device
    Actor, count = _actor_class(ray, job, device)
    count = min(count, len(tracker.todo))
    idle = [Actor.remote(job.cpus_per_worker) for _ in range(count)]
    made = list(idle)
    queue = collections.deque((item, opts, 1) for item, opts in tracker.todo)
    running: dict[Any, tuple[Any, Any, Any, int]] = {}
    try:
        while queue or running:
            while idle and queue:
                actor = idle.pop()
                item, opts, attempt = queue.popleft()
                running[actor.run.remote(item, opts, attempt, before_input)] = (actor, item, opts, attempt)
            (ref,), _ = ray.wait(list(running), num_returns=1)
            actor, item, opts, attempt = running.pop(ref)
            try:
                tracker.succeeded(ray.get(ref))
                idle.append(actor)
                continue
            except ray.exceptions.RayActorError as err:
                error = f"the worker died: {_first_line(err)}"
                ray.kill(actor)
                idle.append(Actor.remote(job.cpus_per_worker))
                made.append(idle[-1])
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if err.cause is not None else err
                error = f"{type(cause).__name__}: {cause}"
                idle.append(actor)
            except ray.exceptions.RayError as err:  # the result lost on the way (a node gone), say
                error = f"{type(err).__name__}: {_first_line(err)}"
                idle.append(actor)
            if tracker.failed(item, attempt, error):
                queue.append((item, opts, attempt + 1))
    finally:
        # The actors go with the job, also when it is interrupted: a caller's Ray keeps running
        # without them, and the folders of unfinished inputs keep their frames for a rerun.
        for actor in made:
            ray.kill(actor)
    return count


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
