"""Sky masking: the reference's ONNX sky-segmentation model run with onnxruntime, masks cached
next to the outputs (see docs/SKY.md).

    from mapstream.sky import SkyMasker, compute_sky_masks
    masker = SkyMasker(out_dir / "sky_cache")        # raises SkyMaskError subclasses when unusable
    sky = masker.mask(frame, name)                     # [H, W] bool, True = sky
"""
from mapstream.sky.cache import (
    SKY_CACHE_DIRNAME,
    SkyCacheStats,
    SkyMaskCache,
    SkyMasker,
    compute_sky_masks,
    frame_key,
    save_sky_visualization,
    sky_cache_version,
)
from mapstream.sky.segmenter import (
    DEFAULT_THRESHOLD,
    MODEL_ENV,
    PREPROCESS_VERSION,
    SKYSEG_FILENAME,
    SKYSEG_REPO,
    SkyMaskError,
    SkyModelInvalidError,
    SkyModelUnavailableError,
    SkySegmenter,
    as_uint8_hwc,
    file_sha256,
    normalise_scores,
    preprocess,
    resolve_sky_model,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "MODEL_ENV",
    "PREPROCESS_VERSION",
    "SKYSEG_FILENAME",
    "SKYSEG_REPO",
    "SKY_CACHE_DIRNAME",
    "SkyCacheStats",
    "SkyMaskCache",
    "SkyMaskError",
    "SkyMasker",
    "SkyModelInvalidError",
    "SkyModelUnavailableError",
    "SkySegmenter",
    "as_uint8_hwc",
    "compute_sky_masks",
    "file_sha256",
    "frame_key",
    "normalise_scores",
    "preprocess",
    "resolve_sky_model",
    "save_sky_visualization",
    "sky_cache_version",
]
