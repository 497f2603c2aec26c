"""`mapstream view` and `mapstream export` on a run folder say what its records say: a run that
did not finish (which frames it has, how to finish it) and predictions of untrained weights,
on the command line, in the log and at the top of the viewer's panel."""
from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from viewer_synthetic import N, make_recon

from mapstream.cli.main import main as cli_main
from mapstream.viewer import load_run
from mapstream.viewer.run_notes import SMALL_NOTE, UNTRAINED_NOTE, RunNotes, read_run_notes
from mapstream.weights import SMALL_MODEL, SMALL_WARNING

pytest.importorskip("viser")
from mapstream.viewer import ViewerApp  # noqa: E402

CONFIG = {"input": "/data/frames", "model": "/ckpt/lingbot-map-long.pt", "mode": "streaming", "image_size": 518}
"""The run's settings as progress.json records them (run.json adds its options)."""
NAMES = [f"{i:06d}.png" for i in range(8)]


def finished_run(folder: Path, frames: int = N, *, model: str = CONFIG["model"]) -> dict[str, Any]:
    """A run folder as a finished `mapstream run` leaves it: predictions.npz, progress.json
    counting its frames, run.json (written last, no ``state``); returns run.json's record."""
    folder.mkdir(parents=True, exist_ok=True)
    make_recon(n=frames).save_npz(folder / "predictions.npz")
    config = {**CONFIG, "model": model}
    write_progress(folder, config, NAMES[:frames])
    info = {"config": {**config, "options": {"input": "frames", "out": str(folder)}}, "frames": frames,
            "frame_stems": [n.removesuffix(".png") for n in NAMES[:frames]], "outputs": {"npz": "predictions.npz"},
            "warnings": []}
    (folder / "run.json").write_text(json.dumps(info))
    return info


def write_progress(folder: Path, config: dict[str, Any], names: list[str]) -> None:
    shards = [{"file": f"shard_{i:06d}.npz", "frames": 1, "names": [name]} for i, name in enumerate(names)]
    (folder / "progress.json").write_text(json.dumps({"config": config, "frames": len(names), "shards": shards}))


def stopped_while_exporting(folder: Path, info: dict[str, Any], frames: int) -> None:
    """run.json as a run that stopped while writing its outputs leaves it (its stopped-run mark)."""
    entry = {"settings": {**CONFIG, "options": {"input": "/data/more_frames", "out": str(folder)}},
             "formats": ["npz"], "frame_stems": [n.removesuffix(".png") for n in NAMES[:frames]], "since": 1.0}
    (folder / "run.json").write_text(json.dumps(
        {**info, "state": "a run into this folder was writing its outputs and did not finish", "replaced_by": [entry]}))


def test_a_finished_run_has_no_notes(tmp_path: Path) -> None:
    finished_run(tmp_path)
    assert read_run_notes(tmp_path) == read_run_notes(tmp_path / "predictions.npz") == RunNotes()
    assert RunNotes().messages == ()
    assert read_run_notes(tmp_path / "nothing_here") == RunNotes()


def test_a_run_stopped_before_its_exports_is_told_with_its_frames(tmp_path: Path) -> None:
    info = finished_run(tmp_path)
    write_progress(tmp_path, CONFIG, NAMES[:5])  # a rerun over a longer input, stopped after 5 frames
    note = read_run_notes(tmp_path).unfinished
    assert note == (
        f"A run into {tmp_path} did not finish: it stopped after 5 frames (000000.png to 000004.png), kept in "
        f"{tmp_path / '.frames'} but not exported; the outputs here are those of an earlier run (3 frames). To "
        f"finish it, run the same command again: `mapstream run /data/frames ... --out {tmp_path}`, with the "
        "options it had, resumes from the frames it kept."
    )
    # A rerun with other settings that saved as many frames as the finished one: still not it.
    write_progress(tmp_path, {**CONFIG, "image_size": 280}, NAMES[:N])
    assert "did not finish: it stopped after 3 frames" in str(read_run_notes(tmp_path).unfinished)
    # No run.json at all: a first run stopped before its exports.
    (tmp_path / "run.json").unlink()
    assert "the outputs here" not in str(read_run_notes(tmp_path).unfinished)
    assert info["frames"] == N


def test_a_run_stopped_while_exporting_is_told(tmp_path: Path) -> None:
    info = finished_run(tmp_path)
    stopped_while_exporting(tmp_path, info, frames=6)
    assert read_run_notes(tmp_path).unfinished == (
        f"The run in {tmp_path} did not finish: it stopped while writing its outputs after inferring 6 frames "
        "(000000 to 000005), so the files here may mix that run's with an earlier run's. To finish it, run the "
        f"same command again: `mapstream run /data/more_frames ... --out {tmp_path}`, with the options it had, "
        "resumes from the frames it kept."
    )
    stopped_while_exporting(tmp_path, {}, frames=1)  # a first run: no earlier run's files
    assert "after inferring 1 frame (000000), so the files here may be only part of its outputs" in str(
        read_run_notes(tmp_path).unfinished)


def test_untrained_weights_are_told(tmp_path: Path) -> None:
    info = finished_run(tmp_path, model="tiny (synthetic weights)")
    assert read_run_notes(tmp_path) == RunNotes(weights=UNTRAINED_NOTE)
    # Known from the recorded warning alone, or from a stopped run's settings.
    untrained_warning = "USING THE TINY PRESET WITH UNTRAINED (SYNTHETIC) WEIGHTS: ..."
    (tmp_path / "run.json").write_text(json.dumps({**info, "config": CONFIG, "warnings": [untrained_warning]}))
    write_progress(tmp_path, CONFIG, NAMES[:N])
    assert read_run_notes(tmp_path).weights == UNTRAINED_NOTE
    trained = finished_run(tmp_path / "trained")
    assert read_run_notes(tmp_path / "trained").weights is None
    # A rerun on the tiny preset that stopped before its exports: the predictions are still the trained run's.
    write_progress(tmp_path / "trained", {**CONFIG, "model": "tiny (synthetic weights)"}, NAMES[:2])
    notes = read_run_notes(tmp_path / "trained")
    assert notes.weights is None and notes.unfinished is not None
    stopped = copy.deepcopy(trained)
    stopped_while_exporting(tmp_path / "trained", stopped, frames=N)
    marked = json.loads((tmp_path / "trained" / "run.json").read_text())
    marked["replaced_by"][0]["settings"]["model"] = "tiny (synthetic weights)"
    (tmp_path / "trained" / "run.json").write_text(json.dumps(marked))
    assert read_run_notes(tmp_path / "trained").weights == UNTRAINED_NOTE
    # Another .npz file: the folder's records are not about it.
    make_recon().save_npz(tmp_path / "copy.npz")
    assert read_run_notes(tmp_path / "copy.npz") == RunNotes()


def test_the_small_model_is_told(tmp_path: Path) -> None:
    finished_run(tmp_path, model=SMALL_MODEL)
    assert read_run_notes(tmp_path) == RunNotes(weights=SMALL_NOTE)
    # From the recorded warning alone (a run that fell back after the model was named).
    info = finished_run(tmp_path / "fallback")
    (tmp_path / "fallback" / "run.json").write_text(json.dumps({**info, "warnings": [SMALL_WARNING, "other"]}))
    assert read_run_notes(tmp_path / "fallback") == RunNotes(weights=SMALL_NOTE)
    # Untrained weights are the louder note when a stopped run mixed the two.
    stopped = finished_run(tmp_path / "mixed", model=SMALL_MODEL)
    stopped_while_exporting(tmp_path / "mixed", stopped, frames=N)
    marked = json.loads((tmp_path / "mixed" / "run.json").read_text())
    marked["replaced_by"][0]["settings"]["model"] = "tiny (synthetic weights)"
    (tmp_path / "mixed" / "run.json").write_text(json.dumps(marked))
    assert read_run_notes(tmp_path / "mixed").weights == UNTRAINED_NOTE


def test_load_run_logs_the_notes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    info = finished_run(tmp_path, model="tiny (synthetic weights)")
    stopped_while_exporting(tmp_path, info, frames=6)
    with caplog.at_level(logging.WARNING, logger="mapstream.viewer"):
        load_run(tmp_path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and warnings[1] == UNTRAINED_NOTE
    assert warnings[0].startswith(f"The run in {tmp_path} did not finish")
    assert warnings[0].endswith(f"{tmp_path / 'predictions.npz'} holds 3 frames (frame_000.png to frame_002.png).")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mapstream.viewer"):
        load_run(tmp_path, log_notes=False)
    assert caplog.records == []


def test_cli_view_and_export_warn_and_the_page_shows_it(
    tmp_path: Path, free_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    info = finished_run(run, model="tiny (synthetic weights)")
    write_progress(run, {k: v for k, v in info["config"].items() if k != "options"}, NAMES[:7])
    panels: list[tuple[str | None, float, float]] = []
    start = ViewerApp.start

    def recording_start(self: ViewerApp) -> ViewerApp:
        start(self)
        handles = self.handles
        assert handles is not None
        notice = handles.notice
        panels.append((None, 0.0, 0.0) if notice is None else (notice.content, notice.order, handles.status.order))
        return self

    monkeypatch.setattr(ViewerApp, "start", recording_start)
    assert cli_main(["view", str(run), "--no-block", "--port", str(free_port)]) == 0
    err = capsys.readouterr().err
    unfinished = (f"WARNING: A run into {run} did not finish: it stopped after 7 frames (000000.png to 000006.png)")
    assert unfinished in err and f"--out {run}`, with the options it had, resumes" in err
    assert f"{run / 'predictions.npz'} holds 3 frames (frame_000.png to frame_002.png)." in err
    assert f"WARNING: {UNTRAINED_NOTE}" in err
    ((content, notice_order, status_order),) = panels
    assert content is not None and notice_order < status_order  # above everything in the panel
    assert f"**⚠ A run into {run} did not finish" in content and f"**⚠ {UNTRAINED_NOTE}**" in content

    assert cli_main(["export", str(run), "--out", str(tmp_path / "again"), "--formats", "tum", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert unfinished in err and f"WARNING: {UNTRAINED_NOTE}" in err

    finished_run(tmp_path / "fine")  # finished, trained: nothing to say
    assert cli_main(["view", str(tmp_path / "fine"), "--no-block", "--port", str(free_port)]) == 0
    assert "WARNING" not in capsys.readouterr().err and panels[-1][0] is None


def test_a_real_tiny_run_is_told_untrained_and_finished(tmp_path: Path) -> None:
    """The records `mapstream run` writes, read back: a finished run on the tiny preset."""
    from conftest import DATA

    source = sorted((DATA / "courthouse").glob("*.png"))[:3]
    if len(source) < 3:
        pytest.skip("the courthouse photos are not here")
    frames = tmp_path / "frames"
    frames.mkdir()
    for photo in source:
        (frames / photo.name).write_bytes(photo.read_bytes())
    out = tmp_path / "out"
    assert cli_main(["run", str(frames), "--out", str(out), "--model", "tiny", "--image-size", "140",
                     "--num-scale-frames", "2", "--formats", "npz", "--quiet"]) == 0
    assert read_run_notes(out) == RunNotes(weights=UNTRAINED_NOTE)
