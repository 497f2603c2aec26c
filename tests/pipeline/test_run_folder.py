"""The run's output folder (`RunFolder`): a damaged finished-frames shard is computed again, a
run.json found in the folder never names what a run deletes, and a run that fails before its
first frame leaves the folder as it found it (tiny preset, real photos, small frames)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from run_helpers import photos, run_cli


def _flip_a_byte(shard):
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the arrays' bytes: the zip's checksum no longer holds
    shard.write_bytes(bytes(data))


def _cut_short(shard):
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _rewritten(change):
    def damage(shard):
        with np.load(shard) as data:
            arrays = {key: data[key] for key in data.files}
        change(arrays)
        with open(shard, "wb") as f:
            np.savez(f, **arrays)
    return damage


def _rows_cut(arrays):
    for key in arrays:
        arrays[key] = arrays[key][:-1]


def _depth_of_another_size(arrays):
    arrays["depth"] = arrays["depth"][:, :-1]


def _no_pose(arrays):
    del arrays["T_world_cam"]


def _nan_intrinsics(arrays):
    arrays["K"][0, 0, 0] = np.nan


DAMAGE = {
    "a flipped byte": _flip_a_byte, "cut short": _cut_short, "a frame's rows cut": _rewritten(_rows_cut),
    "depth of another size": _rewritten(_depth_of_another_size), "no poses": _rewritten(_no_pose),
    "NaN intrinsics": _rewritten(_nan_intrinsics),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_shard_is_computed_again_and_the_run_equals_an_uninterrupted_one(tmp_path, caplog, damage):
    """A shard that cannot be read back as the frames it holds (a flipped byte, cut short,
    arrays of the wrong length or size, a missing array, NaN intrinsics) is told by name and
    its frames are computed again: the rerun's predictions equal the first run's, bit for bit
    (the first shard is damaged, so the stream starts over as the first run's did)."""
    frames, out = photos(tmp_path, 4), tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    with np.load(out / "predictions.npz") as data:
        first = {key: data[key] for key in data.files}
    shard = out / ".frames" / "shard_000000.npz"
    DAMAGE[damage](shard)
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    assert f"{shard} cannot be read back" in caplog.text
    info = json.loads((out / "run.json").read_text())
    assert info["resumed_from"] == 0 and info["new_frames"] == 4
    with np.load(out / "predictions.npz") as data:
        assert sorted(data.files) == sorted(first)
        for key in data.files:
            np.testing.assert_array_equal(data[key], first[key], err_msg=key)


def test_a_run_json_in_the_output_folder_never_names_what_a_run_deletes(tmp_path):
    """A run.json found in the output folder (crafted, or hand-edited) that lists the user's
    files among its outputs, its frame names or the runs stopped while replacing it: none of
    them is deleted, in the folder, in a per-frame folder or outside it."""
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    mine = {out / "notes.txt": "notes", out / "images" / "my_photo.png": "photo", tmp_path / "outside.txt": "out",
            out / "depth" / "my_depth.png": "depth", out / "sparse" / "0" / "mine.txt": "colmap"}
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (out / "run.json").write_text(json.dumps({
        "config": {"options": {"out": str(out)}},
        "outputs": {"npz": str(out / "notes.txt"), "ply": str(out / "images" / "my_photo.png"),
                    "tum": "../outside.txt", "summary": str(tmp_path / "outside.txt"), "images": str(out / "images"),
                    "depth": str(out / "depth"), "colmap": str(out / "sparse" / "0")},
        "frame_stems": ["my_photo", "my_depth", "../outside", "notes"],
        "replaced_by": [{"formats": ["images", "depth", "colmap"], "frame_stems": ["my_photo", "my_depth"],
                         "since": 0, "settings": {}}],
    }))
    assert run_cli(str(photos(tmp_path, 3)), "--out", str(out), "--formats", "npz") == 0
    assert {path: path.read_text() for path in mine} == mine
    assert (out / "predictions.npz").is_file()


def _fail_at_first_step(monkeypatch):
    from mapstream import session as session_module

    def failing_step(self, frame, **kw):
        raise RuntimeError("the device went away")

    monkeypatch.setattr(session_module.Session, "step", failing_step)


def test_a_run_that_fails_before_its_first_frame_leaves_the_folder_as_it_found_it(tmp_path, monkeypatch, capsys):
    """A folder the run made (parents included) is gone again; a folder that was there keeps
    exactly what it held: no `.lock`, no empty `.frames`."""
    frames = photos(tmp_path, 3)
    _fail_at_first_step(monkeypatch)
    made = tmp_path / "new" / "out"
    assert run_cli(str(frames), "--out", str(made), "--formats", "npz") == 2
    assert "the device went away" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()

    there = tmp_path / "there"
    there.mkdir()
    (there / "notes.txt").write_text("mine")
    assert run_cli(str(frames), "--out", str(there), "--formats", "npz") == 2
    assert sorted(p.name for p in there.iterdir()) == ["notes.txt"]


def test_a_failed_rerun_keeps_the_earlier_runs_folder_as_it_was(tmp_path, monkeypatch):
    """After a finished run, a rerun (other settings) that fails before its first frame leaves
    every file of the earlier run, its lock file and finished frames included, and the
    earlier run still resumes whole."""
    frames, out = photos(tmp_path, 3), tmp_path / "out"
    assert run_cli(str(frames), "--out", str(out), "--formats", "npz") == 0
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with monkeypatch.context() as patched:
        _fail_at_first_step(patched)
        assert run_cli(str(frames), "--out", str(out), "--formats", "npz", "--first-k", "2") == 2
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert json.loads((out / "progress.json").read_text())["frames"] == 3
