"""The sky-mask cache: lossless 1-bit PNGs keyed by frame content, version stamp checked,
stale and corrupt entries recomputed; SkyMasker and compute_sky_masks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from sky_onnx_builder import sky_scene, write_model

from mapstream.sky import (
    MODEL_ENV,
    SkyMasker,
    SkyModelUnavailableError,
    compute_sky_masks,
    frame_key,
    save_sky_visualization,
)


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path)


def _frames(n: int = 3, h: int = 40, w: int = 60) -> np.ndarray:
    """``[n, h, w, 3]`` uint8: the sky scene with the horizon at a different row per frame."""
    frames = []
    for i in range(n):
        frame = sky_scene(h, w)
        frame[h // 2 - 4 * i : h // 2] = frame[-1]  # lower the sky line by 4 rows per frame
        frames.append(frame)
    return np.stack(frames)


def test_masks_are_cached_losslessly_and_read_back(model, tmp_path):
    frames = _frames()
    cache = tmp_path / "out" / "sky_cache"
    first = SkyMasker(cache, model, device="cpu")
    masks = [first.mask(f, f"frame{i}") for i, f in enumerate(frames)]
    assert first.stats.computed == 3 and first.stats.hits == 0
    files = sorted(cache.glob("*.png"))
    assert len(files) == 3 and not list(cache.glob(".*"))  # no temp files left
    assert {p.stem for p in files} == {frame_key(f) for f in frames}
    with Image.open(cache / f"{frame_key(frames[0])}.png") as png:
        assert png.mode == "1" and np.array_equal(np.array(png, dtype=bool), masks[0])

    second = SkyMasker(cache, model, device="cpu")
    again = [second.mask(f) for f in frames]
    assert second.stats.hits == 3 and second.stats.computed == 0
    assert second._segmenter is None  # the model was never loaded
    assert all(np.array_equal(a, b) for a, b in zip(masks, again))
    # Keyed by content: the order or name of a frame does not matter.
    assert np.array_equal(second.mask(frames[2], "renamed.jpg"), masks[2])


def test_tensor_and_array_frames_share_cache_entries(model, tmp_path):
    frame = _frames(1)[0]
    masker = SkyMasker(tmp_path / "c", model, device="cpu")
    masker.mask(frame)
    as_tensor = torch.from_numpy(frame).permute(2, 0, 1).float() / 255
    masker.mask(as_tensor)
    assert masker.stats.computed == 1 and masker.stats.hits == 1


def test_changed_frame_is_computed(model, tmp_path):
    frames = _frames(2)
    masker = SkyMasker(tmp_path / "c", model, device="cpu")
    masker.mask(frames[0])
    changed = frames[0].copy()
    changed[0, 0] = (0, 0, 0)
    masker.mask(changed)
    assert masker.stats.computed == 2 and masker.stats.hits == 0


def test_changed_version_stamp_recomputes(model, tmp_path):
    frames = _frames(2)
    cache = tmp_path / "c"
    compute_sky_masks(frames, cache, model, device="cpu")
    stamp = SkyMasker(cache, model).version
    assert "model-sha256=" in stamp and "minmax>=0.9" in stamp

    other_threshold = SkyMasker(cache, model, device="cpu", threshold=0.2)
    assert other_threshold.version != stamp
    low = [other_threshold.mask(f) for f in frames]
    assert other_threshold.stats.stale == 2 and other_threshold.stats.computed == 2
    assert low[0].sum() > compute_sky_masks(frames[:1], None, model, device="cpu")[0].sum()

    other_model = SkyMasker(cache, write_model(tmp_path, "v2.onnx", gain=2.0), device="cpu")
    assert other_model.version != stamp
    other_model.mask(frames[0])
    assert other_model.stats.stale == 1 and other_model.stats.computed == 1

    # The file now carries the newest stamp: the threshold-0.2 masker finds frame 1 still current.
    back = SkyMasker(cache, model, device="cpu", threshold=0.2)
    back.mask(frames[1])
    assert back.stats.hits == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "rgb", "empty"])
def test_corrupt_cache_file_is_recomputed(model, tmp_path, damage, caplog):
    frame = _frames(1)[0]
    cache = tmp_path / "c"
    expected = SkyMasker(cache, model, device="cpu").mask(frame)
    path = cache / f"{frame_key(frame)}.png"
    if damage == "garbage":
        path.write_bytes(b"definitely not a PNG")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "rgb":
        Image.fromarray(np.zeros((40, 60, 3), np.uint8)).save(path)
    else:
        path.write_bytes(b"")
    masker = SkyMasker(cache, model, device="cpu")
    with caplog.at_level("WARNING", logger="mapstream.sky"):
        assert np.array_equal(masker.mask(frame), expected)
    assert masker.stats.computed == 1 and masker.stats.corrupt == 1
    assert "unreadable" in caplog.text and path.name in caplog.text
    fresh = SkyMasker(cache, model, device="cpu")
    fresh.mask(frame)
    assert fresh.stats.hits == 1  # the entry was rewritten


def test_compute_sky_masks_inputs(model, tmp_path):
    frames = _frames(3)
    masks = compute_sky_masks(frames, tmp_path / "c", model, device="cpu")
    assert masks.shape == (3, 40, 60) and masks.dtype == bool
    for i, mask in enumerate(masks):
        assert mask[: 20 - 4 * i - 2].all() and not mask[20 - 4 * i + 2 :].any()
    tensors = torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255
    assert np.array_equal(compute_sky_masks(tensors, None, model, device="cpu"), masks)
    assert np.array_equal(compute_sky_masks(iter(list(frames)), tmp_path / "c", model), masks)
    with pytest.raises(ValueError, match="no frames"):
        compute_sky_masks([], None, model)
    with pytest.raises(ValueError, match="different sizes"):
        compute_sky_masks([frames[0], frames[0][:30]], None, model)


def test_no_model_offline_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SkyModelUnavailableError, match="JianyuanWang/skyseg"):
        compute_sky_masks(_frames(1), tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_visualization_panel(model, tmp_path):
    frame = _frames(1)[0]
    mask = SkyMasker(None, model, device="cpu").mask(frame)
    path = save_sky_visualization(frame, mask, tmp_path / "viz" / "f.png")
    with Image.open(path) as panel:
        assert panel.size == (3 * 60, 40)
        pixels = np.array(panel)
    assert np.array_equal(pixels[:, :60], frame)
    assert (pixels[:, 60:120, 0] == np.where(mask, 255, 0)).all()
