"""A job on a local Ray instance of two CPU workers: a dozen inputs with a corrupt one, each
folder as a single run writes it, and a worker that dies mid-job."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from fleet_helpers import assert_same_run, corrupt, options, scenes, solo
from mapstream.fleet import JOB_RECORD, JobOptions, run_many

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'mapstream[ray]')")


@pytest.fixture(scope="module")
def local_ray():
    from ray import cloudpickle

    # The hooks below are sent to the workers by value: the workers cannot import this file.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


class DieOn:
    """A worker hook: the worker's process ends (as if killed) before each attempt at ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, item, attempt: int) -> None:
        if item.name == self.name:
            os._exit(1)


def test_a_dozen_inputs_on_two_workers_are_written_as_single_runs(local_ray, tmp_path):
    good = scenes(tmp_path / "data", 11)
    corrupt(tmp_path / "data")
    opts = options(tmp_path / "job")
    summary = run_many([str(tmp_path / "data" / "*" / "rgb")], opts,
                       job=JobOptions(ray=True, workers=2, retries=1), progress=False)

    names = [f"s{i:02d}" for i in range(11)]
    assert [r.name for r in summary.results] == ["bad", *names]  # the glob's order
    assert (summary.backend, summary.workers) == ("ray", 2)
    bad, *done = summary.results
    assert (bad.status, bad.attempts) == ("failed", 2) and "cannot read image" in bad.error
    assert [(r.status, r.attempts, r.frames) for r in done] == [("done", 1, 3)] * 11
    record = json.loads((tmp_path / "job" / JOB_RECORD).read_text())
    assert record == json.loads(json.dumps(summary.to_dict()))
    assert (record["inputs"], record["done"], record["failed"], record["frames"]) == (12, 11, 1, 33)

    torch.set_num_threads(1)  # as each worker runs: one CPU each
    for folder, name in zip(good, names):
        assert_same_run(tmp_path / "job" / name, solo(folder, tmp_path / "solo" / name, opts))


def test_a_worker_that_dies_loses_no_finished_input_and_a_rerun_completes_the_job(local_ray, tmp_path):
    scenes(tmp_path / "data", 4)
    opts = options(tmp_path / "job")
    inputs = [str(tmp_path / "data" / "*" / "rgb")]
    first = run_many(inputs, opts, job=JobOptions(ray=True, workers=2, retries=1), progress=False,
                     before_input=DieOn("s01"))
    assert [(r.name, r.status, r.attempts) for r in first.results] == [
        ("s00", "done", 1), ("s01", "failed", 2), ("s02", "done", 1), ("s03", "done", 1)]
    assert first.results[1].error.startswith("the worker died")
    finished = {n: os.stat(tmp_path / "job" / n / "run.json").st_mtime_ns for n in ("s00", "s02", "s03")}

    again = run_many(inputs, opts, job=JobOptions(ray=True, workers=2), progress=False)
    assert [(r.name, r.status) for r in again.results] == [
        ("s00", "finished_before"), ("s01", "done"), ("s02", "finished_before"), ("s03", "finished_before")]
    assert again.workers == 1  # one input left: one actor
    assert finished == {n: os.stat(tmp_path / "job" / n / "run.json").st_mtime_ns for n in finished}
    assert json.loads((tmp_path / "job" / JOB_RECORD).read_text())["failed"] == 0


def test_a_ray_worker_matches_a_run_here_of_its_thread_count_and_no_other(local_ray, tmp_path):
    """The cause of the Ray and in-process backends' differences on the CPU: a worker runs
    torch with --ray-cpus-per-worker threads, a run here with torch's own count, and the CPU
    kernels split their sums by thread count. With the same count the folders are equal, bit
    for bit; with another the arrays differ by float rounding only."""
    import numpy as np

    (folder,) = scenes(tmp_path / "data", 1)
    opts = options(tmp_path / "ray")
    summary = run_many([str(folder)], opts, job=JobOptions(ray=True, workers=1, cpus_per_worker=2), progress=False)
    assert [r.status for r in summary.results] == ["done"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_same_run(tmp_path / "ray" / "rgb", solo(folder, tmp_path / "two", opts))
        torch.set_num_threads(1)
        one = solo(folder, tmp_path / "one", opts)
    finally:
        torch.set_num_threads(threads)
    a, b = (np.load(f / "predictions.npz") for f in (tmp_path / "two", one))
    gap = max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in ("depth", "T_world_cam", "pose_enc"))
    assert 0 < gap < 1e-4
