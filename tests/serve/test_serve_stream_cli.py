"""`mapstream stream` against a server equals `mapstream run` here: the same model and settings
on the same input write the same files, byte for byte (run.json apart, which records where
and how fast the frames were predicted)."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from mapstream.cli.main import main
from mapstream.pipeline.model_source import resolve_model

from serve_helpers import TOKEN, frames, serving

SETTINGS = ["--image-size", "140", "--num-scale-frames", "3"]


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, image in enumerate(frames(21, 7, hw=(84, 112))):
        Image.fromarray(image).save(folder / f"shot_{i}.png")
    return folder


def _files(folder):
    """The run's files, less its frame store (the shards and progress.json, which lists them):
    how a run cuts its frames into shards follows the time it takes (a slow machine writes
    more, smaller shards), and the frames themselves are compared through predictions.npz and
    the exports."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.relative_to(folder).parts[0] not in (".frames", "progress.json")}


def test_a_remote_run_writes_the_files_of_a_local_run(photos, tmp_path, capsys):
    assert main(["run", str(photos), "--out", str(tmp_path / "local"), "--model", "tiny", *SETTINGS, "--quiet"]) == 0
    model, desc, warnings = resolve_model("tiny", filename="unused", device=torch.device("cpu"),
                                          camera_num_iterations=4)
    (tmp_path / "token").write_text(TOKEN)
    with serving(model, token_file=tmp_path / "token", max_batch=1, model_desc=desc, warnings=warnings) as running:
        assert main(["stream", str(photos), "--to", running.url, "--out", str(tmp_path / "remote"),
                     "--token-file", str(tmp_path / "token"), *SETTINGS, "--quiet"]) == 0
        printed = capsys.readouterr().out
        assert f"on {running.url}" in printed, repr(printed[-400:])
        capsys.readouterr()
        assert main(["stream", str(photos), "--to", running.url, "--out", str(tmp_path / "refused"), *SETTINGS,
                     "--quiet"]) == 2  # no token
        assert "HTTP 401" in capsys.readouterr().err
    local, remote = _files(tmp_path / "local"), _files(tmp_path / "remote")
    assert sorted(local) == sorted(remote) and len(local) > 20
    differ = [str(name) for name in local if local[name] != remote[name]]
    assert differ == ["run.json"]
    local_run, remote_run = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("local", "remote"))
    assert {k: v for k, v in local_run["config"].items() if k != "options"} == {
        k: v for k, v in remote_run["config"].items() if k != "options"}
    assert remote_run["device"] == running.url and remote_run["warnings"] == local_run["warnings"]
    assert not (tmp_path / "refused").exists()


def test_a_remote_run_that_gives_no_width_takes_the_served_models_own(photos, tmp_path, capsys):
    """The server says the width its model's weights were trained at (`image_size` in
    `opened`): `mapstream stream` without --image-size sends frames of that width, and a
    session that asks the server to preprocess without naming a width gets it too."""
    import numpy as np
    from safetensors.torch import save_file

    import mapstream
    from mapstream.client import Client

    path = tmp_path / "w112.safetensors"
    save_file(dict(mapstream.fill_synthetic_(mapstream.build_model("tiny")).state_dict()), str(path),
              metadata={"image_size": "112"})
    model = mapstream.load_model(path, preset="tiny")
    with serving(model, max_batch=1) as running:
        session = Client(running.url).open_session(preprocess={"mode": "crop"})
        assert session.info["image_size"] == 112 and session.info["preprocess"] == {"mode": "crop", "image_size": 112}
        session.close()
        assert main(["stream", str(photos), "--to", running.url, "--out", str(tmp_path / "remote"),
                     "--num-scale-frames", "3", "--quiet", "--formats", "npz"]) == 0
    assert json.loads((tmp_path / "remote" / "run.json").read_text())["config"]["image_size"] == 112
    assert np.load(tmp_path / "remote" / "predictions.npz")["images"].shape[2] == 112
    capsys.readouterr()


def test_a_remote_run_plans_windows_as_the_local_run_of_the_same_weights(photos, tmp_path, capsys):
    """Weights that record training clips shorter than the input: both runs take windows of
    that length (the server plans the session from the input's length, which the remote run
    announces) and write the same files; run.json records the same windows."""
    from safetensors.torch import save_file

    import mapstream
    from mapstream.config import StreamConfig

    weights = tmp_path / "views5.safetensors"
    save_file(dict(mapstream.fill_synthetic_(mapstream.build_model("tiny")).state_dict()), str(weights),
              metadata={"preset": "tiny", "trained_views": "5"})
    assert main(["run", str(photos), "--out", str(tmp_path / "local"), "--model", str(weights), "--overlap", "2",
                 *SETTINGS, "--quiet"]) == 0
    model, desc, warnings = resolve_model(str(weights), filename="unused", device=torch.device("cpu"),
                                          camera_num_iterations=4)
    with serving(model, max_batch=1, stream=StreamConfig(overlap=2), model_desc=desc, warnings=warnings) as running:
        assert main(["stream", str(photos), "--to", running.url, "--out", str(tmp_path / "remote"), *SETTINGS,
                     "--quiet"]) == 0
    capsys.readouterr()
    local, remote = _files(tmp_path / "local"), _files(tmp_path / "remote")
    assert sorted(local) == sorted(remote) and [str(n) for n in local if local[n] != remote[n]] == ["run.json"]
    local_run, remote_run = (json.loads((tmp_path / d / "run.json").read_text())["config"] for d in ("local", "remote"))
    local_run.pop("options"), remote_run.pop("options")
    assert local_run == remote_run
    assert (local_run["mode"], local_run["window_size"], local_run["overlap"], local_run["shared_from"]) == (
        "windowed", 5, 2, "later")
