"""Sky masks cached on disk, keyed by frame content, with a version stamp that is checked.

    masker = SkyMasker(out / SKY_CACHE_DIRNAME)          # model from the hub or model_path=
    for name, frame in frames:
        sky = masker.mask(frame, name)                    # [H, W] bool, True = sky
    masks = compute_sky_masks(images, out / SKY_CACHE_DIRNAME)   # all at once: [N, H, W] bool

Each mask is a 1-bit PNG ``<cache_dir>/<key>.png`` (white = sky, lossless), where ``key`` is a
SHA-256 of the frame's 8-bit pixels and shape: a frame gets its own mask whatever its file was
called or however the input was strided. Two PNG text fields record the frame key and the
version stamp (``PREPROCESS_VERSION``, the model file's SHA-256, the threshold rule); a cached
mask is used only when both match and its size is the frame's, otherwise (stale, corrupt,
truncated) it is recomputed and replaced. Files are written atomically (temp file + rename).
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin

from mapstream.io.atomic import atomic_path, prepare_dir
from mapstream.sky.segmenter import (
    DEFAULT_THRESHOLD,
    PREPROCESS_VERSION,
    SkySegmenter,
    as_uint8_hwc,
    file_sha256,
    resolve_sky_model,
)

__all__ = [
    "SKY_CACHE_DIRNAME",
    "SkyCacheStats",
    "SkyMaskCache",
    "SkyMasker",
    "compute_sky_masks",
    "frame_key",
    "save_sky_visualization",
    "sky_cache_version",
]

log = logging.getLogger(__name__)

SKY_CACHE_DIRNAME = "sky_cache"
"""Suggested cache folder name inside a run's output folder."""

_VERSION_FIELD = "mapstream-sky-version"
_KEY_FIELD = "mapstream-sky-frame"

Frame = np.ndarray | torch.Tensor


def sky_cache_version(model_sha256: str, threshold: float = DEFAULT_THRESHOLD, normalise: bool = True) -> str:
    """The version stamp of masks made by this code with this model file and threshold rule."""
    rule = "minmax" if normalise else "raw"
    return f"{PREPROCESS_VERSION};model-sha256={model_sha256[:16]};sky={rule}>={threshold:g}"


def frame_key(image: np.ndarray) -> str:
    """Cache key of an ``[H, W, 3]`` uint8 frame: SHA-256 (32 hex digits) of its shape and pixels."""
    digest = hashlib.sha256(f"{image.shape[0]}x{image.shape[1]}x3:".encode())
    digest.update(np.ascontiguousarray(image, dtype=np.uint8).data)
    return digest.hexdigest()[:32]


@dataclass
class SkyCacheStats:
    """What happened to the masks asked for so far."""

    hits: int = 0
    """Read from the cache."""
    computed: int = 0
    """Computed by the model (every miss, stale or corrupt entry)."""
    stale: int = 0
    """Cached with another version stamp (or for another frame) and recomputed."""
    corrupt: int = 0
    """Unreadable cache files, recomputed."""


class SkyMaskCache:
    """A folder of 1-bit PNG masks stamped with ``version`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str], version: str) -> None:
        self.folder = prepare_dir(folder)
        self.version = version
        self.stats = SkyCacheStats()

    def path(self, key: str) -> Path:
        """Where the mask of the frame with ``key`` lives."""
        return self.folder / f"{key}.png"

    def load(self, key: str, hw: tuple[int, int]) -> np.ndarray | None:
        """The cached ``[H, W]`` bool mask, or None when absent, stale or unreadable (counted)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            with Image.open(path) as image:
                image.load()
                text = getattr(image, "text", {}) or {}
                if image.format != "PNG" or image.mode != "1":
                    raise ValueError(f"a {image.format} image in mode {image.mode}, not a 1-bit PNG")
                mask = np.array(image, dtype=bool)
        except Exception as exc:  # truncated, not an image, wrong mode: recompute
            self.stats.corrupt += 1
            log.warning("sky mask cache file %s is unreadable (%s); recomputing it", path, exc)
            return None
        if text.get(_VERSION_FIELD) != self.version or text.get(_KEY_FIELD) != key or mask.shape != tuple(hw):
            self.stats.stale += 1
            # Said once at INFO (a whole cache goes stale when the model changes), then at DEBUG.
            log.log(
                logging.INFO if self.stats.stale == 1 else logging.DEBUG,
                "sky mask %s is stale (stamp %r, wanted %r; size %s, wanted %s); recomputing stale masks",
                path.name, text.get(_VERSION_FIELD), self.version, list(mask.shape), list(hw),
            )
            return None
        self.stats.hits += 1
        return mask

    def store(self, key: str, mask: np.ndarray) -> Path:
        """Write ``mask`` (``[H, W]`` bool) for ``key`` atomically; returns its path."""
        info = PngImagePlugin.PngInfo()
        info.add_text(_VERSION_FIELD, self.version)
        info.add_text(_KEY_FIELD, key)
        image = Image.fromarray(np.ascontiguousarray(mask, dtype=bool))  # mode "1"
        path = self.path(key)
        # No fsync: a cache file torn by a crash is detected as corrupt and recomputed.
        with atomic_path(path, fsync=False) as tmp:
            image.save(tmp, format="PNG", pnginfo=info)
        return path


class SkyMasker:
    """Per-frame sky masks through an optional cache; the model is only loaded on a cache miss.

    Args:
        cache_dir: the cache folder (created if needed), e.g. ``out / SKY_CACHE_DIRNAME``; None: no cache.
        model_path: the ``.onnx`` file; None: ``$MAPSTREAM_SKY_MODEL`` or the hub.
        device, threshold, normalise, cache_dir_hub: passed to :class:`SkySegmenter`
            (``cache_dir_hub`` is its hub ``cache_dir``).
        segmenter: an existing segmenter to use (its model and threshold rule win).

    Raises:
        SkyModelUnavailableError: at construction, when the model file cannot be found.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None,
        model_path: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        threshold: float = DEFAULT_THRESHOLD,
        normalise: bool = True,
        cache_dir_hub: str | os.PathLike[str] | None = None,
        segmenter: SkySegmenter | None = None,
    ) -> None:
        self._segmenter = segmenter
        if segmenter is not None:
            self.model_path = segmenter.model_path
            threshold, normalise = segmenter.threshold, segmenter.normalise
        else:
            self.model_path = resolve_sky_model(model_path, cache_dir=cache_dir_hub)
        self._options = dict(device=device, threshold=threshold, normalise=normalise)
        self.version = sky_cache_version(file_sha256(self.model_path), threshold, normalise)
        self.cache = SkyMaskCache(cache_dir, self.version) if cache_dir is not None else None
        self._computed = 0

    @property
    def segmenter(self) -> SkySegmenter:
        """The segmenter (the ONNX session is created on first use)."""
        if self._segmenter is None:
            self._segmenter = SkySegmenter(self.model_path, **self._options)
        return self._segmenter

    @property
    def stats(self) -> SkyCacheStats:
        """Cache hits, computed, stale and corrupt counts so far."""
        if self.cache is not None:
            return self.cache.stats
        return SkyCacheStats(computed=self._computed)

    def mask(self, frame: Frame, name: str | None = None) -> np.ndarray:
        """The sky mask ``[H, W]`` bool (True = sky) of ``frame`` (``[3, H, W]`` float in [0, 1]
        or ``[H, W, 3]`` uint8); ``name`` is only used in log messages."""
        image = as_uint8_hwc(frame)
        hw = image.shape[:2]
        key = frame_key(image) if self.cache is not None else ""
        if self.cache is not None:
            cached = self.cache.load(key, hw)
            if cached is not None:
                log.debug("sky mask of %s from the cache", name or key)
                return cached
        mask = self.segmenter.segment(image)
        if self.cache is not None:
            self.cache.stats.computed += 1
            self.cache.store(key, mask)
        else:
            self._computed += 1
        log.debug("sky mask of %s computed: %.1f%% sky", name or key, 100.0 * mask.mean())
        return mask


def compute_sky_masks(
    images: np.ndarray | torch.Tensor | Iterable[Frame],
    cache_dir: str | os.PathLike[str] | None,
    model_path: str | os.PathLike[str] | None = None,
    *,
    progress: bool | None = None,
    **options: object,
) -> np.ndarray:
    """Sky masks ``[N, H, W]`` bool (True = sky) of all frames.

    Args:
        images: ``[N, H, W, 3]`` uint8, ``[N, 3, H, W]`` float in [0, 1], or an iterable of frames
            (each as accepted by :meth:`SkyMasker.mask`, all of one size).
        cache_dir: mask cache folder (None: no cache).
        model_path: the ``.onnx`` file; None: ``$MAPSTREAM_SKY_MODEL`` or the hub.
        progress: a bar over the frames (None: when stderr is a terminal, `mapstream.progress`).
        options: more :class:`SkyMasker` keywords (device, threshold, normalise, ...).
    """
    from ..progress import progress_bar

    masker = SkyMasker(cache_dir, model_path, **options)  # type: ignore[arg-type]
    total = len(images) if hasattr(images, "__len__") else None
    masks = []
    with progress_bar(total, desc="sky", progress=progress) as bar:
        for frame in images:
            masks.append(masker.mask(frame))
            bar.update(1)
    if not masks:
        raise ValueError("no frames to compute sky masks for")
    shapes = {m.shape for m in masks}
    if len(shapes) > 1:
        raise ValueError(f"frames of different sizes {sorted(shapes)}; compute their masks one by one with SkyMasker")
    stats = masker.stats
    log.info("sky masks: %d frames, %d from the cache, %d computed", len(masks), stats.hits, stats.computed)
    return np.stack(masks)


def save_sky_visualization(frame: Frame, mask: np.ndarray, path: str | os.PathLike[str]) -> Path:
    """Write a ``[image | mask | overlay]`` PNG (sky white in the mask, tinted red in the
    overlay) to ``path`` atomically; returns the path."""
    image = as_uint8_hwc(frame)
    sky = np.asarray(mask, dtype=bool)
    grey = np.repeat((sky * 255).astype(np.uint8)[..., None], 3, axis=-1)
    overlay = image.astype(np.float32)
    overlay[sky] = 0.35 * overlay[sky] + 0.65 * np.array([255.0, 64.0, 64.0])
    panel = np.concatenate([image, grey, overlay.round().astype(np.uint8)], axis=1)
    with atomic_path(path, fsync=False) as tmp:
        Image.fromarray(panel).save(tmp, format="PNG")
    return Path(path)
