"""`mapstream run` and `mapstream export` on requests that ask for less than they seem to, or
for two things at once: a finished run run again, an export into a run's folder, options
the run does not read, a demo given an input (tiny preset, real photos, small frames)."""
from __future__ import annotations

import json
import logging

import numpy as np

from mapstream.cli.main import main
from run_helpers import photos, run_cli


def test_running_a_finished_run_again_infers_nothing_and_writes_the_same_outputs(tmp_path, caplog, monkeypatch):
    frames = photos(tmp_path, 6)
    out = tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "tum") == 0
    first = np.load(out / "predictions.npz")
    from mapstream import session as session_module

    monkeypatch.setattr(session_module.Session, "step", lambda *a, **k: (_ for _ in ()).throw(AssertionError("step")))
    with caplog.at_level(logging.INFO):
        assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "tum") == 0
    assert "all 6 frames of this input were finished by an earlier run" in caplog.text
    assert "resuming after" not in caplog.text
    again = np.load(out / "predictions.npz")
    for key in ("T_world_cam", "depth", "names"):
        assert np.array_equal(first[key], again[key]), key
    info = json.loads((out / "run.json").read_text())
    assert info["resumed_from"] == 6 and info["new_frames"] == 0


def test_a_run_leaves_no_copy_of_its_frames_beside_the_shards(tmp_path):
    """`FrameStore.assemble` copies every frame into one array a field for the exports; the
    copy goes once they are written (the shards keep the frames for a resume)."""
    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path, 4)), "--out", str(out), "--formats", "npz") == 0
    assert not (out / ".frames" / "assembled").exists()
    assert any((out / ".frames").glob("*.npz"))  # the shards


def test_an_export_into_a_run_folder_is_recorded_so_the_next_run_removes_it(tmp_path, caplog):
    """Formats and frames written by `mapstream export` into a run's folder are listed in its
    run.json: a later run of another input removes its formats' files instead of leaving them
    to pass for its own; per-frame files it removes only by the names of its own frames (a
    name read off disk never decides a deletion), and the others are told. An export of fewer
    frames removes the run's other frames' files from the folders it writes."""
    frames = photos(tmp_path, 6)
    out = tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    assert main(["export", str(out), "--formats", "tum", "depth", "--frames", "0:4", "--quiet"]) == 0
    assert sorted(p.name for p in (out / "depth").iterdir()) == [f"{i:06d}.png" for i in range(4)]
    info = json.loads((out / "run.json").read_text())
    assert {"npz", "tum", "depth"} <= set(info["outputs"]) and len(info["frame_stems"]) == 6
    assert main(["export", str(out), "--formats", "depth", "--frames", "0:2", "--quiet"]) == 0
    assert sorted(p.name for p in (out / "depth").iterdir()) == ["000000.png", "000001.png"]

    other = tmp_path / "other"
    other.mkdir()
    for p in sorted(frames.iterdir())[:3]:
        p.rename(other / f"x{p.name}")
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(other), "--out", str(out), "--formats", "npz") == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "depth", "depth_preview", "predictions.npz", "progress.json", "run.json"]
    assert f"{out / 'depth'} holds 2 files this run did not write (000000.png, 000001.png)" in caplog.text


def test_an_export_into_a_folder_without_a_run_records_nothing(tmp_path):
    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path, 3)), "--out", str(out), "--formats", "npz") == 0
    target = tmp_path / "exports"
    assert main(["export", str(out), "--out", str(target), "--formats", "tum", "--quiet"]) == 0
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == ["trajectory_tum.txt"]


def test_options_the_run_does_not_read_are_told(tmp_path, caplog):
    out, src = tmp_path / "out", photos(tmp_path, 3)
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--window-size", "3",
                       "--sky-model", "sky.onnx") == 0
    assert "window_size=3 has no effect without --mode windowed" in caplog.text
    assert "sky_model='sky.onnx' has no effect without --sky-mask" in caplog.text
    assert "overlap=" not in caplog.text  # left at its default: nothing to tell
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # --mode auto may run windows: their overlap is read
        assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--overlap", "2") == 0
    assert "overlap=" not in caplog.text
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(src), "--out", str(out), "--formats", "npz", "--overlap", "2", "--mode", "streaming") == 0
    assert "overlap=2 has no effect without --mode windowed or auto" in caplog.text


def test_the_demo_refuses_an_input_and_records_the_size_it_ran_at(tmp_path, capsys, caplog):
    frames = photos(tmp_path, 3)
    assert main(["run", str(frames), "--demo", "--model", "tiny", "--out", str(tmp_path / "d"), "--quiet"]) == 2
    assert "--demo renders its own frames and reads no input" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    with caplog.at_level(logging.WARNING):
        assert main(["run", "--demo", "--model", "tiny", "--out", str(tmp_path / "d"),
                     "--image-size", "56", "--formats", "npz", "--quiet"]) == 0
    assert "image_size=56 has no effect without an input" in caplog.text
    info = json.loads((tmp_path / "d" / "run.json").read_text())
    assert info["config"]["image_size"] == np.load(tmp_path / "d" / "predictions.npz")["depth"].shape[2] == 294


def test_an_input_file_the_run_would_write_over_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    photo = sorted(photos(tmp_path, 1).iterdir())[0]
    (out / "summary.png").write_bytes(photo.read_bytes())
    assert run_cli(str(out / "summary.png"), "--out", str(out)) == 2
    assert "is a file the run writes in its output folder" in capsys.readouterr().err
    assert (out / "summary.png").read_bytes() == photo.read_bytes()


def test_the_live_view_is_not_started_for_an_input_that_is_not_there(tmp_path, capsys, monkeypatch):
    import mapstream.viewer.live as live

    monkeypatch.setattr(live, "LiveView", lambda *a, **k: (_ for _ in ()).throw(AssertionError("view started")))
    assert run_cli(str(tmp_path / "nope"), "--out", str(tmp_path / "out"), "--view") == 2
    assert "input not found" in capsys.readouterr().err


def test_an_interrupted_export_says_what_an_export_leaves(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run_cli(str(photos(tmp_path, 3)), "--out", str(out), "--formats", "npz") == 0
    import mapstream.export as export

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export_all", interrupted)
    assert main(["export", str(out), "--formats", "tum", "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "interrupted; nothing was left half-written" in err and "resumes" not in err
