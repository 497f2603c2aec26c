"""The run's frame store: frames' own times reach the reconstruction, and a run folder
written before frames had times still resumes and assembles."""
from __future__ import annotations

import numpy as np

from mapstream.pipeline.frame_store import FrameStore


def record(index: int, time: float) -> dict:
    return {
        "image": np.full((4, 6, 3), index, np.uint8), "depth": np.ones((4, 6), np.float32),
        "depth_conf": np.ones((4, 6), np.float32), "T_world_cam": np.eye(4, dtype=np.float32)[:3],
        "K": np.eye(3, dtype=np.float32), "pose_enc": np.zeros(9, np.float32), "keyframe": True,
        "index": index, "name": f"f{index}", "time": time,
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
        store.add(record(i, 0.5 * i))
    store.flush()
    shard = next((tmp_path / ".frames").glob("shard_*.npz"))
    with np.load(shard) as data:
        old = {key: data[key] for key in data.files if key != "time"}
    np.savez(shard, **old)  # as an earlier version wrote it
    resumed = FrameStore(tmp_path, {"c": 1})
    assert resumed.finished == 2
    assert np.isnan(resumed.last_records(1)[0]["time"])
    resumed.add(record(2, 1.0))
    recon = resumed.assemble(fps=4)
    np.testing.assert_allclose(recon.timestamps, [0.0, 0.25, 0.5])  # not every frame has a time
    assert recon.names == ["f0", "f1", "f2"]
