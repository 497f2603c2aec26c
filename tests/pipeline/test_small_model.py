"""mapstream's shipped small model: named with --model small, the demo's and the offline
default's network when the official weights are not at hand, and said so in run.json, the
summary figure and the live view."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from mapstream.cli.main import main
from mapstream.export.run_info import UNTRAINED_MODEL
from mapstream.export.summary import SMALL_CAPTION
from mapstream.pipeline.model_source import DEFAULT_CHECKPOINT, DEFAULT_REPO, known_fallback, resolve_model
from mapstream.weights import SMALL_MODEL, SMALL_WARNING

CPU = torch.device("cpu")


@pytest.fixture
def no_official(monkeypatch, tmp_path):
    """An empty hub cache: the official checkpoint is not cached here."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))


def test_the_small_model_is_the_shipped_file_in_the_architecture_it_fits(shipped_small):
    model, description, warnings = resolve_model("small", filename=DEFAULT_CHECKPOINT, device=CPU)
    assert description == SMALL_MODEL and warnings == [SMALL_WARNING]
    assert model.config.embed_dim == 192 and model.config.depth == 6  # the stand-in's preset, small
    stored = load_file(str(shipped_small))
    state = model.state_dict()
    assert set(state) == set(stored)
    for key, value in stored.items():
        assert torch.equal(state[key], value.to(state[key].dtype)), key


def test_the_demo_uses_the_small_model_when_the_official_weights_are_not_cached(no_official, shipped_small):
    assert known_fallback(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, demo=True) == "small"
    _, description, warnings = resolve_model(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, device=CPU, demo=True)
    assert description == SMALL_MODEL and warnings == [SMALL_WARNING]


def test_without_shipped_weights_the_demo_falls_back_to_the_tiny_preset(no_official, no_shipped_small, capsys, tmp_path):
    assert known_fallback(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, demo=True) == "tiny"
    _, description, _ = resolve_model(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT, device=CPU, demo=True)
    assert description == UNTRAINED_MODEL
    assert main(["run", "--demo", "--model", "small", "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no shipped small model" in err and "--model tiny" in err


def test_what_a_live_view_is_told_before_the_model_loads(no_official, shipped_small, tmp_path):
    assert known_fallback("tiny", filename=DEFAULT_CHECKPOINT) == "tiny"
    assert known_fallback("small", filename=DEFAULT_CHECKPOINT) == "small"
    assert known_fallback(DEFAULT_REPO, filename=DEFAULT_CHECKPOINT) is None  # may yet be fetched
    assert known_fallback(str(tmp_path / "model.safetensors"), filename=DEFAULT_CHECKPOINT, demo=True) is None


def test_a_demo_on_the_small_model_says_so_in_run_json_and_on_its_summary(no_official, shipped_small, tmp_path):
    out = tmp_path / "demo"
    assert main(["run", "--demo", "--out", str(out), "--quiet",
                 "--formats", "npz", "summary"]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["config"]["model"] == SMALL_MODEL and info["warnings"] == [SMALL_WARNING]
    top = np.asarray(Image.open(out / "summary.png").convert("RGB"))[:30].astype(int)
    red = (top[..., 0] > 140) & (top[..., 1] < 80) & (top[..., 2] < 80)
    assert red.mean() > 0.01  # the caption band's text
    from mapstream.export.summary import weights_caption

    assert weights_caption(out) == SMALL_CAPTION


def test_the_package_ships_the_small_weights_within_its_budget():
    """The shipped file itself: at most 25 MB, the small-deep preset's weights in 8 bits with a
    scale per row (float16 where a tensor is too small to pay), every weight of that preset and
    nothing else (strict loading), finite, and named as package data so that wheels carry it."""
    import tomllib
    from pathlib import Path

    from safetensors import safe_open

    import mapstream
    from mapstream.weights import small_weights

    path = small_weights()
    assert path is not None and path.stat().st_size <= 25_000_000
    from mapstream.weights.int8 import INT8_ROWS, SCALE_SUFFIX, STORAGE_KEY

    stored = load_file(str(path))
    scales = [k for k in stored if k.endswith(SCALE_SUFFIX)]
    assert scales and all(stored[k.removesuffix(SCALE_SUFFIX)].dtype == torch.int8 for k in scales)
    assert all(v.dtype == torch.float16 for k, v in stored.items() if v.is_floating_point() and k not in scales)
    with safe_open(str(path), "pt") as handle:
        assert handle.metadata()["preset"] == "small-deep" and handle.metadata()[STORAGE_KEY] == INT8_ROWS
    model = mapstream.load_model(path, preset="small-deep")  # strict: the same keys and shapes
    # The width it was trained at, which runs give it unless told otherwise.
    assert model.load_report.image_size == 294 and mapstream.checkpoint.model_image_size(model) == 294
    # The longest clips it trained on (48 frames), past which runs take windows (`plan_stream`).
    assert mapstream.checkpoint.model_trained_views(model) == 48
    assert len(model.state_dict()) == len(stored) - len(scales)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    pyproject = tomllib.loads((Path(mapstream.__file__).parents[1] / "pyproject.toml").read_text())
    assert "weights/*.safetensors" in pyproject["tool"]["setuptools"]["package-data"]["mapstream"]


def test_the_shipped_model_predicts_depth_and_cameras_that_untrained_weights_do_not():
    """A quality floor on procedural rooms of seeds training never draws (`mapstream.synthetic`),
    12 frames at the demo's size (168×294, the small model's own) with the default stream
    settings (8 scale frames, as its last training stages): medians over four sequences of
    per-frame median-scaled depth and of the Sim(3)-aligned ATE over the trajectory's extent.
    The shipped weights score δ<1.25 0.91, abs_rel 0.109 and ATE 0.065 of the extent there; the
    tiny preset's untrained weights (`build_model("tiny")`) 0.54, 0.50 and 0.16
    (docs/TRAINING.md, "The shipped small model")."""
    import mapstream
    from mapstream.eval.depth import depth_metrics
    from mapstream.eval.trajectory import ate
    from mapstream.pipeline.run_input import DEMO_HW
    from mapstream.synthetic import render_sequence
    from mapstream.weights import small_weights

    model = mapstream.load_model(small_weights(), preset="auto")
    delta1, abs_rel, ate_fraction = [], [], []
    for seed in (201, 202, 203, 204):
        seq = render_sequence(12, DEMO_HW, seed=seed)
        frames = torch.from_numpy(seq.rgb).permute(0, 3, 1, 2).float() / 255
        with model.session() as session:
            preds = [p for frame in frames for p in session.step(frame)]
        assert [p.index for p in preds] == list(range(12))
        metrics = depth_metrics(np.stack([p.depth.numpy() for p in preds]), seq.depth)
        delta1.append(metrics.values["delta_1"])
        abs_rel.append(metrics.values["abs_rel"])
        poses = torch.stack([p.T_world_cam for p in preds]).numpy()  # [N, 3, 4]: `ate` takes either form
        centres = seq.T_world_cam[:, :3, 3]
        ate_fraction.append(ate(poses, seq.T_world_cam).rmse / np.linalg.norm(centres.max(0) - centres.min(0)))
    assert np.median(delta1) >= 0.80 and np.median(abs_rel) <= 0.16, (delta1, abs_rel)
    assert np.median(ate_fraction) <= 0.10, ate_fraction
