"""Atomic writes keep old files on failure, leave no temp files, and name unwritable folders;
run.json is stable and strict JSON."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from export_synthetic import make_recon

from mapstream.export import (
    atomic_open,
    atomic_path,
    atomic_write_text,
    export_all,
    remove_stale_temp_files,
    write_ply,
    write_run_json,
    write_tum,
)
from mapstream.io.atomic import temp_file_target


def test_atomic_write_replaces_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "note.txt"
    atomic_write_text(target, "first\n")
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"
    assert os.listdir(target.parent) == ["note.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0o600


def test_a_writer_that_makes_its_own_private_file_still_leaves_a_normal_one(tmp_path: Path) -> None:
    target = tmp_path / "w.bin"
    with atomic_path(target) as tmp:  # as safetensors does: a new file of its own, mode 0o600
        tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"weights")
        os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_bytes() == b"weights"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_failure_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "data.bin"
    target.write_bytes(b"old complete file")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_open(target, "wb") as handle:
            handle.write(b"partial new cont")
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old complete file"
    assert os.listdir(tmp_path) == ["data.bin"]
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "new.png") as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".new.png.tmp-")
            tmp.write_bytes(b"x")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["data.bin"]


def test_a_full_disk_is_told_with_the_file_being_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The OS reports ENOSPC without a file name; the error names the output it was writing."""
    import errno

    import plyfile

    def full(self, stream) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(plyfile.PlyData, "write", full)
    with pytest.raises(OSError) as err:
        write_ply(make_recon(), tmp_path / "points.ply")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "points.ply")
    assert str(tmp_path / "points.ply") in str(err.value)
    assert os.listdir(tmp_path) == []


def test_writer_failure_midway_keeps_previous_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import plyfile

    recon = make_recon()
    ply = write_ply(recon, tmp_path / "points.ply")
    before = ply.read_bytes()

    def broken_write(self, stream) -> None:
        stream.write(b"ply\nformat binary_little_endian 1.0\n")  # a partial header, then failure
        raise OSError("no space left on device")

    monkeypatch.setattr(plyfile.PlyData, "write", broken_write)
    with pytest.raises(OSError, match="no space left"):
        write_ply(recon, ply)
    assert ply.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["points.ply"]

    npz = recon.save_npz(tmp_path / "predictions.npz")
    before = npz.read_bytes()

    def broken_savez(file, **arrays) -> None:
        file.write(b"PK\x03\x04 partial zip")
        raise OSError("interrupted")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="interrupted"):
        recon.save_npz(npz)
    assert npz.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["points.ply", "predictions.npz"]


def test_unwritable_output_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    recon = make_recon()
    with pytest.raises(PermissionError, match="cannot create output folder .*a_file"):
        write_tum(recon, blocker / "out" / "traj.txt")
    with pytest.raises(PermissionError, match="a_file"):
        export_all(recon, blocker / "out")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs POSIX permissions, not root")
def test_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            write_tum(make_recon(), folder / "traj.txt")
    finally:
        folder.chmod(0o755)


def test_remove_stale_temp_files(tmp_path: Path) -> None:
    (tmp_path / "depth").mkdir()
    stale = [tmp_path / ".points.ply.tmp-0a1b2c3d.ply", tmp_path / "depth" / ".x.png.tmp-deadbeef.png"]
    for path in stale:
        path.write_bytes(b"half")
    keep = [tmp_path / "points.ply", tmp_path / ".notes.tmp-backup", tmp_path / ".a.txt.tmp-0a1b2c3d.png",
            tmp_path / ".a.txt.tmp-0A1B2C3D.txt", tmp_path / ".b.mp4.tmp-0a1b2c3.mp4"]  # not a temp name of ours
    for path in keep:
        path.write_bytes(b"whole")
    assert sorted(remove_stale_temp_files(tmp_path)) == sorted(stale)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in stale)
    assert temp_file_target(stale[0]) == "points.ply" and temp_file_target(keep[2]) is None
    chosen = [tmp_path / ".c.png.tmp-01234567.png", tmp_path / ".d.mp4.tmp-01234567.mp4"]
    for path in chosen:
        path.write_bytes(b"half")
    assert remove_stale_temp_files(tmp_path, targets=lambda name: name.endswith(".png")) == chosen[:1]
    assert chosen[1].exists()


def test_run_json_is_sorted_strict_and_stable(tmp_path: Path) -> None:
    info = {
        "timings": {"total_s": np.float32(1.5), "per_frame_s": np.array([0.1, 0.2])},
        "fps": float("nan"),
        "config": {"out": tmp_path, "frames": np.int64(12), "keyframes": {3, 1, 2}, "shape": (1, 2)},
        "peak_memory_bytes": 123,
    }
    path = write_run_json(info, tmp_path / "run.json")
    text = path.read_text()
    data = json.loads(text)  # strict: no NaN tokens
    assert "NaN" not in text and data["fps"] is None
    assert list(data) == sorted(data) and list(data["config"]) == sorted(data["config"])
    assert data["config"] == {"frames": 12, "keyframes": [1, 2, 3], "out": str(tmp_path), "shape": [1, 2]}
    assert data["timings"] == {"per_frame_s": [0.1, 0.2], "total_s": 1.5}
    reordered = dict(reversed(list(info.items())))
    assert write_run_json(reordered, tmp_path / "again.json").read_text() == text
    with pytest.raises(TypeError, match="mapping"):
        write_run_json([1, 2], tmp_path / "bad.json")
