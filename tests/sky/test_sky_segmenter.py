"""SkySegmenter on tiny ONNX models built in the test: pre-processing, binarisation, resizing,
model lookup (path, environment, hub cache, offline error) and invalid model files."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sky_onnx_builder import BROWN, GREY, SKY_BLUE, blue_sky_model, rgb_to_model_input, sky_scene, write_model

from mapstream.sky import (
    MODEL_ENV,
    SKYSEG_FILENAME,
    SKYSEG_REPO,
    SkyModelInvalidError,
    SkyModelUnavailableError,
    SkySegmenter,
    as_uint8_hwc,
    normalise_scores,
    preprocess,
)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path)


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


def test_preprocess_shapes_and_normalisation():
    image = np.zeros((48, 80, 3), np.uint8)
    image[:] = SKY_BLUE
    x = preprocess(image, (320, 320))
    assert x.shape == (1, 3, 320, 320) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, :, 100, 200], rgb_to_model_input(SKY_BLUE), atol=1e-6)
    assert preprocess(image, (64, 32)).shape == (1, 3, 64, 32)
    # Already at the input size: no resampling at all.
    same = np.random.default_rng(0).integers(0, 256, (320, 320, 3), dtype=np.uint8)
    np.testing.assert_allclose(preprocess(same)[0].transpose(1, 2, 0), (same / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225], atol=1e-5)


def test_frame_formats_agree():
    image = sky_scene(20, 30)
    as_tensor = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    assert np.array_equal(as_uint8_hwc(as_tensor), image)
    assert np.array_equal(as_uint8_hwc(image / 255.0), image)
    assert np.array_equal(as_uint8_hwc(image.transpose(2, 0, 1)), image)
    with pytest.raises(ValueError, match="shape"):
        as_uint8_hwc(np.zeros((4, 5), np.uint8))


def test_raw_scores_are_the_models_output(model):
    seg = SkySegmenter(model, device="cpu")
    assert seg.input_size == (320, 320)
    raw = seg.raw_scores(sky_scene(64, 96))
    assert raw.shape == (320, 320)
    sky, brown, grey = (rgb_to_model_input(c) for c in (SKY_BLUE, BROWN, GREY))
    assert raw[10, 10] == pytest.approx(_sigmoid(sky[2] - sky[0]), abs=1e-5)
    assert raw[300, 10] == pytest.approx(_sigmoid(brown[2] - brown[0]), abs=1e-5)
    assert raw[300, 310] == pytest.approx(_sigmoid(grey[2] - grey[0]), abs=1e-5)


def test_binarisation_exact_mask_and_the_reference_bug_fixed(model):
    seg = SkySegmenter(model, device="cpu")
    image = sky_scene(64, 96)
    mask = seg.segment(image)
    expected = np.zeros((64, 96), bool)
    expected[:32] = True
    assert mask.dtype == bool and mask.shape == (64, 96)
    assert np.array_equal(mask, expected)
    # The grey quarter scores ~0.45 of the range: the reference's 8-bit score >= 1 rule calls it sky.
    scores = seg.scores(image)
    assert 0.3 < scores[60, 90] < 0.6
    reference_rule = (scores * 255).astype(np.uint8) >= 1
    assert reference_rule[60, 90] and not mask[60, 90]
    # The same frame as a [3, H, W] float tensor gives the same mask.
    as_tensor = torch.from_numpy(image).permute(2, 0, 1).float() / 255
    assert np.array_equal(seg(as_tensor), expected)


def test_threshold_and_raw_mode(model):
    image = sky_scene(64, 96)
    low = SkySegmenter(model, device="cpu", threshold=0.3).segment(image)
    assert low[:32].all() and low[40:, 60:].all() and not low[40:, :40].any()  # grey counts as sky
    raw = SkySegmenter(model, device="cpu", normalise=False, threshold=0.5).segment(image)
    assert raw[:32].all() and raw[40:, 60:].all() and not raw[40:, :40].any()  # sigmoid(grey) ~ 0.59
    assert not normalise_scores(np.full((4, 4), 0.7)).any()  # a constant map: no sky
    with pytest.raises(ValueError, match="threshold"):
        SkySegmenter(model, threshold=0.0)


@pytest.mark.parametrize("hw", [(50, 70), (481, 641), (320, 320)])
def test_mask_is_resized_to_the_frame(model, hw):
    h, w = hw
    mask = SkySegmenter(model, device="cpu").segment(sky_scene(h, w))
    assert mask.shape == (h, w)
    boundary = h // 2
    assert mask[: boundary - 3].all() and not mask[boundary + 3 :].any()
    assert mask.any(axis=1).sum() in range(boundary - 2, boundary + 3)


def test_input_size_comes_from_the_model(tmp_path):
    small = SkySegmenter(write_model(tmp_path, "small.onnx", size=64), device="cpu")
    assert small.input_size == (64, 64)
    assert small.raw_scores(sky_scene(30, 40)).shape == (64, 64)
    dynamic = SkySegmenter(write_model(tmp_path, "dyn.onnx", dynamic=True), device="cpu")
    assert dynamic.input_size == (320, 320)
    assert np.array_equal(dynamic.segment(sky_scene(64, 96)), SkySegmenter(write_model(tmp_path)).segment(sky_scene(64, 96)))


def test_model_from_environment_variable(model, monkeypatch):
    monkeypatch.setenv(MODEL_ENV, str(model))
    assert SkySegmenter(device="cpu").model_path == model


def test_model_from_the_hub_cache_offline(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / f"models--{SKYSEG_REPO.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    write_model(snapshot)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    seg = SkySegmenter(device="cpu")
    assert seg.model_path.name == SKYSEG_FILENAME and str(cache) in str(seg.model_path)


def test_offline_without_the_file_says_what_to_do(tmp_path, monkeypatch):
    cache = tmp_path / "empty-hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(SkyModelUnavailableError) as info:
        SkySegmenter()
    message = str(info.value)
    for part in (SKYSEG_REPO, SKYSEG_FILENAME, "HF_HUB_OFFLINE", MODEL_ENV, str(cache), "hf download"):
        assert part in message, part


def test_missing_model_path(tmp_path):
    with pytest.raises(SkyModelUnavailableError, match="does not exist"):
        SkySegmenter(tmp_path / "nope.onnx")


def test_not_an_onnx_model(tmp_path):
    bad = tmp_path / "skyseg.onnx"
    bad.write_bytes(b"<html>404: this is not a model</html>")
    with pytest.raises(SkyModelInvalidError) as info:
        SkySegmenter(bad, device="cpu")
    assert str(bad) in str(info.value) and "not a usable ONNX model" in str(info.value)


def test_onnx_model_with_the_wrong_input(tmp_path):
    grey_model = tmp_path / "grey.onnx"
    grey_model.write_bytes(blue_sky_model(channels=1))
    with pytest.raises(SkyModelInvalidError, match=r"expected a float \[N, 3, H, W\] image"):
        SkySegmenter(grey_model, device="cpu")
