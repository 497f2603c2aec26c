"""A job without Ray: its inputs one after another here, each folder as a single run writes it;
retries, the summary, reruns that skip finished inputs and resume interrupted ones, the
command and `mapstream eval` over the job."""
from __future__ import annotations

import json
import os

import pytest

from fleet_helpers import assert_same_run, corrupt, options, scenes, solo
from mapstream.cli._fleet import format_job
from mapstream.cli.main import main
from mapstream.fleet import JOB_RECORD, JobOptions, run_many
from mapstream.pipeline import run


def test_each_input_is_written_as_its_own_run_and_a_corrupt_one_is_reported(tmp_path):
    good = scenes(tmp_path / "data", 2)
    bad = corrupt(tmp_path / "data")
    opts = options(tmp_path / "job")
    summary = run_many([str(good[0]), str(bad), str(good[1])], opts, job=JobOptions(retries=1), progress=False)

    assert [(r.name, r.status, r.attempts, r.frames) for r in summary.results] == [
        ("s00", "done", 1, 3, ), ("bad", "failed", 2, 0), ("s01", "done", 1, 3)]
    assert "cannot read image" in summary.results[1].error
    assert (summary.backend, summary.workers, summary.frames) == ("local", 1, 6)
    assert not (tmp_path / "job" / "bad").exists()  # a run that fails before its first frame leaves nothing
    for folder, name in zip(good, ["s00", "s01"]):
        assert_same_run(tmp_path / "job" / name, solo(folder, tmp_path / "solo" / name, opts))
    record = json.loads((tmp_path / "job" / JOB_RECORD).read_text())
    assert record == json.loads(json.dumps(summary.to_dict()))
    assert {k: record[k] for k in ("inputs", "done", "finished_before", "failed", "frames", "new_frames")} == {
        "inputs": 3, "done": 2, "finished_before": 0, "failed": 1, "frames": 6, "new_frames": 6}


def test_a_rerun_skips_finished_inputs_and_resumes_an_interrupted_one(tmp_path):
    one, two = scenes(tmp_path / "data", 2, frames=4)
    opts = options(tmp_path / "job")

    def stop_after_two(pred, frame, index):
        if index == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # s01 interrupted after two of its four frames
        run(options(tmp_path / "job" / "s01", input=str(two)), progress=False, on_frame=stop_after_two)
    first = run_many([str(tmp_path / "data" / "*" / "rgb")], opts, progress=False)
    assert [(r.name, r.status, r.frames, r.new_frames) for r in first.results] == [
        ("s00", "done", 4, 4), ("s01", "done", 4, 2)]

    records = {name: os.stat(tmp_path / "job" / name / "run.json").st_mtime_ns for name in ("s00", "s01")}
    again = run_many([str(tmp_path / "data" / "*" / "rgb")], opts, progress=False)
    assert [(r.name, r.status, r.frames, r.new_frames, r.attempts) for r in again.results] == [
        ("s00", "finished_before", 4, 0, 0), ("s01", "finished_before", 4, 0, 0)]
    assert (again.backend, again.workers) == ("none", 0)
    assert format_job(again).splitlines()[-1] == (
        "2 inputs: 0 run, 2 finished before, 0 failed; 8 frames, none new; nothing left to run")
    assert records == {name: os.stat(tmp_path / "job" / name / "run.json").st_mtime_ns for name in records}

    # Other settings are another job: every input runs again (its frames are kept, its outputs rewritten).
    other = run_many([str(tmp_path / "data" / "*" / "rgb")], options(tmp_path / "job", formats=("npz",)),
                     progress=False)
    assert [(r.status, r.new_frames) for r in other.results] == [("done", 0), ("done", 0)]
    assert not (tmp_path / "job" / "s00" / "trajectory_tum.txt").exists()


def test_the_command_runs_a_glob_of_inputs_and_eval_scores_them_at_once(tmp_path, capsys):
    scenes(tmp_path / "data", 2, frames=4)
    corrupt(tmp_path / "data")
    job = tmp_path / "job"
    code = main(["run", str(tmp_path / "data" / "*" / "rgb"), "--many", "--out", str(job), "--model", "tiny",
                 "--image-size", "42", "--num-scale-frames", "2", "--device", "cpu", "--formats", "npz", "tum",
                 "--retries", "0", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 1  # an input failed
    rows = {line.split()[0]: line.split()[1] for line in printed.splitlines()[1:4]}
    assert rows == {"bad": "failed", "s00": "done", "s01": "done"}
    assert "3 inputs: 2 run, 0 finished before, 1 failed; 8 frames (8 new)" in printed
    assert json.loads((job / JOB_RECORD).read_text())["failed"] == 1

    assert main(["eval", str(job), "--gt", str(tmp_path / "data"), "--out", str(tmp_path / "eval.json")]) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert sorted(report["scenes"]) == ["s00", "s01"]
    assert all(report["scenes"][s]["metrics"]["trajectory"] for s in ("s00", "s01"))
    assert report["aggregate"]


def test_the_command_refuses_a_glob_without_matches_and_the_demo_with_many_inputs(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none*"), "--many", "--out", str(tmp_path / "job"), "--model", "tiny"]) == 2
    assert "error: no input matches the glob" in capsys.readouterr().err
    assert main(["run", str(tmp_path), "--many", "--demo", "--out", str(tmp_path / "job"), "--model", "tiny"]) == 2
    assert "--view and --demo take one input" in capsys.readouterr().err
    assert not (tmp_path / "job").exists()


def test_the_flags_choose_one_run_or_a_job_and_its_options():
    from mapstream.cli._fleet import FleetFlags

    assert not FleetFlags().wanted(("frames",)) and not FleetFlags().wanted(("frames/*.jpg",))
    assert not FleetFlags().wanted(())  # --demo
    assert FleetFlags().wanted(("a", "b")) and FleetFlags().wanted(("inputs.txt",))
    assert FleetFlags(many=True).wanted(("data/*/rgb",)) and FleetFlags(ray=True).wanted(("a",))
    assert FleetFlags(ray_address="auto").wanted(("a",))
    flags = FleetFlags(ray_address="10.0.0.1:6379", ray_workers=3, ray_cpus_per_worker=2, retries=0)
    assert flags.job_options() == JobOptions(ray=False, ray_address="10.0.0.1:6379", workers=3, cpus_per_worker=2,
                                             retries=0)
    assert flags.job_options().uses_ray
    with pytest.raises(ValueError, match="workers must be >= 1"):
        JobOptions(workers=0)
    with pytest.raises(ValueError, match="retries must be >= 0"):
        JobOptions(retries=-1)


def test_the_api_refuses_the_demo_and_settings_given_twice(tmp_path):
    folder, = scenes(tmp_path / "data", 1)
    with pytest.raises(ValueError, match="--demo renders one sequence"):
        run_many([str(folder)], options(tmp_path / "job", demo=True))
    with pytest.raises(ValueError, match="not both"):
        run_many([str(folder)], options(tmp_path / "job"), workers=2, job=JobOptions())
    assert not (tmp_path / "job").exists()


def test_a_stopped_job_says_what_it_did_not_reach_and_a_rerun_completes_it(tmp_path):
    scenes(tmp_path / "data", 3)
    inputs = [str(tmp_path / "data" / "*" / "rgb")]

    def interrupt_at_s01(item, attempt):
        if item.name == "s01":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_many(inputs, options(tmp_path / "job"), progress=False, before_input=interrupt_at_s01)
    record = json.loads((tmp_path / "job" / JOB_RECORD).read_text())
    assert [(r["name"], r["status"]) for r in record["results"]] == [
        ("s00", "done"), ("s01", "not_run"), ("s02", "not_run")]
    assert (record["done"], record["not_run"]) == (1, 2)

    again = run_many(inputs, options(tmp_path / "job"), progress=False)
    assert [(r.name, r.status) for r in again.results] == [("s00", "finished_before"), ("s01", "done"), ("s02", "done")]


def test_a_worker_lends_one_session_to_its_inputs_and_each_starts_as_a_fresh_one(tmp_path):
    """The worker's session is reset and lent again to the next input with the same settings
    (its CUDA graphs are captured once); every input's folder still equals its single run, and
    other settings get a session of their own, at most two kept."""
    import dataclasses

    from mapstream import StreamConfig
    from mapstream.fleet.worker import ModelHolder

    folders = scenes(tmp_path / "data", 3)
    opts = options(tmp_path / "job")
    holder = ModelHolder()
    lent = []

    def opening(o, device, stream):
        opened = holder.open_session(o, device, stream)
        lent.append(opened.session._session)
        return opened

    def run_one(folder, out, **changes):
        run(dataclasses.replace(opts, input=str(folder), out=out, **changes), progress=False, open_session=opening)

    for i, folder in enumerate(folders[:2]):
        run_one(folder, tmp_path / "job" / f"s{i}")
    assert lent[0] is lent[1] and holder.idle_sessions == 1
    assert lent[0].frames_processed == 0 and lent[0].in_scale_phase  # given back reset
    for i, folder in enumerate(folders[:2]):
        assert_same_run(tmp_path / "job" / f"s{i}", solo(folder, tmp_path / "solo" / f"s{i}", opts))
    for scale, name in ((1, "one"), (3, "three")):
        run_one(folders[2], tmp_path / "job" / name, stream=StreamConfig(num_scale_frames=scale))
    assert len({id(s) for s in lent}) == 3 and holder.idle_sessions == 2  # the oldest setting's went
    holder.close()
    assert holder.idle_sessions == 0


def test_a_job_plans_each_input_as_a_single_run_of_its_weights(tmp_path):
    """Weights that record a width (28) and a training clip length (4): each input of a job is
    fed frames of that width and, being longer than 4 frames, runs in windows of 4 stored
    frames (`--mode auto`), exactly as a single run of it."""
    import mapstream
    from safetensors.torch import save_file

    weights = tmp_path / "recorded.safetensors"
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny"))
    save_file(dict(model.state_dict()), str(weights),
              metadata={"preset": "tiny", "image_size": "28", "trained_views": "4"})
    good = scenes(tmp_path / "data", 2, frames=6)
    opts = options(tmp_path / "job", model=str(weights), image_size=None,
                   stream=mapstream.StreamConfig(num_scale_frames=2, overlap=1))
    summary = run_many([str(folder) for folder in good], opts, progress=False)
    assert [(r.status, r.frames) for r in summary.results] == [("done", 6), ("done", 6)]
    for folder, name in zip(good, ["s00", "s01"]):
        config = json.loads((tmp_path / "job" / name / "run.json").read_text())["config"]
        assert (config["image_size"], config["mode"], config["window_size"]) == (28, "windowed", 4)
        assert_same_run(tmp_path / "job" / name, solo(folder, tmp_path / "solo" / name, opts))
