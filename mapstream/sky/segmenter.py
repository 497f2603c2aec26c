"""Sky segmentation with the ONNX model the reference uses (``skyseg.onnx``, a U²-Net).

    segmenter = SkySegmenter()                 # model from the hub cache (or model_path=...)
    mask = segmenter.segment(frame)            # [H, W] bool, True = sky

The model file comes from ``model_path``, else ``$MAPSTREAM_SKY_MODEL``, else the Hugging Face
hub repo ``JianyuanWang/skyseg`` (file ``skyseg.onnx``, cached by ``huggingface_hub``; offline
without it: :class:`SkyModelUnavailableError` says where to put the file).

Pre-processing (what the reference feeds the model, docs/SKY.md): the RGB frame is resized to
the model's input size (320 x 320) with half-pixel bilinear interpolation and no antialiasing
(OpenCV's ``INTER_LINEAR``), rounded to 8 bits, scaled to [0, 1], normalised with the ImageNet
mean/std and fed as NCHW float32.

Post-processing: the score map is min-max normalised per image to [0, 1] (a constant map
means no sky), resized bilinearly to the frame's H x W, and a pixel is sky when its score is
>= ``threshold`` (default 0.9). The reference meant the same rule (keep non-sky confidence
``1 - score > 0.1``) but compared the 8-bit score without dividing by 255, which marked every
pixel above 1/255 of the score range as sky.
"""
from __future__ import annotations

import hashlib
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "DEFAULT_THRESHOLD",
    "MODEL_ENV",
    "PREPROCESS_VERSION",
    "SKYSEG_FILENAME",
    "SKYSEG_REPO",
    "SkyMaskError",
    "SkyModelInvalidError",
    "SkyModelUnavailableError",
    "SkySegmenter",
    "as_uint8_hwc",
    "file_sha256",
    "normalise_scores",
    "preprocess",
    "resolve_sky_model",
]

log = logging.getLogger(__name__)

SKYSEG_REPO = "JianyuanWang/skyseg"
SKYSEG_FILENAME = "skyseg.onnx"
MODEL_ENV = "MAPSTREAM_SKY_MODEL"
DEFAULT_INPUT_SIZE = 320
DEFAULT_THRESHOLD = 0.9
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PREPROCESS_VERSION = "skyseg-v1"
"""Bump whenever pre- or post-processing changes: cached masks carry it and are recomputed."""


class SkyMaskError(RuntimeError):
    """Sky masking cannot run (base class: catch it to skip masking with a warning)."""


class SkyModelUnavailableError(SkyMaskError):
    """The model file (or onnxruntime) is not available."""


class SkyModelInvalidError(SkyMaskError):
    """The model file is not an ONNX model with the expected input and output."""


# ---------------------------------------------------------------------------------------------
# Model file


def _offline() -> bool:
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return bool(constants.HF_HUB_OFFLINE) or value in ("1", "true", "yes", "on")


def _where_to_put_it(repo_id: str, filename: str, cache: Path) -> str:
    return (
        f"To use sky masking without network access, either\n"
        f"  - download https://huggingface.co/{repo_id}/resolve/main/{filename} by other means and pass its "
        f"path (model_path=..., or set {MODEL_ENV}=/path/to/{filename}), or\n"
        f"  - run `hf download {repo_id} {filename}` on a machine with network access and copy its "
        f"models--{repo_id.replace('/', '--')} folder into the hub cache {cache} "
        f"(HF_HUB_CACHE selects another cache)."
    )


def resolve_sky_model(
    model_path: str | os.PathLike[str] | None = None,
    *,
    repo_id: str = SKYSEG_REPO,
    filename: str = SKYSEG_FILENAME,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """The local path of the sky-segmentation model: ``model_path``, else ``$MAPSTREAM_SKY_MODEL``,
    else ``filename`` from hub repo ``repo_id`` (downloaded into the hub cache on first use).

    Raises:
        SkyModelUnavailableError: the given file does not exist, or the hub file is neither
            cached nor downloadable (offline, no network, ...); the message says where to put it.
    """
    if model_path is None and os.environ.get(MODEL_ENV):
        model_path = os.environ[MODEL_ENV]
        log.debug("sky model from $%s: %s", MODEL_ENV, model_path)
    if model_path is not None:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise SkyModelUnavailableError(
                f"sky-segmentation model {path} does not exist (or is not a file); pass the path of "
                f"{SKYSEG_FILENAME} (from https://huggingface.co/{SKYSEG_REPO}), or leave the path unset "
                f"to download it from the hub"
            )
        return path

    from huggingface_hub import hf_hub_download

    from mapstream.hub import hub_cache_dir

    cache = hub_cache_dir(cache_dir)
    offline = _offline()
    try:
        return Path(
            hf_hub_download(repo_id, filename, cache_dir=cache, local_files_only=offline, library_name="mapstream")
        )
    except Exception as exc:  # every hub failure becomes one clear error
        reason = (
            "offline mode is on (HF_HUB_OFFLINE=1) and the file is not in the hub cache"
            if offline
            else f"the download failed ({type(exc).__name__}: {exc})"
        )
        raise SkyModelUnavailableError(
            f"Could not get the sky-segmentation model {filename!r} from Hugging Face hub repo {repo_id!r}: "
            f"{reason}.\n{_where_to_put_it(repo_id, filename, cache)}"
        ) from exc


@lru_cache(maxsize=16)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes, remembered per (path, size, mtime) within the process."""
    stat = Path(path).stat()
    return _sha256_cached(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


# ---------------------------------------------------------------------------------------------
# Frames, pre- and post-processing


def as_uint8_hwc(frame: np.ndarray | torch.Tensor) -> np.ndarray:
    """A frame as a contiguous ``[H, W, 3]`` uint8 RGB array.

    Accepts a ``[3, H, W]`` tensor (float in [0, 1] or uint8), a ``[H, W, 3]`` uint8 array, or a
    float array in [0, 1] as ``[H, W, 3]`` or ``[3, H, W]``. Floats become ``round(255 x)``, which
    is exact for frames that came from 8-bit images.
    """
    if isinstance(frame, torch.Tensor):
        array = frame.detach().cpu()
        array = (array.float() if array.dtype in (torch.float16, torch.bfloat16) else array).numpy()
        if array.ndim == 3 and array.shape[0] == 3:
            array = array.transpose(1, 2, 0)
    else:
        array = np.asarray(frame)
        if array.ndim == 3 and array.shape[-1] != 3 and array.shape[0] == 3:
            array = array.transpose(1, 2, 0)
    if array.ndim != 3 or array.shape[-1] != 3 or 0 in array.shape:
        raise ValueError(
            f"a frame must be a [3, H, W] tensor or an [H, W, 3] array (RGB), got shape {list(array.shape)}"
        )
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"a frame must be uint8 or float in [0, 1], got dtype {array.dtype}")
    return np.ascontiguousarray(np.clip(np.rint(array.astype(np.float32) * 255.0), 0, 255).astype(np.uint8))


def preprocess(image: np.ndarray, size: tuple[int, int] = (DEFAULT_INPUT_SIZE, DEFAULT_INPUT_SIZE)) -> np.ndarray:
    """The model input for an ``[H, W, 3]`` uint8 RGB image: ``[1, 3, size[0], size[1]]`` float32.

    Bilinear resize (half-pixel centres, no antialiasing, like OpenCV ``INTER_LINEAR``) rounded
    to 8 bits, then ``(x / 255 - mean) / std`` with the ImageNet mean/std per RGB channel.
    """
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
    if tuple(x.shape[-2:]) != tuple(size):
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=False)
        x = x.round().clamp_(0, 255)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((x / 255.0 - mean) / std).numpy().astype(np.float32)


def normalise_scores(raw: np.ndarray) -> np.ndarray:
    """Per-image min-max normalisation of a score map to [0, 1] (float32); a constant map
    (range below 1e-8) gives all zeros, i.e. no sky."""
    raw = raw.astype(np.float32)
    low, high = float(raw.min()), float(raw.max())
    if not np.isfinite(low) or not np.isfinite(high):
        raise SkyMaskError("the sky model returned non-finite scores; check the model file")
    if high - low < 1e-8:
        return np.zeros_like(raw)
    return (raw - low) / (high - low)


def _resize_scores(scores: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    if scores.shape == tuple(hw):
        return scores
    x = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32))[None, None]
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=False)[0, 0].numpy()


# ---------------------------------------------------------------------------------------------
# The segmenter


def _providers(device: str) -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device in ("cuda", "auto"):
        if "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        if device == "cuda":
            raise SkyModelUnavailableError(
                "sky masking on 'cuda' needs onnxruntime with the CUDA provider "
                f"(`pip install onnxruntime-gpu`); this onnxruntime offers {available}. Use device='cpu' or 'auto'."
            )
        return ["CPUExecutionProvider"]
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")


class SkySegmenter:
    """Runs the ONNX sky-segmentation model on frames; see the module docstring.

    Args:
        model_path: the ``.onnx`` file; None: ``$MAPSTREAM_SKY_MODEL`` or the hub (:func:`resolve_sky_model`).
        device: ``"auto"`` (CUDA provider when onnxruntime has it, else CPU), ``"cpu"`` or ``"cuda"``.
        threshold: a pixel is sky when its score is >= this.
        normalise: min-max normalise each score map first (the reference's rule); False applies
            ``threshold`` to the model's raw output (e.g. 0.5 on a probability).
        repo_id, filename, cache_dir: where the hub copy lives.

    Raises:
        SkyModelUnavailableError: no model file, or onnxruntime missing.
        SkyModelInvalidError: the file is not an ONNX model with one ``[N, 3, H, W]`` image input.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        threshold: float = DEFAULT_THRESHOLD,
        normalise: bool = True,
        repo_id: str = SKYSEG_REPO,
        filename: str = SKYSEG_FILENAME,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if not 0.0 < threshold <= 1.0 and normalise:
            raise ValueError(f"threshold must be in (0, 1] on normalised scores, got {threshold}")
        self.threshold = float(threshold)
        self.normalise = bool(normalise)
        self.model_path = resolve_sky_model(model_path, repo_id=repo_id, filename=filename, cache_dir=cache_dir)
        self.session = self._open(self.model_path, device)
        self._input = self.session.get_inputs()[0]
        self._output = self.session.get_outputs()[0]
        self.input_size = self._check_input(self._input)
        self._dtype = np.float16 if self._input.type == "tensor(float16)" else np.float32
        log.info(
            "sky model %s (input %s %s, providers %s)",
            self.model_path, self._input.name, list(self.input_size), self.session.get_providers(),
        )

    @staticmethod
    def _open(path: Path, device: str) -> Any:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise SkyModelUnavailableError(
                "sky masking needs onnxruntime: `pip install 'mapstream[sky]'` (or onnxruntime-gpu for CUDA)"
            ) from exc
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=_providers(device))
        except SkyMaskError:
            raise
        except Exception as exc:
            raise SkyModelInvalidError(
                f"{path} is not a usable ONNX model ({type(exc).__name__}: {str(exc).strip()[:300]}). "
                f"Delete it and download {SKYSEG_FILENAME} again from https://huggingface.co/{SKYSEG_REPO}, "
                f"or pass the right file."
            ) from exc

    def _check_input(self, spec: Any) -> tuple[int, int]:
        shape = list(spec.shape)
        if len(shape) != 4 or (isinstance(shape[1], int) and shape[1] != 3) or "float" not in spec.type:
            raise SkyModelInvalidError(
                f"{self.model_path} is not a sky-segmentation model: its input {spec.name!r} is "
                f"{spec.type} {shape}, expected a float [N, 3, H, W] image"
            )
        h, w = shape[2], shape[3]
        return (
            h if isinstance(h, int) and h > 0 else DEFAULT_INPUT_SIZE,
            w if isinstance(w, int) and w > 0 else DEFAULT_INPUT_SIZE,
        )

    @property
    def model_sha256(self) -> str:
        """SHA-256 of the model file."""
        return file_sha256(self.model_path)

    def raw_scores(self, frame: np.ndarray | torch.Tensor) -> np.ndarray:
        """The model's output for one frame: ``[h, w]`` float32 at the model's resolution."""
        x = preprocess(as_uint8_hwc(frame), self.input_size).astype(self._dtype)
        out = self.session.run([self._output.name], {self._input.name: x})[0]
        out = np.asarray(out, dtype=np.float32).squeeze()
        if out.ndim != 2:
            raise SkyModelInvalidError(
                f"{self.model_path}: expected one score map from output {self._output.name!r}, "
                f"got shape {list(np.shape(out))}"
            )
        return out

    def scores(self, frame: np.ndarray | torch.Tensor) -> np.ndarray:
        """Sky scores ``[H, W]`` float32 at the frame's size (normalised to [0, 1] if ``normalise``)."""
        image = as_uint8_hwc(frame)
        raw = self.raw_scores(image)
        scores = normalise_scores(raw) if self.normalise else raw
        return _resize_scores(scores, image.shape[:2])

    def segment(self, frame: np.ndarray | torch.Tensor) -> np.ndarray:
        """The sky mask ``[H, W]`` bool (True = sky) of one frame (``[3, H, W]`` or ``[H, W, 3]``)."""
        return self.scores(frame) >= self.threshold

    __call__ = segment
