"""The run's frame store: frames' own times reach the reconstruction, and a run folder
written before frames had times still resumes and assembles."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from mapstream.pipeline.frame_store import FrameStore, stored_scale_frames


def record(index: int, time: float, scale_frame: bool = False) -> dict:
    return {
        "image": np.full((4, 6, 3), index, np.uint8), "depth": np.ones((4, 6), np.float32),
        "depth_conf": np.ones((4, 6), np.float32), "T_world_cam": np.eye(4, dtype=np.float32)[:3],
        "K": np.eye(3, dtype=np.float32), "pose_enc": np.zeros(9, np.float32), "keyframe": True,
        "scale_frame": scale_frame, "index": index, "name": f"f{index}", "time": time,
    }


def test_frames_own_times_become_the_timestamps_and_missing_ones_fall_back_to_the_rate(tmp_path):
    timed = FrameStore(tmp_path / "timed", {"c": 1})
    for i, t in enumerate((0.0, 0.25, 0.75)):
        timed.add(record(i, t))
    np.testing.assert_array_equal(timed.assemble(fps=10).timestamps, [0.0, 0.25, 0.75])
    untimed = FrameStore(tmp_path / "untimed", {"c": 1})
    for i in range(3):
        untimed.add(record(i, float("nan")))
    np.testing.assert_allclose(untimed.assemble(fps=10).timestamps, [0.0, 0.1, 0.2])


def test_a_store_written_before_frames_had_times_resumes(tmp_path):
    store = FrameStore(tmp_path, {"c": 1}, shard_frames=2)
    for i in range(2):
        store.add(record(i, 0.5 * i, scale_frame=True))
    store.flush()
    shard = next((tmp_path / ".frames").glob("shard_*.npz"))
    with np.load(shard) as data:
        old = {key: data[key] for key in data.files if key not in ("time", "scale_frame")}
    np.savez(shard, **old)  # as an earlier version wrote it
    resumed = FrameStore(tmp_path, {"c": 1})
    assert resumed.finished == 2
    assert np.isnan(resumed.last_records(1)[0]["time"])
    resumed.add(record(2, 1.0, scale_frame=True))
    recon = resumed.assemble(fps=4)
    np.testing.assert_allclose(recon.timestamps, [0.0, 0.25, 0.5])  # not every frame has a time
    assert recon.names == ["f0", "f1", "f2"]
    # Frames stored before the scale-frame marks read as unmarked.
    np.testing.assert_array_equal(resumed.scale_frames(), [False, False, True])


def test_the_window_join_marks_come_back_from_every_shard(tmp_path):
    store = FrameStore(tmp_path, {"c": 1}, shard_frames=3)
    marks = [True, True, False, False, False, True, True, False]
    for i, mark in enumerate(marks):
        store.add(record(i, float(i), scale_frame=mark))
    store.flush()
    assert len(list((tmp_path / ".frames").glob("shard_*.npz"))) == 3
    np.testing.assert_array_equal(FrameStore(tmp_path, {"c": 1}).scale_frames(), marks)
    np.testing.assert_array_equal(stored_scale_frames(tmp_path), marks)  # read without the run's settings
    assert [bool(r["scale_frame"]) for r in store.last_records(3)] == marks[-3:]


def _three_shards(folder):
    store = FrameStore(folder, {"c": 1}, shard_frames=2)
    for i in range(6):
        store.add(record(i, float(i)))
    store.flush()
    return sorted((folder / ".frames").glob("shard_*.npz"))


def test_a_folder_damaged_by_an_interruption_resumes_what_is_intact(tmp_path):
    """A run killed mid-write may leave a shard cut short, its temp file, or a progress record
    that is not one: the next run keeps the intact shards before the damage, computes the
    rest again, and cleans the temp files (each once a traceback, or frames lost)."""
    import json

    shards = _three_shards(tmp_path / "cut")
    shards[1].write_bytes(shards[1].read_bytes()[:100])  # cut short
    (tmp_path / "cut" / ".frames" / ".shard_000003.npz.tmp-1a2b3c4d.npz").write_bytes(b"half")
    resumed = FrameStore(tmp_path / "cut", {"c": 1})
    assert resumed.finished == 2 and [r["index"] for r in resumed.last_records(2)] == [0, 1]
    assert not list((tmp_path / "cut" / ".frames").glob(".*tmp*"))
    for i in range(2, 4):
        resumed.add(record(i, float(i)))
    assert resumed.assemble().names == ["f0", "f1", "f2", "f3"]

    for name, text in [("json", "{not json"), ("list", "[]"), ("entry", None)]:
        folder = tmp_path / name
        _three_shards(folder)
        progress = folder / "progress.json"
        if text is None:  # a shard entry without its names
            record_ = json.loads(progress.read_text())
            del record_["shards"][1]["names"]
            text = json.dumps(record_)
        progress.write_text(text)
        again = FrameStore(folder, {"c": 1})
        assert again.finished == (2 if name == "entry" else 0), name


def test_a_run_with_other_settings_keeps_the_earlier_runs_frames_until_it_has_its_own(tmp_path):
    """A rerun into the same folder with another configuration (or --no-resume) starts over,
    but the earlier run's finished frames stay resumable until the new run writes frames of
    its own: stopped before that, nothing was lost. Once it writes, no run of the old
    configuration reads its shards as the old run's."""
    _three_shards(tmp_path)
    other = FrameStore(tmp_path, {"c": 2}, shard_frames=2)
    assert other.finished == 0
    assert len(list((tmp_path / ".frames").glob("shard_*.npz"))) == 3
    fresh = FrameStore(tmp_path, {"c": 1}, resume=False)
    assert fresh.finished == 0
    old = FrameStore(tmp_path, {"c": 1})  # the new runs wrote nothing: the old one resumes whole
    assert old.finished == 6 and [r["index"] for r in old.last_records(6)] == list(range(6))

    other = FrameStore(tmp_path, {"c": 2}, shard_frames=2)
    other.add(record(10, 0.0))
    other.add(record(11, 1.0))  # a full shard: written
    assert [p.name for p in (tmp_path / ".frames").glob("shard_*.npz")] == ["shard_000000.npz"]
    assert FrameStore(tmp_path, {"c": 1}).finished == 0  # the old configuration starts over
    resumed = FrameStore(tmp_path, {"c": 2})
    assert resumed.finished == 2 and resumed.assemble().names == ["f10", "f11"]


def _flip_a_byte(shard):
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def _rewrite(shard, change):
    with np.load(shard) as data:
        arrays = {key: data[key] for key in data.files}
    change(arrays)
    with open(shard, "wb") as f:
        np.savez(f, **arrays)


SHARD_DAMAGE = {
    "a flipped byte": _flip_a_byte,
    "a NaN pose": lambda shard: _rewrite(shard, lambda a: a["T_world_cam"].__setitem__((0, 0, 0), np.nan)),
    "a frame fewer": lambda shard: _rewrite(shard, lambda a: a.update({k: v[:1] for k, v in a.items()})),
    "frames of another size": lambda shard: _rewrite(shard, lambda a: a.update(image=a["image"][:, :3])),
    "no index": lambda shard: _rewrite(shard, lambda a: a.pop("index")),
}


@pytest.mark.parametrize("damage", SHARD_DAMAGE)
def test_a_shard_that_does_not_read_back_whole_ends_the_resume_before_it(tmp_path, caplog, damage):
    """Every array of every shard is read and checked on resume (the zip's checksums, the
    arrays, their lengths and frame size, finite cameras): a damaged middle shard is named,
    and the resume keeps the shards before it; the frames from it on are computed again,
    and the store assembles."""
    shards = _three_shards(tmp_path)
    SHARD_DAMAGE[damage](shards[1])
    with caplog.at_level(logging.WARNING):
        resumed = FrameStore(tmp_path, {"c": 1})
    assert f"finished-frames file {shards[1]} cannot be read back" in caplog.text
    assert resumed.finished == 2
    for i in range(2, 4):
        resumed.add(record(i, float(i)))
    recon = resumed.assemble()
    assert recon.names == ["f0", "f1", "f2", "f3"] and recon.images.shape == (4, 4, 6, 3)
