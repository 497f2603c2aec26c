"""Small inputs and the comparison of a job's folder with a single run's."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mapstream.pipeline import RunOptions

# run.json fields that hold times, memory or the folder's own path.
_VARYING = {"fps", "timings_s", "peak_rss_bytes", "peak_gpu_memory_bytes", "outputs"}


def scenes(root: Path, count: int, frames: int = 3) -> list[Path]:
    """``count`` rendered scenes in the benchmark layout under ``root`` (``root/sNN/rgb`` holds
    the frames); returns the frame folders."""
    from mapstream.synthetic import render_sequence, write_sequence

    folders = []
    for i in range(count):
        scene = write_sequence(render_sequence(frames, image_hw=(28, 42), seed=i), root / f"s{i:02d}")
        folders.append(scene / "rgb")
    return folders


def corrupt(root: Path) -> Path:
    """A folder whose only image cannot be read."""
    folder = root / "bad" / "rgb"
    folder.mkdir(parents=True)
    (folder / "000000.png").write_bytes(b"not a png")
    return folder


def options(out: Path, **changes) -> RunOptions:
    """A job's options: the tiny model on the CPU, two scale frames, two small formats."""
    from mapstream import StreamConfig

    settings = {"input": None, "model": "tiny", "image_size": 42, "formats": ("npz", "tum"), "device": "cpu",
                "stream": StreamConfig(num_scale_frames=2), **changes}
    return RunOptions(out=out, **settings)


def solo(folder: Path, out: Path, opts: RunOptions) -> Path:
    """``folder`` run on its own into ``out``, as `mapstream run` does."""
    import dataclasses

    from mapstream.pipeline import run

    run(dataclasses.replace(opts, input=str(folder), out=out), progress=False)
    return out


def assert_same_run(job_folder: Path, solo_folder: Path) -> None:
    """The two run folders hold the same files with the same contents: arrays equal, text
    equal, run.json equal but for times, memory and its own paths. The finished frames'
    store (`.frames/`, progress.json) is split into shards by time: its frames are compared
    joined."""
    files, solo_files = (sorted(p.relative_to(f) for p in f.rglob("*") if p.is_file() and p.parent.name != ".frames")
                         for f in (job_folder, solo_folder))
    assert files == solo_files
    for name in files:
        a, b = job_folder / name, solo_folder / name
        if name.suffix == ".npz":
            _assert_same_arrays(_arrays([a]), _arrays([b]), name)
        elif name.name == "run.json":
            assert _record(a) == _record(b)
        elif name.name == "progress.json":
            assert _progress(a) == _progress(b)
        elif name.name != ".lock":  # the lock names the process that held it
            assert a.read_bytes() == b.read_bytes(), name
    _assert_same_arrays(*(_arrays(sorted((f / ".frames").glob("*.npz"))) for f in (job_folder, solo_folder)), ".frames")


def _arrays(shards: list[Path]) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for shard in shards:
        with np.load(shard) as data:
            for key in data.files:
                parts.setdefault(key, []).append(data[key])
    return {k: np.concatenate(v) if v[0].ndim else np.stack(v) for k, v in parts.items()}


def _assert_same_arrays(a: dict, b: dict, name) -> None:
    assert sorted(a) == sorted(b), name
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}:{key}")


def _progress(path: Path) -> dict:
    info = json.loads(path.read_text())
    shards = info.pop("shards")
    info["names"] = [n for s in shards for n in s["names"]]
    return info


def _record(path: Path) -> dict:
    info = {k: v for k, v in json.loads(path.read_text()).items() if k not in _VARYING}
    info["config"]["options"].pop("out")
    return info
