"""`mapstream run` end to end on real photos (tiny preset, small frames): every output read
back with an independent reader; resume after an interruption; bad input."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import DATA
from mapstream.cli.main import main
from mapstream.geometry import unit_quaternion_encoding
from run_helpers import photos, run_cli


def test_run_writes_every_output_readable_by_other_tools(tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path)), "--out", str(out), "--keyframe-interval", "2") == 0
    printed = capsys.readouterr().out
    assert "10 frames" in printed and "TINY PRESET" in printed

    npz = np.load(out / "predictions.npz")
    n, h, w = npz["depth"].shape
    assert (n, h, w) == (10, 84, 140) and npz["images"].shape == (10, 84, 140, 3)
    assert list(npz["names"]) == [f"{i:06d}.png" for i in range(10)]
    assert npz["keyframe"].tolist() == [True, True] + [i % 2 == 0 for i in range(8)]
    np.testing.assert_allclose(
        npz["T_cam_world"][:, :3, :3], np.transpose(npz["T_world_cam"][:, :3, :3], (0, 2, 1)), atol=1e-5
    )

    tum = np.loadtxt(out / "trajectory_tum.txt")
    assert tum.shape == (10, 8)
    np.testing.assert_allclose(tum[:, 1:4], npz["T_world_cam"][:, :3, 3], atol=1e-5)

    from plyfile import PlyData

    ply = PlyData.read(str(out / "points.ply"))["vertex"]
    assert len(ply) > 0 and {"x", "y", "z", "red", "green", "blue"} <= set(ply.data.dtype.names)

    import trimesh

    scene = trimesh.load(out / "scene.glb")
    assert len(scene.geometry) >= 2

    colmap = out / "sparse" / "0"
    try:
        import pycolmap

        rec = pycolmap.Reconstruction(str(colmap))
        assert rec.num_reg_images() == 10
    except ImportError:
        lines = [l for l in (colmap / "images.txt").read_text().splitlines() if l and not l.startswith("#")]
        assert len(lines) == 20

    transforms = json.loads((out / "transforms.json").read_text())
    assert len(transforms["frames"]) == 10
    assert (out / transforms["frames"][0]["file_path"]).exists()

    depth_png = sorted((out / "depth").glob("*.png"))
    assert len(depth_png) == 10
    mm = np.asarray(Image.open(depth_png[3]))
    assert mm.dtype == np.uint16
    np.testing.assert_allclose(mm / 1000.0, npz["depth"][3], atol=1e-3)
    assert Image.open(out / "summary.png").size[0] > 100

    info = json.loads((out / "run.json").read_text())
    assert info["frames"] == 10 and info["fps"] > 0 and info["config"]["keyframe_interval"] == 2
    assert info["config"]["heads_precision"] == "float32"
    assert "torch" in json.dumps(info["versions"])


def interrupt_at_step(monkeypatch, n: int):
    """Make the n-th `Session.step` raise KeyboardInterrupt (a Ctrl-C mid-run); returns the real
    step, to put back with monkeypatch.setattr."""
    from mapstream import session as session_module

    real_step = session_module.Session.step
    calls = {"n": 0}

    def failing_step(self, frame, **kw):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real_step(self, frame, **kw)

    monkeypatch.setattr(session_module.Session, "step", failing_step)
    return real_step


def test_interrupted_run_keeps_finished_frames_and_resumes(tmp_path, monkeypatch, capsys, caplog):
    frames = photos(tmp_path)
    out = tmp_path / "out"
    from mapstream import session as session_module

    real_step = interrupt_at_step(monkeypatch, 8)
    assert run_cli(str(frames), "--out", str(out)) == 130  # Ctrl-C: told, not a traceback
    assert "interrupted; a run keeps the frames it finished" in capsys.readouterr().err
    progress = json.loads((out / "progress.json").read_text())
    assert progress["frames"] == 7
    monkeypatch.setattr(session_module.Session, "step", real_step)

    assert run_cli(str(frames), "--out", str(out)) == 0
    # The frames after come from a restarted stream: told, since they differ from an uninterrupted run's.
    assert "resuming after 7 finished frames: the stream restarts with the last 2 of them as its scale frames" in caplog.text
    npz = np.load(out / "predictions.npz")
    assert list(npz["names"]) == [f"{i:06d}.png" for i in range(10)]
    info = json.loads((out / "run.json").read_text())
    assert info["resumed_from"] == 7 and info["new_frames"] == 3
    assert np.isfinite(npz["T_world_cam"]).all()
    # The frames before the stop (the network's own encoding) and after it (re-encoded by the
    # alignment) store their quaternions one way, as an uninterrupted run stores them.
    whole = tmp_path / "whole"
    assert run_cli(str(frames), "--out", str(whole)) == 0
    for pose_enc in (npz["pose_enc"], np.load(whole / "predictions.npz")["pose_enc"]):
        q = pose_enc[:, 3:7]
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-6)
        assert (q[:, 3] >= 0).all()
    np.testing.assert_allclose(npz["pose_enc"][:7], np.load(whole / "predictions.npz")["pose_enc"][:7], atol=1e-6)


def test_a_rerun_with_nothing_new_says_so(tmp_path, capsys):
    """Every frame finished by the run before: no frame runs, so no speed is told."""
    frames = photos(tmp_path)
    out = tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out)) == 0
    assert "10 frames (10 new) at " in capsys.readouterr().out
    assert run_cli(str(frames), "--out", str(out)) == 0
    said = capsys.readouterr().out
    assert "10 frames, none new: an earlier run in this folder finished every frame; outputs written again with " in said
    assert "FPS" not in said and "0 new" not in said


def test_a_run_removes_the_temp_files_a_killed_write_left_in_its_folders_only(tmp_path):
    """A run killed while an export was being written leaves hidden ``.<name>.tmp-*`` files; the
    next run into the folder deletes those of its own files there and in its frame folders, and
    nothing else: not other hidden files, not another tool's write in progress, not such names
    in a folder of the user's or behind a link."""
    out = tmp_path / "out"
    stale = [out / ".predictions.npz.tmp-7b090d67.npz", out / "images" / ".000001.png.tmp-0a1b2c3d.png",
             out / "sparse" / "0" / ".images.txt.tmp-12345678.txt"]
    kept = [out / ".keep", out / "notes" / ".draft.txt.tmp-1.txt", out / "images.tmp-1", out / ".notes.tmp-backup",
            out / "notes" / ".x.png.tmp-0a1b2c3d.png",  # a folder of the user's
            out / ".flythrough.mp4.tmp-0a1b2c3d.mp4",  # another tool's write in progress (mapstream render)
            tmp_path / "elsewhere" / ".y.png.tmp-0a1b2c3d.png"]  # behind a linked frame folder
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (out / "depth").symlink_to(tmp_path / "elsewhere")
    assert run_cli(str(photos(tmp_path, n=4)), "--out", str(out), "--formats", "npz", "colmap") == 0
    assert [p for p in stale if p.exists()] == []
    assert all(p.read_bytes() == b"x" for p in kept)
    assert (out / "predictions.npz").is_file() and (out / "sparse" / "0" / "images.txt").is_file()


def test_a_rerun_stopped_while_exporting_leaves_no_run_json_vouching_for_the_folder(tmp_path, monkeypatch):
    """run.json is written last; while a rerun's exports replace an earlier run's files, the
    earlier run.json says so (keeping the outputs and frame names a later run's cleanup reads),
    so a rerun stopped there leaves no run.json that claims the folder as one finished run."""
    import importlib

    frames, out = photos(tmp_path, n=4), tmp_path / "out"
    out.mkdir()
    (out / "scene.glb").write_bytes(b"the user's own")  # no run writes it below
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "tum", "depth") == 0
    first = json.loads((out / "run.json").read_text())
    assert "state" not in first
    run_module = importlib.import_module("mapstream.pipeline.run")
    real_export = run_module.export_all

    def stopped(recon, out_dir, **kwargs):  # writes part of its formats, then is stopped
        real_export(recon, out_dir, **{**kwargs, "formats": ["ply", "images"]})
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "export_all", stopped)
    (tmp_path / "six").mkdir()
    frames6 = photos(tmp_path / "six", n=6)
    assert run_cli(str(frames6), "--out", str(out), "--formats", "npz", "ply", "glb", "images", "summary") == 130
    marked = json.loads((out / "run.json").read_text())
    assert "did not finish" in marked.pop("state")
    (replacing,) = marked.pop("replaced_by")
    assert marked == first  # what the cleanup reads of the earlier run is kept
    assert replacing["formats"] == ["npz", "ply", "glb", "images", "summary"]
    assert replacing["frame_stems"] == [f"{i:06d}" for i in range(6)]
    assert replacing["settings"]["input"] and "conf_threshold" in replacing["settings"]["options"]
    assert (out / "points.ply").is_file() and len(list((out / "images").iterdir())) == 6
    # A third run, of yet other settings, removes what both earlier runs wrote and it does not:
    # their formats' files, and their per-frame files of this run's frames (a frame name read
    # off disk decides no deletion: the other frames' files stay, and are told).
    monkeypatch.setattr(run_module, "export_all", real_export)
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "--first-k", "3") == 0
    last = json.loads((out / "run.json").read_text())
    assert "state" not in last and "replaced_by" not in last and last["frames"] == 3
    assert sorted(p.name for p in out.iterdir()) == [
        ".frames", ".lock", "depth", "depth_preview", "images", "predictions.npz", "progress.json", "run.json",
        "scene.glb"]
    assert sorted(p.name for p in (out / "images").iterdir()) == ["000003.png", "000004.png", "000005.png"]
    assert [p.name for p in (out / "depth").iterdir()] == ["000003.png"]
    assert (out / "scene.glb").read_bytes() == b"the user's own"  # older than the stopped run: not its


def test_a_first_run_stopped_while_exporting_is_cleaned_by_the_next(tmp_path, monkeypatch):
    """With no earlier run.json, a run stopped while exporting still leaves one saying so, and
    what it wrote is removed by a later run that does not write it."""
    import importlib

    run_module = importlib.import_module("mapstream.pipeline.run")
    real_export = run_module.export_all

    def stopped(recon, out_dir, **kwargs):
        real_export(recon, out_dir, **{**kwargs, "formats": ["depth"]})
        raise KeyboardInterrupt

    frames, out = photos(tmp_path, n=3), tmp_path / "out"
    monkeypatch.setattr(run_module, "export_all", stopped)
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "depth") == 130
    marked = json.loads((out / "run.json").read_text())
    assert "did not finish" in marked["state"] and [e["formats"] for e in marked["replaced_by"]] == [["npz", "depth"]]
    monkeypatch.setattr(run_module, "export_all", real_export)
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    assert not (out / "depth").exists() and not (out / "depth_preview").exists()
    assert "state" not in json.loads((out / "run.json").read_text())


def test_low_precision_heads_run_in_bf16_and_are_recorded(tmp_path):
    src = photos(tmp_path)
    runs = {}
    for flag in ((), ("--low-precision-heads",)):
        out = tmp_path / f"out{len(flag)}"
        assert run_cli(str(src), "--out", str(out), "--precision", "bf16", "--formats", "npz", *flag) == 0
        runs[flag] = (json.loads((out / "run.json").read_text())["config"], np.load(out / "predictions.npz"))
    (cfg32, fp32), (cfg16, bf16) = runs.values()
    assert cfg32["heads_precision"] == "float32" and cfg16["heads_precision"] == "bfloat16"
    assert bf16["depth"].dtype == fp32["depth"].dtype and not np.array_equal(bf16["depth"], fp32["depth"])
    rel = np.linalg.norm(bf16["depth"] - fp32["depth"]) / np.linalg.norm(fp32["depth"])
    assert rel < 5e-2, rel


def test_cache_and_camera_options_are_the_sessions(tmp_path):
    """The run's predictions are a library session's with the same settings: --num-scale-frames
    sets the cache's scale frames too (as the reference demo's flag sets kv_cache_scale_frames),
    --sliding-window and --trajectory-capacity the rest of the cache policy (9 frames with 2
    scale frames and a window of 2 evict 5, past a capacity of 2), --camera-iterations the
    camera head. Each setting changes the outputs, so none may be dropped on the way."""
    import torch

    import mapstream

    src = photos(tmp_path, 9)
    out = tmp_path / "out"
    options = ["--sliding-window", "2", "--trajectory-capacity", "2", "--camera-iterations", "1"]
    assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--keyframe-interval", "1", *options) == 0
    got = np.load(out / "predictions.npz")
    frames = mapstream.load_images(sorted(src.glob("*.png")), image_size=140)

    def session_outputs(cache: dict, iterations: int) -> tuple[np.ndarray, np.ndarray]:
        model = mapstream.fill_synthetic_(mapstream.build_model("tiny", camera_num_iterations=iterations)).eval()
        with model.session(num_scale_frames=2, keyframe_interval=1, **cache) as session:
            preds = session.run_frames(frames)
        pose = unit_quaternion_encoding(torch.stack([p.pose_enc for p in preds]))  # as the run stores it
        return pose.numpy(), torch.stack([p.depth for p in preds]).numpy()

    chosen = dict(cache_scale_frames=2, sliding_window=2, trajectory_capacity=2)
    pose, depth = session_outputs(chosen, 1)
    np.testing.assert_allclose(got["pose_enc"], pose, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["depth"], depth.reshape(got["depth"].shape), rtol=1e-5, atol=1e-6)
    config = json.loads((out / "run.json").read_text())["config"]
    assert (config["cache_scale_frames"], config["sliding_window"], config["trajectory_capacity"]) == (2, 2, 2)
    assert config["camera_iterations"] == 1
    for other, iterations in [
        (dict(cache_scale_frames=8, sliding_window=2, trajectory_capacity=2), 1),
        (dict(cache_scale_frames=2, sliding_window=64, trajectory_capacity=2), 1),
        (dict(cache_scale_frames=2, sliding_window=2, trajectory_capacity=None), 1),
        (chosen, 4),
    ]:
        assert not np.allclose(session_outputs(other, iterations)[0], pose, rtol=1e-5, atol=1e-6), (other, iterations)


def test_a_run_folder_from_before_the_cache_options_resumes(tmp_path):
    """Older progress files lack the cache and camera settings. Those runs kept 8 scale frames
    in the cache, a window of 64, a capacity of 1024 and 4 camera passes: a run with these
    resumes them, a run with others starts over, and so does one with --num-scale-frames 2,
    whose cache now keeps 2 scale frames."""
    src = photos(tmp_path, 6)

    def older(out):
        progress = json.loads((out / "progress.json").read_text())
        later = ("rotate", "overlap_keyframes", "cache_scale_frames", "sliding_window", "trajectory_capacity")
        for key in (*later, "camera_iterations"):
            progress["config"].pop(key, None)
        (out / "progress.json").write_text(json.dumps(progress))

    def new_frames(out, *options, scale="2") -> int:
        args = ["run", str(src), "--out", str(out), "--model", "tiny", "--image-size", "140", "--quiet"]
        assert main([*args, "--formats", "npz", "--num-scale-frames", scale, *options]) == 0
        return json.loads((out / "run.json").read_text())["new_frames"]

    assert new_frames(tmp_path / "a", scale="8") == 6
    older(tmp_path / "a")
    assert new_frames(tmp_path / "a", scale="8") == 0
    older(tmp_path / "a")
    assert new_frames(tmp_path / "a", "--sliding-window", "3", scale="8") == 6
    assert new_frames(tmp_path / "b") == 6
    older(tmp_path / "b")
    assert new_frames(tmp_path / "b") == 6


def test_demo_runs_offline(tmp_path):
    out = tmp_path / "demo"
    assert main(["run", "--demo", "--out", str(out), "--quiet", "--formats", "npz", "tum"]) == 0
    assert np.load(out / "predictions.npz")["depth"].shape[0] == 24


@pytest.mark.parametrize("case", ["missing", "empty", "corrupt", "unwritable"])
def test_bad_input_is_a_clear_error(tmp_path, capsys, case):
    folder = tmp_path / "frames"
    out = tmp_path / "out"
    if case != "missing":
        folder.mkdir()
    if case == "corrupt":
        (folder / "000000.png").write_bytes(b"not a png")
    if case == "unwritable":
        shutil.copy(sorted((DATA / "courthouse").glob("*.png"))[0], folder / "000000.png")
        out = tmp_path / "file"
        out.write_text("x")
    assert run_cli(str(folder), "--out", str(out)) != 0
    err = capsys.readouterr().err
    expected = {"missing": "not found", "empty": "no image", "corrupt": "000000.png", "unwritable": str(out)}[case]
    assert expected.lower() in err.lower()


@pytest.mark.parametrize("option, message", [
    (["--formats", "ply", "nope"], "unknown export formats ['nope']"),
    (["--voxel-size", "0"], "--voxel-size must be > 0 and finite"),
    (["--conf-threshold", "nan"], "--conf-threshold is NaN"),
    (["--num-scale-frames", "0"], "--num-scale-frames must be >= 1, got 0"),
    (["--keyframe-interval", "-2"], "--keyframe-interval must be >= 0, got -2"),
    (["--keyframe-interval", "every"], "Error parsing --keyframe-interval"),
    (["--mode", "windowed", "--window-size", "0"], "--window-size must be >= 1, got 0"),
    (["--mode", "windowed", "--overlap", "0"], "an overlap of 0 frames leaves consecutive windows no frame"),
    (["--fps", "0"], "fps must be > 0 (or None for every frame), got 0.0"),
    (["--fps", "nan"], "fps must be > 0 (or None for every frame), got nan"),
    (["--voxel-size", "inf"], "--voxel-size must be > 0 and finite"),
    (["--sliding-window", "0"], "--sliding-window must be >= 1, got 0"),
    (["--trajectory-capacity", "1"], "--trajectory-capacity must be >= 2 or None (unbounded), got 1"),
    (["--camera-iterations", "0"], "--camera-iterations must be >= 1, got 0"),
    (["--mode", "windowed", "--keyframe-interval", "auto"], "windowed inference needs a fixed keyframe interval"),
    (["--mode", "windowed", "--overlap-keyframes", "0"], "--overlap-keyframes must be >= 1 (or unset), got 0"),
    (["--conf-percentile", "101"], "--conf-percentile must be in [0, 100] (or unset), got 101.0"),
    (["--device", "mps"], "--device mps: mapstream runs on the CPU or a CUDA GPU"),
    (["--device", "gpu0"], "--device gpu0: not a device name"),
])
def test_a_bad_option_fails_before_the_model_loads_or_any_frame_is_read(tmp_path, capsys, monkeypatch, option, message):
    """Options that the export reads at the end, or the session once the model is loaded,
    are checked at the start: a typo must not cost a checkpoint's loading or a run's compute."""
    import importlib

    pipeline = importlib.import_module("mapstream.pipeline.run")
    monkeypatch.setattr(pipeline, "open_input", lambda opts: pytest.fail("frames were read"))
    monkeypatch.setattr(pipeline, "resolve_model", lambda *a, **k: pytest.fail("the model was loaded"))
    args = ["run", str(photos(tmp_path, 3)), "--out", str(tmp_path / "o"), "--model", "tiny", "--quiet", *option]
    try:
        status = main(args)
    except SystemExit as exit:  # a value the parser itself refuses (it tells it in its own box)
        status = exit.code
    assert status != 0
    assert message in " ".join(capsys.readouterr().err.split())


def test_run_errors_name_the_flags_but_leave_words_and_paths_alone():
    """The library's errors name its Python fields; the command line shows its flags instead,
    and leaves plain words, paths and longer names that contain a field's name unchanged."""
    from mapstream.cli._flags import as_flags
    from mapstream.cli.run import Run

    def _as_flags(message):
        return as_flags(message, Run)

    assert _as_flags("sliding_window must be >= 1, got 0") == "--sliding-window must be >= 1, got 0"
    assert _as_flags("raise the sliding window (--sliding-window, kv_cache_sliding_window)") == (
        "raise the sliding window (--sliding-window, kv_cache_sliding_window)")
    assert _as_flags("the model mode /data/num_scale_frames/a.png") == "the model mode /data/num_scale_frames/a.png"
    assert _as_flags("num_scale_frames and camera_iterations") == "--num-scale-frames and --camera-iterations"
    assert _as_flags("no image or video found at 'sky_model.mp4'") == "no image or video found at 'sky_model.mp4'"
    assert _as_flags("cannot read image_size.png: (voxel_size) gone") == "cannot read image_size.png: (--voxel-size) gone"


def test_checkpoint_that_does_not_fit_is_reported(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(2, 2)}, str(ckpt))
    code = main(["run", str(photos(tmp_path, 3)), "--out", str(tmp_path / "o"), "--model", str(ckpt), "--quiet"])
    assert code != 0
    assert "unexpected" in capsys.readouterr().err.lower()


def test_a_checkpoint_of_another_preset_runs_from_the_command_line(tmp_path):
    """The command line has no preset option: a checkpoint is built as the preset it fits."""
    import torch

    import mapstream

    model = mapstream.build_model("tiny")
    mapstream.fill_synthetic_(model)
    torch.save(model.state_dict(), tmp_path / "tiny.pt")
    out = tmp_path / "o"
    code = main(["run", str(photos(tmp_path, 3)), "--out", str(out), "--model", str(tmp_path / "tiny.pt"),
                 "--image-size", "140", "--num-scale-frames", "2", "--formats", "npz", "--quiet"])
    assert code == 0 and np.isfinite(np.load(out / "predictions.npz")["depth"]).all()


def test_eval_scores_a_run_on_a_generated_scene(tmp_path, capsys):
    from mapstream.synthetic import render_sequence, write_sequence

    scene = write_sequence(render_sequence(8, image_hw=(84, 140), seed=3), tmp_path / "scene")
    rgb = scene / "rgb"
    out = tmp_path / "run"
    assert run_cli(str(rgb), "--out", str(out), "--formats", "npz", "tum") == 0
    capsys.readouterr()
    assert main(["eval", str(out), "--gt", str(scene), "--out", str(tmp_path / "eval.json")]) == 0
    table = capsys.readouterr().out
    assert "ate" in table.lower()
    report = json.loads((tmp_path / "eval.json").read_text())
    text = json.dumps(report)
    assert "sim3" in text and "abs_rel" in text


def test_sky_masks_are_computed_cached_and_exported(tmp_path, capsys):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("sky_onnx_builder", REPO / "tests" / "sky" / "sky_onnx_builder.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    (tmp_path / "model").mkdir()
    model = builder.write_model(tmp_path / "model")
    out = tmp_path / "out"
    args = (str(photos(tmp_path, 4)), "--out", str(out), "--sky-mask", "--sky-model", str(model), "--formats", "npz", "ply")
    assert run_cli(*args) == 0
    npz = np.load(out / "predictions.npz")
    assert npz["sky_mask"].shape == npz["depth"].shape and npz["sky_mask"].dtype == bool
    assert len(list((out / "sky_cache").glob("*.png"))) == 4


def test_missing_sky_model_is_a_warning_not_a_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.delenv("MAPSTREAM_SKY_MODEL", raising=False)
    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path, 3)), "--out", str(out), "--sky-mask", "--formats", "npz") == 0
    assert "sky masking skipped" in capsys.readouterr().out


@pytest.mark.parametrize("device, gpus, message", [
    ("cuda", 0, "--device cuda: this PyTorch sees no CUDA GPU"),
    ("cuda:2", 2, "--device cuda:2: this machine has 2 CUDA GPU(s), numbered from 0"),
])
def test_a_cuda_device_that_is_not_there_is_told_before_any_work(tmp_path, capsys, monkeypatch, device, gpus, message):
    """--device cuda without a usable GPU used to end in PyTorch's AssertionError
    ("Torch not compiled with CUDA enabled") once the model was moved; now the run stops
    first, says why and what to pass instead, and leaves no output folder behind."""
    import importlib

    pipeline = importlib.import_module("mapstream.pipeline.run")
    monkeypatch.setattr(pipeline.torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(pipeline.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(pipeline, "resolve_model", lambda *a, **k: pytest.fail("the model was loaded"))
    out = tmp_path / "o"
    assert main(["run", str(photos(tmp_path, 3)), "--out", str(out), "--model", "tiny", "--device", device]) != 0
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_video_run_keeps_each_frames_own_time_in_the_trajectory(tmp_path, capsys):
    """The TUM trajectory of a video is stamped with the kept frames' presentation times:
    every other frame of a 10 fps clip is 0.2 s apart. (Numbering by --fps, as before,
    ignored --stride and the rounding of the sampling interval.) Every frame is kept with
    --fps None."""
    av = pytest.importorskip("av")
    clip = tmp_path / "clip.mkv"
    photos_dir = photos(tmp_path, 7)
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("ffv1", rate=10)
        stream.width, stream.height, stream.pix_fmt = 168, 126, "bgr0"
        for path in sorted(photos_dir.glob("*.png")):
            pixels = np.asarray(Image.open(path).convert("RGB").resize((168, 126)))
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    out = tmp_path / "run"
    assert run_cli(str(clip), "--out", str(out), "--fps", "None", "--stride", "2", "--formats", "tum") == 0
    rows = np.loadtxt(out / "trajectory_tum.txt", comments="#")
    np.testing.assert_allclose(rows[:, 0], [0.0, 0.2, 0.4, 0.6], atol=1e-6)
    # A video file is not live: its header's length sets the reference's keyframe rule
    # (ceil(4 / 320) = 1, every frame stored), not the motion-based one.
    assert json.loads((out / "run.json").read_text())["config"]["keyframe_interval"] == 1


def test_no_input_is_told_what_to_give(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path / "o"), "--model", "tiny", "--quiet"]) != 0
    assert "no input: give a folder, video, glob, webcam index or URL (or --demo)" in capsys.readouterr().err


def test_the_command_line_tells_its_version(capsys):
    import mapstream

    for flag in ("--version", "-V"):
        assert main([flag]) == 0
        assert capsys.readouterr().out.strip() == f"mapstream {mapstream.__version__}"


def test_a_windowed_run_is_the_reference_windowed_inference(tmp_path):
    """`--mode windowed` with --overlap-keyframes gives what the offline `inference_windowed`
    (the reference's stitch) gives for the same settings: 10 photos, windows of 4 stored
    frames, an overlap of 3 keyframes of interval 1 (3 frames, so that the windows advance one
    frame at a time and most frames lie in several windows), joined as the reference joins
    (`--window-join anchor`). `--shared-from earlier` is the online session's default instead,
    which differs on the shared frames; and an overlap of 2 frames differs again. The default
    join (shared) gives what `windowed_inference` gives with it, and other poses."""
    import torch

    import mapstream
    from mapstream.windowed import WindowedSession

    src = photos(tmp_path, 10)
    options = ["--mode", "windowed", "--window-size", "4", "--overlap-keyframes", "3", "--keyframe-interval", "1",
               "--window-join", "anchor"]
    got = {}
    for shared_from in ("later", "earlier"):
        out = tmp_path / shared_from
        assert run_cli(str(src), "--out", str(out), "--formats", "npz", *options, "--shared-from", shared_from) == 0
        got[shared_from] = np.load(out / "predictions.npz")
        config = json.loads((out / "run.json").read_text())["config"]
        assert config["overlap_keyframes"] == 3 and config["shared_from"] == shared_from
        assert config["window_join"] == "anchor"
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", kv_cache_scale_frames=2)).eval()
    frames = mapstream.load_images(sorted(src.glob("*.png")), image_size=140)
    offline = model.inference_windowed(frames, window_size=4, overlap_size=3, num_scale_frames=2, keyframe_interval=1)
    np.testing.assert_allclose(got["later"]["pose_enc"], unit_quaternion_encoding(offline["pose_enc"][0]).numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["later"]["depth"], offline["depth"][0, ..., 0].numpy(), rtol=1e-4, atol=1e-5)

    def session_poses(**options):
        with WindowedSession(model, window_size=4, num_scale_frames=2, window_join="anchor", **options) as session:
            preds = session.run_frames(frames)
            pose = unit_quaternion_encoding(torch.stack([p.pose_enc for p in preds]))  # as the run stores it
            return session.overlap, pose, torch.stack([p.depth for p in preds])

    overlap, pose, depth = session_poses(overlap_keyframes=3, shared_from="earlier")
    assert overlap == 3
    np.testing.assert_allclose(got["earlier"]["pose_enc"], pose.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["earlier"]["depth"], depth.numpy(), rtol=1e-4, atol=1e-5)
    # The first window's own frames agree; the frames it shares with the next do not.
    np.testing.assert_allclose(got["earlier"]["pose_enc"][:1], got["later"]["pose_enc"][:1], rtol=1e-4, atol=1e-5)
    assert not np.allclose(got["earlier"]["pose_enc"][1:4], got["later"]["pose_enc"][1:4], atol=1e-4)
    assert not torch.allclose(session_poses(overlap=2, shared_from="earlier")[1], pose, atol=1e-4)

    shared = tmp_path / "shared"
    assert run_cli(str(src), "--out", str(shared), "--formats", "npz", *options[:-2]) == 0
    assert json.loads((shared / "run.json").read_text())["config"]["window_join"] == "shared"
    joined = mapstream.windowed_inference(model, frames, model.stream_config.with_settings(
        window_size=4, overlap=3, num_scale_frames=2, keyframe_interval=1, window_join="shared"))
    np.testing.assert_allclose(np.load(shared / "predictions.npz")["pose_enc"],
                               unit_quaternion_encoding(joined["pose_enc"][0]).numpy(),
                               rtol=1e-4, atol=1e-5)
    assert not np.allclose(np.load(shared / "predictions.npz")["pose_enc"], got["later"]["pose_enc"], atol=1e-4)


def test_a_windowed_run_folder_from_before_shared_from_resumes_only_as_earlier(tmp_path):
    """Before --shared-from, windowed runs emitted shared frames from the earlier window, and
    before --window-join they joined windows on their last shared frame: such a folder resumes
    with --shared-from earlier --window-join anchor and starts over with the defaults (later,
    shared) or with either one alone."""
    src = photos(tmp_path, 6)
    out = tmp_path / "out"
    args = ["--out", str(out), "--formats", "npz", "--mode", "windowed", "--window-size", "4", "--overlap", "2"]

    def older():
        progress = json.loads((out / "progress.json").read_text())
        progress["config"].pop("shared_from", None)
        progress["config"].pop("window_join", None)
        (out / "progress.json").write_text(json.dumps(progress))

    def new_frames(*options) -> int:
        assert run_cli(str(src), *args, *options) == 0
        return json.loads((out / "run.json").read_text())["new_frames"]

    as_before = ("--shared-from", "earlier", "--window-join", "anchor")
    assert new_frames(*as_before) == 6
    older()
    assert new_frames(*as_before) == 0
    for one_of_them in (as_before[:2], as_before[2:]):
        older()
        assert new_frames(*one_of_them) == 6
    older()
    assert new_frames() == 6
    assert new_frames() == 0


def test_max_points_caps_the_point_cloud_of_a_run(tmp_path):
    from plyfile import PlyData

    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path, 3)), "--out", str(out), "--formats", "ply", "--max-points", "500") == 0
    assert len(PlyData.read(str(out / "points.ply"))["vertex"].data) == 500


def test_a_confidence_percentile_thins_the_point_cloud(tmp_path):
    """--conf-percentile 50 keeps the pixels at or above the run's median confidence (on top of
    --conf-threshold, here 0 so that it alone decides): half the valid pixels, give or take ties."""
    from plyfile import PlyData

    src = photos(tmp_path, 4)
    counts = {}
    for extra in ((), ("--conf-percentile", "50")):
        out = tmp_path / f"out{len(extra)}"
        assert run_cli(str(src), "--out", str(out), "--formats", "ply", "--conf-threshold", "0", *extra) == 0
        counts[len(extra)] = len(PlyData.read(str(out / "points.ply"))["vertex"].data)
    assert 0.45 < counts[2] / counts[0] < 0.55, counts


def test_pad_preprocessing_and_a_white_backdrop_filter_leave_the_padding_out(tmp_path):
    """--preprocess pad pads landscape photos with white rows to a square; with
    --drop-white-background those rows, and any near-white pixel of the photos, make no point."""
    from plyfile import PlyData

    src = photos(tmp_path, 3)
    counts = {}
    for extra in ((), ("--drop-white-background",)):
        out = tmp_path / f"out{len(extra)}"
        assert run_cli(str(src), "--out", str(out), "--formats", "ply", "npz", "--conf-threshold", "0",
                       "--preprocess", "pad", *extra) == 0
        counts[len(extra)] = len(PlyData.read(str(out / "points.ply"))["vertex"].data)
        images = np.load(out / "predictions.npz")["images"]
    white = (images > 240).all(-1)
    assert white.any() and counts[0] - counts[1] == white.sum(), counts  # every pixel has a depth here


def test_a_run_can_turn_its_frames(tmp_path):
    """--rotate 90 turns every frame clockwise before preprocessing: landscape photos become
    portrait ones, cropped to 140 x 140, and the run records it."""
    import torch

    from mapstream.io import preprocess_image
    from mapstream.io.sources import _CLOCKWISE

    src = photos(tmp_path, 3)
    out = tmp_path / "out"
    assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--rotate", "90") == 0
    images = np.load(out / "predictions.npz")["images"]
    first = Image.open(sorted(src.glob("*.png"))[0]).convert("RGB")
    assert first.width > first.height and images.shape == (3, 140, 140, 3)
    want = preprocess_image(first.transpose(_CLOCKWISE[90]), "crop", 140)
    np.testing.assert_array_equal(images[0], (want.permute(1, 2, 0) * 255 + 0.5).to(dtype=torch.uint8).numpy())
    assert json.loads((out / "run.json").read_text())["config"]["rotate"] == 90


def test_one_input_named_three_ways_is_one_run(tmp_path, monkeypatch):
    """`frames`, `./frames` and the absolute path are the same input: a rerun resumes (it used
    to start over and delete the finished frames), also from a folder that recorded the
    input as it was typed."""
    src = photos(tmp_path, 4)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"

    def new_frames(spec) -> int:
        assert run_cli(spec, "--out", str(out), "--formats", "npz") == 0
        return json.loads((out / "run.json").read_text())["new_frames"]

    assert new_frames("frames") == 4
    assert new_frames("./frames") == 0
    assert new_frames(str(src)) == 0
    progress = json.loads((out / "progress.json").read_text())
    assert progress["config"]["input"] == str(src.resolve())
    progress["config"]["input"] = "frames"  # as earlier versions recorded it
    (out / "progress.json").write_text(json.dumps(progress))
    assert new_frames("./frames/") == 0


def test_time_in_the_frame_callback_is_not_the_runs(tmp_path):
    """A slow `on_frame` (a live view's copies, say) is timed on its own: the run's FPS and its
    inference time leave it out."""
    import time

    from mapstream.config import StreamConfig
    from mapstream.pipeline import RunOptions, run

    seen = []

    def slow(pred, frame, index):
        seen.append(index)
        time.sleep(0.25)

    summary = run(RunOptions(input=str(photos(tmp_path, n=4)), out=tmp_path / "out", model="tiny", image_size=140,
                             stream=StreamConfig(num_scale_frames=2), formats=("npz",)), progress=False, on_frame=slow)
    timings = json.loads((tmp_path / "out" / "run.json").read_text())["timings_s"]
    assert seen == [0, 1, 2, 3]
    assert 4 * 0.25 <= timings["on_frame"] < 4 * 0.25 + 0.5
    assert summary.fps == pytest.approx(4 / timings["inference"], rel=1e-6)


def test_a_rerun_removes_the_earlier_runs_files_it_does_not_write(tmp_path, monkeypatch, capsys, caplog):
    """A run into a folder holding another run's outputs removes the files of the formats it
    does not write again, also with a relative --out: the table's files, and per-frame files
    by the frame names of its own input (a frame no longer in the input keeps its files, and
    they are told). It never deletes a folder that still holds other files (the user's), nor
    the input, nor what no run wrote; a per-frame folder left empty goes. The usual dataset
    layout, the input in OUT/images, keeps every photo."""
    import logging

    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "a"
    src = photos(tmp_path, 4)
    assert run_cli(str(src), "--out", str(out), "--formats", "npz", "ply", "depth", "images", "colmap") == 0
    assert (out / "points.ply").exists() and len(list((out / "images").glob("*.png"))) == 4
    assert (out / "sparse" / "0" / "images.txt").exists()
    (out / "notes.txt").write_text("mine")
    (out / "images" / "mine.png").write_bytes(b"not ours")
    assert run_cli(str(src), "--out", str(out), "--formats", "npz", "depth") == 0
    assert not (out / "points.ply").exists()  # a file of the earlier run: removed
    assert not (out / "sparse").exists()  # COLMAP's model (it named the images): its files, then its folders
    # its frames' images too; the folder stays for the user's file in it
    assert sorted(p.name for p in (out / "images").iterdir()) == ["mine.png"]
    assert (out / "notes.txt").read_text() == "mine"
    info = json.loads((out / "run.json").read_text())
    assert sorted(info["outputs"]) == ["depth", "depth_preview", "npz"]
    assert info["frame_stems"] == ["000000", "000001", "000002", "000003"]

    # Fewer frames: the depth maps of this input's frames are rewritten; that of the frame gone
    # is no name of this input, so it stays (the folder's other files are told).
    (src / "000003.png").unlink()
    (out / "depth" / "mine.png").write_bytes(b"not ours either")
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(src), "--out", str(out), "--formats", "npz", "depth", "--no-resume") == 0
    assert f"{out / 'depth'} holds 2 files this run did not write (000003.png, mine.png)" in caplog.text
    assert sorted(p.name for p in (out / "depth").iterdir()) == [
        "000000.png", "000001.png", "000002.png", "000003.png", "mine.png"]
    # No depth this time: the earlier run's depth files of this input's frames go.
    assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--no-resume") == 0
    assert sorted(p.name for p in (out / "depth").iterdir()) == ["000003.png", "mine.png"]
    assert sorted(p.name for p in (out / "depth_preview").iterdir()) == ["000003.png"]

    # The usual dataset layout, photos in DATASET/images: refused as an output folder (its
    # exports would write DATASET/images), every photo untouched.
    dataset = tmp_path / "dataset"
    (dataset / "images").mkdir(parents=True)
    for p in sorted(src.glob("*.png")):
        shutil.copy(p, dataset / "images" / p.name)
    before = {p.name: p.read_bytes() for p in (dataset / "images").iterdir()}
    assert run_cli(str(dataset / "images"), "--out", str(dataset), "--formats", "npz") == 2
    assert "lies in the output folder's images/" in capsys.readouterr().err
    assert run_cli(str(dataset / "images" / "*.png"), "--out", str(dataset), "--formats", "npz") == 2  # a glob there
    assert "one of the folders its exports write frame by frame" in capsys.readouterr().err
    assert run_cli(str(tmp_path / "*" / "images" / "*.png"), "--out", str(dataset), "--formats", "npz") == 2  # or from above
    assert "one of the folders its exports write frame by frame" in capsys.readouterr().err
    linked = tmp_path / "linked"
    shutil.copytree(dataset / "images", linked / "raw")
    (linked / "images").symlink_to(linked / "raw")  # the exports' images/ is a link to the photos
    assert run_cli(str(linked / "raw"), "--out", str(linked), "--formats", "npz") == 2
    assert "lies in the output folder's images/" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (dataset / "images").iterdir()} == before


def test_a_glob_input_stays_apart_from_the_outputs_and_their_cleanup(tmp_path, monkeypatch, capsys):
    """A glob over the folder that holds the output folder: a rerun there still removes the
    earlier run's files (the photos it reads are never touched); a recursive glob that would
    read the earlier run's outputs back as frames is refused, saying so."""
    src = photos(tmp_path, 4)
    monkeypatch.chdir(src)
    assert run_cli("*.png", "--out", "sub", "--formats", "npz", "depth", "images") == 0
    assert len(list(Path("sub", "images").iterdir())) == 4
    assert run_cli("*.png", "--out", "sub", "--formats", "npz") == 0
    assert not Path("sub", "images").exists() and not Path("sub", "depth").exists()
    assert sorted(p.name for p in src.glob("*.png")) == ["000000.png", "000001.png", "000002.png", "000003.png"]
    assert run_cli(str(src / "**" / "*.png"), "--out", str(src / "out"), "--formats", "npz", "images") == 0
    capsys.readouterr()
    assert run_cli(str(src / "**" / "*.png"), "--out", str(src / "out"), "--formats", "npz", "images") == 2
    assert "the run would read its own outputs as frames" in capsys.readouterr().err


def test_removing_an_earlier_runs_files_never_follows_a_link_and_survives_a_file_that_cannot_go(
        tmp_path, monkeypatch, caplog):
    """A per-frame name of the format table that is now a link (to the user's photo, inside
    the output folder or not) is left, link and target, and so is what a per-frame folder
    that is a link holds; a file whose removal fails is told and the rest still go."""
    import logging

    from mapstream.pipeline.outputs import format_paths, remove_files

    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    (out / "depth").mkdir()
    (out / "photos").mkdir()
    (out / "photos" / "a.png").write_bytes(b"user photo")
    (out / "images" / "a.png").symlink_to(out / "photos" / "a.png")
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"user file")
    (out / "images" / "b.png").symlink_to(outside)
    for name in ("c", "d", "e"):
        (out / "depth" / f"{name}.png").write_bytes(b"ours")
    (out / "raw").mkdir()
    (out / "raw" / "c.png").write_bytes(b"user photo")
    (out / "masks").symlink_to(out / "raw")  # a per-frame folder that is a link: never entered
    files, _ = format_paths(out, ["images", "depth", "nerfstudio"], ["a", "b", "c", "d", "e"])
    real_unlink = Path.unlink

    def unlink(path, *args, **kwargs):
        if path.name == "d.png":
            raise PermissionError("read-only")
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    with caplog.at_level(logging.WARNING, logger="mapstream.pipeline.outputs"):
        assert remove_files(out, files) == 2
    assert (out / "photos" / "a.png").read_bytes() == b"user photo" and outside.read_bytes() == b"user file"
    assert (out / "images" / "a.png").is_symlink() and (out / "images" / "b.png").is_symlink()
    assert (out / "raw" / "c.png").read_bytes() == b"user photo" and (out / "masks").is_symlink()
    assert sorted(p.name for p in (out / "depth").iterdir()) == ["d.png"]
    assert "could not remove" in caplog.text and "d.png" in caplog.text


def test_a_resume_refuses_an_input_whose_finished_frames_changed(tmp_path, monkeypatch, capsys):
    """Frames added after the finished ones resume; a frame inserted among them (another order)
    is refused with what to do, the finished frames left as they were."""
    from mapstream import session as session_module

    src = photos(tmp_path, 6)
    out = tmp_path / "out"
    real_step = interrupt_at_step(monkeypatch, 5)
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 130
    monkeypatch.setattr(session_module.Session, "step", real_step)
    finished = json.loads((out / "progress.json").read_text())["frames"]
    assert finished == 4
    capsys.readouterr()
    shutil.copy(src / "000000.png", src / "000000a.png")  # sorts second
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 2
    err = capsys.readouterr().err
    assert "its frame 1 was '000001.png', now it is '000000a.png'" in err and "--no-resume" in err
    assert json.loads((out / "progress.json").read_text())["frames"] == finished
    (src / "000000a.png").unlink()
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("000002.png", "000003.png", "000004.png", "000005.png"):  # the finished frames' tail
        shutil.move(src / name, moved / name)
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 2
    assert "it has 2 frames, that run finished 4 (frames removed?)" in capsys.readouterr().err
    for p in moved.iterdir():
        shutil.move(p, src / p.name)
    shutil.copy(src / "000000.png", src / "000009.png")  # after the finished frames: resumes
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 0
    info = json.loads((out / "run.json").read_text())
    assert info["resumed_from"] == 4 and info["frames"] == 7


def test_inputs_found_by_the_input_audit_are_told_clearly(tmp_path, capsys):
    """The output folder as the input folder is refused (a second run would read summary.png as
    a frame); a missing input leaves no output folder behind; a camcorder .MTS file is a video."""
    src = photos(tmp_path, 3)
    assert run_cli(str(src), "--out", str(src)) == 2
    assert "the output folder is the input folder" in capsys.readouterr().err
    missing = tmp_path / "missing"
    assert run_cli(str(missing), "--out", str(tmp_path / "never")) == 2
    assert "not found" in capsys.readouterr().err.lower() and not (tmp_path / "never").exists()

    import av

    video = tmp_path / "clip.MTS"
    with av.open(str(video), "w", format="mpegts") as container:
        stream = container.add_stream("mpeg2video", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 40 * i, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    assert run_cli(str(video), "--out", str(tmp_path / "mts"), "--formats", "npz", "--fps", "None") == 0
    assert len(np.load(tmp_path / "mts" / "predictions.npz")["depth"]) == 4


def test_a_second_run_into_a_folder_in_use_is_refused(tmp_path, capsys):
    """While a run works in a folder (the lock on its .lock file is held), another run there is
    refused with the holder named, before its model loads; once the first ends, runs go on.
    No format at all is refused as well, before any work."""
    import subprocess
    import sys

    src = photos(tmp_path, 2)
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"f = open({str(out / '.lock')!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write('pid 4242'); f.flush()\n"
        "print('held', flush=True); time.sleep(60)"
    )], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 2
        assert "another mapstream run (pid 4242) is writing to" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 0
    assert run_cli(str(src), "--out", str(out), "--formats", "npz") == 0  # released after each run
    assert main(["run", str(src), "--out", str(out), "--model", "tiny", "--formats"]) == 2
    assert "no output format given" in capsys.readouterr().err


def test_provisional_predictions_are_told_to_have_no_effect_and_the_run_writes_the_final_ones(tmp_path, caplog):
    """`--provisional` is a stream setting for live displays; a run says it has no effect and
    writes the same predictions as without it (it crashed on the provisional ones)."""
    src = photos(tmp_path, 4)
    outputs = {}
    for flags in ([], ["--provisional"]):
        out = tmp_path / ("provisional" if flags else "plain")
        with caplog.at_level("WARNING"):
            assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--num-scale-frames", "2", *flags) == 0
        outputs[bool(flags)] = np.load(out / "predictions.npz")["pose_enc"]
    assert "provisional=True has no effect in a run" in caplog.text
    np.testing.assert_array_equal(outputs[True], outputs[False])


def _tiny_file_recording_width(path: Path, width: str | None, **records: str) -> Path:
    import mapstream
    from safetensors.torch import save_file

    model = mapstream.fill_synthetic_(mapstream.build_model("tiny"))
    metadata = {"preset": "tiny", **records} if width is None else {"preset": "tiny", "image_size": width, **records}
    save_file(dict(model.state_dict()), str(path), metadata=metadata)
    return path


def test_a_run_that_gives_no_width_takes_the_one_its_weights_record(tmp_path, capsys, caplog):
    """A checkpoint that records the width it was trained at (mapstream train's exports,
    the shipped small model) is run at that width unless --image-size says otherwise; one
    that records none at the official 518. run.json records the width used."""
    frames = photos(tmp_path, n=3)
    recorded = _tiny_file_recording_width(tmp_path / "w112.safetensors", "112")
    base = ["run", str(frames), "--model", str(recorded), "--num-scale-frames", "2", "--quiet", "--formats", "npz"]
    with caplog.at_level(logging.INFO, logger="mapstream.pipeline.run"):
        assert main([*base, "--out", str(tmp_path / "own")]) == 0
    assert "frames 112 pixels wide, the width the model was trained at" in caplog.text
    npz = np.load(tmp_path / "own" / "predictions.npz")
    assert npz["images"].shape[2] == 112 and npz["depth"].shape[2] == 112
    assert json.loads((tmp_path / "own" / "run.json").read_text())["config"]["image_size"] == 112
    assert main([*base, "--out", str(tmp_path / "given"), "--image-size", "140"]) == 0
    assert np.load(tmp_path / "given" / "predictions.npz")["images"].shape[2] == 140
    plain = _tiny_file_recording_width(tmp_path / "plain.safetensors", None)
    assert main([*base[:3], str(plain), *base[4:], "--out", str(tmp_path / "plain"), "--first-k", "2"]) == 0
    assert json.loads((tmp_path / "plain" / "run.json").read_text())["config"]["image_size"] == 518
    capsys.readouterr()


def test_a_run_of_weights_that_record_their_clip_length_windows_longer_inputs(tmp_path, caplog):
    """Weights that record the most frames one training clip held (5 here) run an input of more
    frames in windows of that many stored frames (`--mode auto`, the default), exactly as
    `--mode windowed --window-size 5` runs it; an input within it streams through one cache, as
    `--mode streaming`; `--mode streaming` on the longer input stores every ceil(8 / 5)-th
    frame. run.json records the mode and settings the run used."""
    frames = photos(tmp_path, n=8)
    weights = _tiny_file_recording_width(tmp_path / "v5.safetensors", None, trained_views="5")
    base = ["run", str(frames), "--model", str(weights), "--num-scale-frames", "2", "--overlap", "2", "--quiet",
            "--formats", "npz", "--image-size", "70"]

    def ran(name, *flags):
        assert main([*base, "--out", str(tmp_path / name), *flags]) == 0
        config = json.loads((tmp_path / name / "run.json").read_text())["config"]
        return config, np.load(tmp_path / name / "predictions.npz")["pose_enc"]

    with caplog.at_level(logging.INFO, logger="mapstream.pipeline.run"):
        config, auto = ran("auto")
    assert "clips of at most 5 frames and the input has 8: windows of 5 stored frames" in caplog.text
    assert (config["mode"], config["window_size"], config["keyframe_interval"]) == ("windowed", 5, 1)
    config, windowed = ran("windowed", "--mode", "windowed", "--window-size", "5")
    assert (config["mode"], config["window_size"]) == ("windowed", 5)
    np.testing.assert_array_equal(auto, windowed)
    config, short = ran("short", "--first-k", "5")
    assert (config["mode"], config["keyframe_interval"], len(short)) == ("streaming", 1, 5)
    np.testing.assert_array_equal(short, ran("short_streaming", "--first-k", "5", "--mode", "streaming")[1])
    config, _ = ran("streaming", "--mode", "streaming")
    assert (config["mode"], config["keyframe_interval"]) == ("streaming", 2)


def test_a_rerun_with_another_cache_storage_computes_every_frame_again(tmp_path):
    """Frames streamed through an FP8 cache are not resumed by a run with the plain cache (or
    the other way round): the settings a resume must share include the cache's storage."""
    frames = photos(tmp_path, n=3)
    out = tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--kv-dtype", "fp8", "--formats", "npz") == 0
    assert json.loads((out / "run.json").read_text())["config"]["kv_dtype"] == "fp8"
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["kv_dtype"] == "auto" and info["new_frames"] == 3 and info["resumed_from"] == 0
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0  # the same settings: nothing new
    assert json.loads((out / "run.json").read_text())["new_frames"] == 0
