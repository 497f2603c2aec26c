"""The maintained benchmarks (benchmarks/*.py) on a CPU at small sizes: each runs end to end
and its result holds what it claims. Their timings need the GPU; here only the mechanism and
the checks they report are tested."""
from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mapstream
from conftest import ScriptedPowerReadings

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SMALL = ["--device", "cpu", "--preset", "tiny", "--size", "56x42", "--scale-frames", "2"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multistream_gives_every_stream_the_same_predictions_batched_or_not(tmp_path):
    out = tmp_path / "multistream.json"
    result = _load("multistream").main(SMALL + ["--streams", "2", "--frames", "8", "--out", str(out)])
    assert result["streams"] == 2 and result["size"] == [56, 42]
    assert result["one_after_another"]["fast_path"] is False  # no CUDA graphs on a CPU
    assert result["all_finite"]
    assert result["depth_rel_err_max"] < 1e-5 and result["pose_enc_rel_err_max"] < 1e-5
    for way in ("one_after_another", "step_together"):
        timing = result[way]
        assert timing["stream_frames_per_s"] == pytest.approx(2 * 1e3 / timing["median_ms_per_round"])
    assert json.loads(out.read_text())["depth_rel_err_max"] == result["depth_rel_err_max"]


def test_multistream_graphed_also_times_the_batched_fast_step_with_the_same_predictions(tmp_path):
    out = tmp_path / "multistream.json"
    result = _load("multistream").main(SMALL + ["--streams", "2", "--frames", "9", "--graphed", "--out", str(out)])
    graphed = result["step_together_graphed"]
    assert graphed["all_finite"]
    assert graphed["depth_rel_err_max"] < 1e-5 and graphed["pose_enc_rel_err_max"] < 1e-5
    assert graphed["stream_frames_per_s"] == pytest.approx(2 * 1e3 / graphed["median_ms_per_round"])
    assert json.loads(out.read_text())["step_together_graphed"] == graphed
    assert "step_together_graphed" not in _load("multistream").main(SMALL + ["--streams", "2", "--frames", "7"])


def test_multistream_skip_eager_times_only_the_solo_and_graphed_steps_and_needs_graphed():
    result = _load("multistream").main(SMALL + ["--streams", "2", "--frames", "7", "--graphed", "--skip-eager"])
    assert "step_together" not in result and "depth_rel_err_max" not in result
    assert result["step_together_graphed"]["pose_enc_rel_err_max"] < 1e-5 and result["compiled"] is False
    with pytest.raises(SystemExit):
        _load("multistream").main(SMALL + ["--streams", "2", "--frames", "7", "--skip-eager"])


def test_multistream_gives_each_pass_its_energy_a_stream_frame_over_the_steady_rounds(monkeypatch):
    module = _load("multistream")
    # 40 J over the steady rounds 6 and 7 of each pass, the second capped by power
    monkeypatch.setattr(module, "open_reader", lambda device: ScriptedPowerReadings(
        energy_mj=[5_000, 45_000], mhz=[1800, 1900], reasons=[0x0, 0x4]))
    result = module.main(SMALL + ["--streams", "2", "--frames", "8"])
    for way in ("one_after_another", "step_together"):
        power = result[way]["gpu_power"]
        assert power["frames"] == 2 and power["J_per_frame"] == 20.0 and power["J_per_stream_frame"] == 10.0
        assert power["capped_frames"] == 0.5 and power["sm_mhz"]["mean"] == 1850
    monkeypatch.setattr(module, "open_reader", lambda device: None)  # no NVML (a CPU): no readings
    assert _load("multistream").main(SMALL + ["--streams", "2", "--frames", "7"])["step_together"]["gpu_power"] is None


def test_multistream_takes_its_median_from_the_asked_frame_on_and_refuses_one_before_the_warm_up(monkeypatch):
    module = _load("multistream")

    def clock():  # each pass of 10 rounds: rounds 0-7 take 9 s, rounds 8 and 9 take 1 s
        now = 0.0
        while True:
            for round_ in range(10):
                yield now
                now += 9.0 if round_ < 8 else 1.0
                yield now

    ticks = clock()
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(ticks))
    result = module.main(SMALL + ["--streams", "2", "--frames", "10", "--steady-from", "8"])
    assert result["steady_from"] == 8
    assert result["one_after_another"]["median_ms_per_round"] == 1e3
    assert result["step_together"]["median_ms_per_round"] == 1e3
    for bad in ("5", "10"):  # before the scale phase and 4 warm-up steps end; no round left to time
        with pytest.raises(SystemExit):
            module.main(SMALL + ["--streams", "2", "--frames", "10", "--steady-from", bad])


def test_multistream_streams_with_fp8_caches_when_asked_and_batched_equals_one_after_another():
    result = _load("multistream").main(SMALL + ["--streams", "2", "--frames", "8", "--kv-dtype", "fp8"])
    assert result["kv_dtype"] == "fp8" and result["all_finite"]
    assert result["depth_rel_err_max"] < 1e-5 and result["pose_enc_rel_err_max"] < 1e-5
    with pytest.raises(SystemExit):
        _load("multistream").main(SMALL + ["--kv-dtype", "int4"])


def test_multistream_refuses_too_few_frames_for_a_steady_median():
    with pytest.raises(SystemExit):
        _load("multistream").main(SMALL + ["--frames", "6"])  # 2 scale + 4 warm-up steps leave none


def test_long_run_memory_keeps_the_cache_bytes_flat_while_the_trajectory_grows(tmp_path):
    out = tmp_path / "memory.json"
    result = _load("long_run_memory").main(SMALL + ["--window", "3", "--frames", "24", "--every", "4", "--out", str(out)])
    marks = result["marks"]
    assert [m["frame"] for m in marks] == [4, 8, 12, 16, 20, 24]
    assert result["flat_cache_bytes"] and len({m["cache_bytes"] for m in marks}) == 1
    # Once the window is full, every frame past scale + window lives in the trajectory.
    assert [m["window_frames"] for m in marks] == [2, 3, 3, 3, 3, 3]
    assert [m["trajectory_frames"] for m in marks] == [0, 3, 7, 11, 15, 19]
    assert result["trajectory_frames_max"] == 19
    assert "allocated" not in marks[0] and "flat_allocated" not in result  # GPU memory only on a GPU
    assert json.loads(out.read_text())["marks"] == marks


def test_fast_check_finds_the_fast_step_equal_to_the_eager_one_on_cpu():
    result = _load("fast_check").main(SMALL + ["--frames", "8"])
    check = result["check"]
    assert check["frames"] == 8 and check["finite"]
    assert max(check[name] for name in ("pose_enc", "depth", "depth_conf")) < 1e-5
    assert "bench" not in result  # the protocol's timing needs CUDA


def test_profile_step_sorts_operator_time_into_kinds():
    module = _load("profile_step")
    assert module.kind_of("void flash_fwd_kernel<...>") == "attention"
    assert module.kind_of("sm90_xmma_gemm_bf16") == "matmul"
    assert module.kind_of("aten::addmm") == "matmul"
    assert module.kind_of("cudnn::winograd") == "conv"
    assert module.kind_of("aten::native_layer_norm") == "norm"
    assert module.kind_of("aten::add_") == module.OTHER
    assert module.by_kind([("gemm", 1.0), ("aten::mul", 0.5), ("conv2d", 2.0), ("matmul", 0.25)]) == {
        "conv": 2.0, "matmul": 1.25, "elementwise/other": 0.5}
    result = module.main(SMALL + ["--frames", "8"])
    assert len(result["wall_ms_per_step"]) == module.TIMED_STEPS
    assert sum(result["by_kind_ms_per_step"].values()) == pytest.approx(result["kernel_ms_per_step"])
    assert result["kernel_ms_per_step"] > 0 and result["whole"] is False


def _event(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


# Two steps of two cache attentions each (µs); the second step's heads run on two streams.
ATTENTION = "_flash_fwd_balanced"
TRACE = [
    _event("patch", 0, 10), _event(ATTENTION, 20, 30), _event("gemm", 60, 10), _event(ATTENTION, 80, 30),
    _event("dpt", 120, 20),
    _event("patch", 1000, 10), _event(ATTENTION, 1020, 30), _event("gemm", 1060, 10), _event(ATTENTION, 1080, 30),
    _event("heads_gemm<float>(int)", 1115, 40, stream=8), _event("dpt", 1120, 20),
]


def test_trace_summary_splits_the_last_step_at_its_cache_attentions():
    s = _load("trace_summary").summarize(TRACE, layers=2, top=2)
    approx = lambda *values: pytest.approx(values, abs=1e-12)  # noqa: E731
    assert s["cycle"] == approx(1.0, 0.1)  # first attention to first attention; 100 µs of kernels in it
    assert s["step"] == approx(0.155, 0.14, 6)  # starts after the 860 µs idle gap
    assert s["before_first_attention"] == approx(0.01, 0.01, 1)
    assert s["trunk"] == approx(0.09, 0.07, 3)
    assert s["attention_kernels_ms"] == pytest.approx(0.06)
    assert s["heads"] == approx(0.04, 0.06, 2)
    assert s["heads_by_stream"]["8"] == approx(0.04, 0.04, 1, 0.005, 0.045)
    assert s["heads_by_stream"]["7"] == approx(0.02, 0.02, 1, 0.01, 0.03)
    assert s["top"] == [(ATTENTION, 0.06, 2), ("heads_gemm", 0.04, 1)]


def test_trace_summary_reads_gzipped_traces_and_needs_a_whole_step(tmp_path, capsys):
    module = _load("trace_summary")
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [{"cat": "cpu_op", "name": "aten::mm", "ts": 5, "dur": 1}] + TRACE[::-1]}, f)
    assert module.load(str(path)) == TRACE  # GPU events only, in order of start
    summary = module.main([str(path), "--layers", "2"])
    printed = capsys.readouterr().out
    assert re.search(r"cycle\s+1\.000 ms, GPU busy\s+0\.100 ms", printed)
    assert summary["attention_calls"] == 2
    with pytest.raises(ValueError, match="fewer than one step's 3"):
        module.summarize(TRACE[:5], layers=3)


def test_attention_checks_every_usable_backend_and_names_the_others():
    import torch

    from mapstream.attention import available_backends

    small = ["--device", "cpu", "--dtype", "fp32", "--queries", "6", "--keys", "40", "--capacity", "48",
             "--heads", "2", "--dim", "8", "--reps", "2"]
    module = _load("attention")
    result = module.main(small + ["--backends", "sdpa", "triton"])
    sdpa = result["backends"]["sdpa"]
    assert sdpa["attend_rel_err"] < 1e-6 and sdpa["range_rel_err"] < 1e-6
    assert sdpa["attend_us"] > 0 and sdpa["range_us"] > 0
    assert "needs a CUDA device (got cpu)" in result["backends"]["triton"]["unusable"]
    usable = [name for name, reasons in available_backends(torch.device("cpu"), torch.float32).items()
              if not reasons and name not in module.FEW_ROWS_ONLY]
    assert list(module.main(small)["backends"]) == usable  # by default every backend for a frame's queries


def test_device_scripts_parse_and_name_files_that_exist():
    check = BENCHMARKS / "device_check.sh"
    for script in (check, BENCHMARKS / "device_setup.sh", BENCHMARKS / "train_small_device.sh",
                   BENCHMARKS / "train_variants.sh", BENCHMARKS / "fleet_device.sh",
                   BENCHMARKS / "multi_gpu_device.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    named = re.findall(r'"\$here/(\w+\.py)"', check.read_text())
    assert sorted(named) == ["memory_parts.py", "profile_step.py", "trace_summary.py"]
    assert all((BENCHMARKS / name).is_file() for name in named)
    usage = subprocess.run(["bash", str(check)], capture_output=True, text=True)
    assert usage.returncode == 2 and "tests|measure|memory" in usage.stderr


def test_eval_synthetic_scores_each_seed_through_run_and_eval_against_the_targets(tmp_path):
    out = tmp_path / "eval.json"
    module = _load("eval_synthetic")
    result = module.main(["--model", "tiny", "--seeds", "101", "104", "--frames", "4", "--hw", "42", "56",
                          "--image-size", "56", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert [row["seed"] for row in result["seeds"]] == [101, 104]
    for row in result["seeds"]:
        assert row["ate_fraction"] == pytest.approx(row["ate"] / row["extent"]) and row["extent"] > 0
        assert 0 <= row["auc30"] <= 1 and row["abs_rel"] > 0 and 0 <= row["delta1"] <= 1
        assert row["chamfer"] > 0 and 0 <= row["f1"] <= 1
    assert result["median"]["chamfer"] == pytest.approx(sum(row["chamfer"] for row in result["seeds"]) / 2)
    for key, (bound, how) in module.TARGETS.items():
        values = sorted(row[key] for row in result["seeds"])
        assert result["median"][key] == pytest.approx(sum(values) / 2)
        assert result["met"][key] == (result["median"][key] <= bound if how == "max" else result["median"][key] >= bound)
    assert not result["met"]["abs_rel"]  # untrained weights reach no target


def test_eval_synthetic_scores_a_cloud_that_eval_could_not_place_as_the_worst():
    module = _load("eval_synthetic")
    assert module.cloud_scores({"points": {"chamfer": 0.3, "f1": 0.2}}) == {"chamfer": 0.3, "f1": 0.2}
    assert module.cloud_scores({"depth": {}}) == {"chamfer": float("inf"), "f1": 0.0}


def test_eval_synthetic_refuses_seeds_of_the_training_scenes(capsys):
    module = _load("eval_synthetic")
    from mapstream.synthetic import FIRST_TRAINING_SEED

    with pytest.raises(SystemExit) as stop:
        module.main(["--model", "tiny", "--seeds", "101", str(FIRST_TRAINING_SEED + 3)])
    assert stop.value.code == 2
    assert f"[{FIRST_TRAINING_SEED + 3}]" in capsys.readouterr().err


def test_eval_synthetic_passes_its_run_args_and_a_width_only_when_given_to_mapstream_run(tmp_path, monkeypatch):
    module = _load("eval_synthetic")
    commands = []

    def record(cmd, **kwargs):
        commands.append(cmd)
        raise RuntimeError("stop after the first command")

    monkeypatch.setattr(module.subprocess, "run", record)
    for width in ([], ["--image-size", "42"]):
        with pytest.raises(RuntimeError, match="stop after"):
            module.main(["--model", "tiny", "--seeds", "101", "--frames", "3", "--hw", "28", "42", *width,
                         "--run-args", "--num-scale-frames 1 --sliding-window 4"])
    own, given = commands
    for cmd in (own, given):
        assert cmd[2:4] == ["mapstream", "run"] and cmd[-4:] == ["--num-scale-frames", "1", "--sliding-window", "4"]
    # Without --image-size the run takes the model's own width, as a user's run does.
    assert "--image-size" not in own and given[given.index("--image-size") + 1] == "42"


def test_score_variants_places_runs_by_their_mean_rank_over_the_four_metrics():
    placing = _load("score_variants").placing
    medians = {
        "a": {"ate_fraction": 0.10, "auc30": 0.20, "abs_rel": 0.30, "delta1": 0.70},
        "b": {"ate_fraction": 0.20, "auc30": 0.30, "abs_rel": 0.20, "delta1": 0.80},  # best on three
        "c": {"ate_fraction": 0.05, "auc30": 0.10, "abs_rel": 0.40, "delta1": 0.60},  # best ATE only
    }
    assert placing(medians) == ["b", "a", "c"]
    # equal mean ranks go to the lower ATE
    assert placing({"x": {**medians["a"], "ate_fraction": 0.2}, "y": {**medians["a"], "ate_fraction": 0.1}}) == ["y", "x"]


def test_score_variants_scores_every_run_and_splits_the_best_runs_weights(tmp_path):
    from mapstream.train.config import TrainConfig
    from mapstream.train.trainer import train

    runs = tmp_path / "runs"
    for name, seed in (("one", 1), ("two", 2)):
        train(TrainConfig(model="tiny", frames=3, num_scale_frames=2, image_hw=(28, 42), batch_size=1, steps=1,
                          seed=seed, out=runs / name, tensorboard=False, log_every=1), progress=False)
    out = tmp_path / "out"
    result = _load("score_variants").main(["one", "two", "gone", "--runs", str(runs), "--seeds", "101",
                                           "--frames", "3", "--hw", "28", "42", "--keep", "1", "--out", str(out)])
    assert json.loads((out / "scores.json").read_text()) == result
    assert sorted(result["order"][:2]) == ["one", "two"] and result["order"][2] == "gone"
    assert list(result["failed"]) == ["gone"] and set(result["runs"]) == {"one", "two"}
    assert [row["seed"] for row in result["runs"]["one"]["seeds"]] == [101]
    best, other = result["order"][:2]
    assert len(list((out / best).glob("weights-*.safetensors"))) == 2 and not (out / other).exists()


def test_score_by_path_scores_each_path_kind_against_a_still_camera(tmp_path):
    import torch

    from mapstream.train.validate import Validation

    out = tmp_path / "by_path.json"
    result = _load("score_by_path").main(["--model", "tiny", "--frames", "3", "--frame-step", "2", "--hw", "28", "42",
                                          "--clips", "2", "--kinds", "pan", "orbit", "--out", str(out)])
    assert json.loads(out.read_text()) == result and list(result["kinds"]) == ["pan", "orbit"]
    for kind, row in result["kinds"].items():
        still = Validation(2, 3, (28, 42), torch.device("cpu"), path_kinds=(kind,), frame_step=2).references()
        assert row["still_rotation_deg"] == pytest.approx(still["val_rotation_deg"])
        assert row["rotation_ratio"] == pytest.approx(row["rotation_deg"] / row["still_rotation_deg"])
        assert row["rotation_deg"] >= 0 and row["depth_abs_rel"] > 0


def test_rule_weights_keeps_a_file_already_written_and_says_how_to_call_it(tmp_path):
    # Writing the official architecture's 4.6 GB takes the GPU machine; here: the file kept.
    module = _load("rule_weights")
    kept = tmp_path / "model.safetensors"
    kept.write_bytes(b"written before")
    assert module.main([str(kept)]) == kept and kept.read_bytes() == b"written before"
    with pytest.raises(SystemExit, match="usage: rule_weights.py FILE.safetensors"):
        module.main([])


def test_train_variants_runs_each_variant_with_its_flags_side_by_side(tmp_path):
    import os
    import sys

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: tiny\ndevice: cpu\nframes: 2\nnum_scale_frames: 1\nimage_hw: [28, 42]\n"
                      "batch_size: 1\nlog_every: 1\ntensorboard: false\nwarmup_steps: 1\n")
    env = {**os.environ, "RECIPE": str(recipe), "OUT": str(tmp_path / "out"), "KEEP_WEIGHTS": "pans",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(BENCHMARKS / "train_variants.sh"), "0.001", "plain=", "pans=--path-kinds pan"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for name, kinds in (("plain", []), ("pans", ["pan"])):
        assert json.loads((tmp_path / "runs" / name / "config.json").read_text())["path_kinds"] == kinds
        metrics = [json.loads(line) for line in (tmp_path / "out" / f"{name}.jsonl").read_text().splitlines()]
        assert metrics and metrics[0]["step"] == 1
    # KEEP_WEIGHTS names the variants whose weights come back (1: every variant's)
    assert not (tmp_path / "out" / "plain").exists()
    halves = sorted((tmp_path / "out" / "pans").glob("weights-*.safetensors"))
    joined = _load("half_weights").join(tmp_path / "out" / "pans", tmp_path / "pans.safetensors")
    assert len(halves) == 2 and mapstream.load_model(joined, preset="tiny").load_report.ok
    assert "== plain" in (tmp_path / "out" / "logs.txt").read_text()
    refused = subprocess.run(["bash", str(BENCHMARKS / "train_variants.sh"), "1", "bad name=x"], cwd=tmp_path,
                             env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "bad variant name" in refused.stderr


def test_train_step_times_the_real_loop_and_reports_its_steps(tmp_path):
    out = tmp_path / "step.json"
    result = _load("train_step").main(["--preset", "tiny", "--frames", "3", "--hw", "28", "42", "--steps", "2",
                                       "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert len(result["losses"]) == 2 and all(loss == loss for loss in result["losses"])  # two steps, no NaN
    assert result["step_seconds"] > 0 and result["peak_gpu_bytes"] is None
    import mapstream

    model = mapstream.build_model("tiny")  # every weight but the ViT's unused mask token is trained
    assert result["trained_parameters"] == sum(p.numel() for p in model.parameters()) - model.aggregator.patch_embed.mask_token.numel()
    phases = result["phase_seconds"]
    assert list(phases) == ["data", "forward", "loss", "backward", "optimizer"]
    assert all(v > 0 for v in phases.values()) and sum(phases.values()) <= result["step_seconds"]


def test_half_weights_carry_a_run_in_two_files_that_join_into_a_loadable_model(tmp_path, monkeypatch):
    import mapstream
    import torch
    from mapstream.train.config import TrainConfig
    from mapstream.train.trainer import train

    run = tmp_path / "run"
    train(TrainConfig(model="tiny", frames=3, num_scale_frames=2, image_hw=(28, 42), batch_size=1, steps=2,
                      ema_decay=0.9, out=run, tensorboard=False, log_every=1), progress=False)
    module = _load("half_weights")
    parts = module.split(run, tmp_path)
    assert [p.name for p in parts] == ["weights-0.safetensors", "weights-1.safetensors"]
    from safetensors.torch import load_file

    halves = [load_file(str(p)) for p in parts]
    assert not set(halves[0]) & set(halves[1])
    # A larger network is carried in more parts, each within the limit but for its last tensor.
    total = sum(v.numel() * v.element_size() for half in halves for v in half.values())
    largest = max(v.numel() * v.element_size() for half in halves for v in half.values())
    monkeypatch.setattr(module, "CARRY_BYTES", total // 3 - 1)
    (tmp_path / "more").mkdir()
    more = module.split(run, tmp_path / "more")
    assert len(more) == 4
    sizes = [sum(v.numel() * v.element_size() for v in load_file(str(p)).values()) for p in more]
    assert sum(sizes) == total and all(size < total // 3 + largest for size in sizes)
    assert module.read_halves(tmp_path / "more")[0].keys() == halves[0].keys() | halves[1].keys()
    joined = module.join(tmp_path, tmp_path / "joined.safetensors")
    model = mapstream.load_model(str(joined), preset="tiny")
    exported = load_file(str(run / "model.safetensors"))  # the EMA's weights, in fp32
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, exported[key].to(torch.float16).float(), rtol=0, atol=0)
    # `ship`: the same weights in one file, named with its preset as the package's shipped file is.
    from safetensors import safe_open

    shipped = module.ship(run, tmp_path / "shipped.safetensors", preset="tiny")
    with safe_open(str(shipped), "pt") as handle:
        # The width the run trained at (--image-hw's second value) travels with the weights.
        assert handle.metadata() == {"preset": "tiny", "step": "2", "source": "step-00000002.pt", "image_size": "42",
                                     "trained_views": "3"}
    assert mapstream.load_model(str(shipped), preset="tiny").load_report.image_size == 42
    assert load_file(str(shipped)).keys() == load_file(str(joined)).keys()
    assert all(torch.equal(load_file(str(shipped))[k], v) for k, v in load_file(str(joined)).items())
    # `ship` from the halves (what comes back from the device) writes the same file
    from_halves = module.ship(tmp_path, tmp_path / "from_halves.safetensors", preset="tiny")
    with safe_open(str(from_halves), "pt") as handle:
        assert handle.metadata() == {"preset": "tiny", "step": "2", "source": "step-00000002.pt", "image_size": "42",
                                     "trained_views": "3"}
    assert all(torch.equal(load_file(str(from_halves))[k], v) for k, v in load_file(str(shipped)).items())
    # `ship --int8`: the large matrices in 8 bits, read back by every loader
    from mapstream.weights.int8 import INT8_ROWS, STORAGE_KEY

    small = module.ship(tmp_path, tmp_path / "int8.safetensors", preset="tiny", int8=True)
    with safe_open(str(small), "pt") as handle:
        assert handle.metadata()[STORAGE_KEY] == INT8_ROWS and handle.metadata()["preset"] == "tiny"
    assert small.stat().st_size < 0.6 * shipped.stat().st_size
    restored = mapstream.load_model(str(small), preset="tiny").state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(restored[key], value, rtol=0, atol=float(value.abs().max()) / 127)
    # The command line: ship names the preset it is told; other verbs refuse ship's options.
    script = str(Path(module.__file__))
    done = subprocess.run([sys.executable, script, "ship", str(tmp_path), str(tmp_path / "named.safetensors"),
                           "--preset", "tiny", "--int8", "--image-size", "56", "--trained-views", "48"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with safe_open(str(tmp_path / "named.safetensors"), "pt") as handle:
        assert handle.metadata()["preset"] == "tiny" and handle.metadata()[STORAGE_KEY] == INT8_ROWS
        assert handle.metadata()["image_size"] == "56"  # --image-size overrides the run's width
        assert handle.metadata()["trained_views"] == "48"  # --trained-views the run's clip length
    refused = subprocess.run([sys.executable, script, "join", str(tmp_path), str(tmp_path / "x.safetensors"), "--int8"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "only ship takes --int8, --preset, --image-size and --trained-views" in refused.stderr


def test_plot_training_draws_a_runs_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "camera": 0.5, "camera_rotation": 0.2,
                                           "camera_fov": 0.1, "depth": 0.3, "lr": 1e-4}) + "\n" for s in range(1, 9)))
    target = _load("plot_training").plot(metrics, tmp_path / "curves.png")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with metrics.open("a") as handle:  # validation records on some steps add the held-out panel
        handle.write(json.dumps({"step": 9, "loss": 0.1, "camera": 0.5, "camera_rotation": 0.2, "camera_fov": 0.1,
                                 "depth": 0.3, "lr": 1e-4, "val_rotation_deg": 30.0, "val_translation_deg": 60.0,
                                 "val_auc30": 0.4, "camera_pairs": 0.2}) + "\n")
    with_val = _load("plot_training").plot(metrics, tmp_path / "curves_val.png")
    from PIL import Image

    assert Image.open(with_val).height > Image.open(target).height
    smoothed = _load("plot_training").smooth(__import__("numpy").array([0.0, 10.0, 0.0, 0.0, 0.0]))
    assert smoothed.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]


def test_plot_training_chains_the_stages_of_a_curriculum(tmp_path):
    module = _load("plot_training")
    files = []
    for name, steps in (("first", (25, 50)), ("second", (25, 50, 75))):
        (tmp_path / name).mkdir()
        files.append(tmp_path / name / "metrics.jsonl")
        files[-1].write_text("".join(json.dumps({"step": s, "loss": 1.0, "camera": 0.5, "camera_rotation": 0.2,
                                                 "camera_fov": 0.1, "depth": 0.3, "lr": 1e-4}) + "\n" for s in steps))
    records, starts = module.chain(files)
    assert [r["step"] for r in records] == [25, 50, 75, 100, 125] and starts == [(0, "first"), (50, "second")]
    assert module.plot(files, tmp_path / "chain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_make_videos_writes_decodable_videos_of_the_asked_size_from_different_seeds(tmp_path):
    import av
    import numpy as np

    result = _load("make_videos").main([str(tmp_path), "--videos", "2", "--frames", "4", "--size", "56x42",
                                        "--workers", "1"])
    assert [Path(f).name for f in result["files"]] == ["video_000.mp4", "video_001.mp4"]
    firsts = []
    for name in result["files"]:
        with av.open(name) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 4 and frames[0].shape == (42, 56, 3)
        firsts.append(frames[0].astype(np.int16))
    assert np.abs(firsts[0] - firsts[1]).mean() > 5  # two rooms, not one twice
    assert not list(tmp_path.glob("*.part"))
    with pytest.raises(SystemExit):
        _load("make_videos").main([str(tmp_path), "--size", "55x42"])  # odd: no 4:2:0 H.264


def test_multi_gpu_device_script_runs_its_fleet_and_train_parts_on_two_cpu_workers(tmp_path):
    """The mechanism only (two workers on a CPU, the tiny model): the N-worker job's outputs
    equal the one-worker job's, and two DDP processes train as one with the doubled batch."""
    import os
    import sys

    script = BENCHMARKS / "multi_gpu_device.sh"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPUS": "2", "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert usage.returncode == 2 and "fleet VIDEO_FOLDER | train | fsdp" in usage.stderr
    _load("make_videos").main([str(tmp_path / "videos"), "--videos", "2", "--frames", "3", "--size", "56x42",
                               "--workers", "1"])
    done = subprocess.run(["bash", str(script), "fleet", "videos"], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "MODEL": "tiny", "FLEET_BACKEND": "processes"}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    fleet = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert fleet["equal"] and fleet["inputs"] == 2 and fleet["stream_frames"] == 6
    assert fleet["backend"] == "processes" and set(fleet["worst_relative_difference"]) >= {"depth", "pose_enc"}
    assert sorted(p.parent.name for p in (tmp_path / "runs" / "gpus_n").glob("*/predictions.npz")) == [
        "video_000", "video_001"]
    (tmp_path / "cpu.yaml").write_text("model: tiny\nframes: 2\nnum_scale_frames: 1\nimage_hw: [28, 28]\n"
                                      "warmup_steps: 1\n")
    done = subprocess.run(["bash", str(script), "train"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env, "RECIPE": "cpu.yaml", "TRAIN_DEVICE": "cpu", "TRAIN_STEPS": "3",
                               "PER_GPU_BATCH": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trained = json.loads((tmp_path / "out" / "train.json").read_text())
    assert trained["global_batch"] == 2 and len(trained["one_gpu"]["losses"]) == 3
    assert trained["largest_loss_difference"] < 1e-5
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "fleet.json", "log.txt", "train.json", "train_1gpu.jsonl", "train_ngpu.jsonl"]


def test_train_step_under_torchrun_reports_every_process_of_an_fsdp_run(tmp_path):
    import os
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "step.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
         f"--master_port={port}", str(BENCHMARKS / "train_step.py"), "--preset", "tiny", "--frames", "2",
         "--hw", "28", "28", "--steps", "2", "--distributed", "fsdp", "--out", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["world_size"], result["distributed"], result["global_batch"]) == (2, "fsdp", 2)
    assert result["peak_gpu_bytes_per_process"] == [None, None] and len(result["losses"]) == 2
    assert "x 2 processes (fsdp)" in done.stdout


def test_the_correspondence_probe_trains_on_each_kind_of_clip():
    import torch

    module = _load("probe_correspondence")
    for mode in module.MODES:
        images, poses, shift = module.clips(mode, 3, torch.Generator().manual_seed(0))
        assert shift.shape == (3,) and images.shape == (3, 2, 3, module.H, module.W) and poses.shape == (3, 2, 9)
        assert float(images.min()) >= 0 and float(images.max()) <= 1
        assert module.yaw_error_deg(poses, poses) == 0.0
    history = module.main(["--mode", "blobshift", "--steps", "2", "--batch-size", "2"])
    assert [step for step, _ in history] == [0, 2] and all(error == error for _, error in history)
    for aux in ("match", "flow"):
        history = module.main(["--mode", "patchshift", "--steps", "1", "--batch-size", "2", "--aux", aux,
                               "--init", "sincos", "tied"])
        assert [step for step, _ in history] == [0, 1] and all(error == error for _, error in history)


def test_the_probe_knows_which_patch_of_the_first_frame_each_patch_shows():
    import torch

    module = _load("probe_correspondence")
    target, inside = module.patch_targets(torch.tensor([14, -20]), 14)  # 4 x 8 patches of 14 px
    columns = target.view(2, 4, 8) % 8
    assert (target.view(2, 4, 8) // 8 == torch.arange(4)[:, None]).all()  # same row
    assert columns[0, 0].tolist()[:7] == [1, 2, 3, 4, 5, 6, 7] and inside[0].view(4, 8)[:, :7].all()
    assert not inside[0].view(4, 8)[:, 7].any()  # its centre left the first frame
    # centres 7 + 14c - 20 = -13, 1, 15, ...: the first leaves the frame, the next falls in column 0
    assert columns[1, 0].tolist()[1:] == [0, 1, 2, 3, 4, 5, 6] and not inside[1].view(4, 8)[:, 0].any()



def test_loop_closure_replay_builds_each_settings_map_on_the_same_stored_stream(tmp_path):
    pytest.importorskip("gtsam")
    pytest.importorskip("faiss")
    replay = _load("loop_closure_replay")
    assert replay.parse_setting("strict=min_overlap=0.7,candidates=2") == ("strict", {"min_overlap": 0.7, "candidates": 2})
    assert replay.parse_setting("default=") == ("default", {})
    assert replay.parse_setting("loose=loop_sigma=[0.1,0.2,0.16],candidates=2") == (
        "loose", {"loop_sigma": [0.1, 0.2, 0.16], "candidates": 2})
    out = tmp_path / "replay.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "loop_closure_replay.py"), "--seeds", "3", "--frames", "16", "--workers", "1",
         "--setting", "open=temporal_gap=4,keyframe_every=2,min_similarity=0.0",
         "--setting", "shut=temporal_gap=4,keyframe_every=2,min_similarity=1.0", "--out", str(out),
         "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["setting"] for r in rows] == ["open", "shut"]
    # The same stream under both: the same error without the map.
    assert rows[0]["without"] == rows[1]["without"]
    assert rows[0]["checks"] > 0 and rows[1]["checks"] == 0  # a similarity of 1.0 lets no candidate through
    assert rows[1]["with"] == pytest.approx(rows[1]["without"], abs=1e-9)  # no loop: nothing moves
    assert (tmp_path / "plots" / "seed_3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_memory_answers_every_frame_of_every_session_and_reports_the_servers_estimate(tmp_path):
    out = tmp_path / "serve_memory.json"
    result = _load("serve_memory").main(SMALL + ["--sessions", "3", "--batch", "2", "--frames", "8", "--out", str(out)])
    assert result["errors"] == [] and result["answers"] == 3 * 8
    assert result["plan"] is None and "peak_allocated_bytes" not in result  # nothing to plan or measure off CUDA
    assert "caches 3 x" in result["estimate"] and result["stream_frames_per_s"] > 0
    assert json.loads(out.read_text())["answers"] == 24
    short = _load("serve_memory").main(SMALL + ["--sessions", "2", "--frames", "1"])  # ends in its scale phase
    assert short["errors"] == [] and short["answers"] == 2 and short["stream_frames_per_s"] is None
