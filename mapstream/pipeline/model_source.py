"""Which network a run uses: a checkpoint file, a hub id, or the untrained tiny preset."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

__all__ = ["DEFAULT_REPO", "DEFAULT_CHECKPOINT", "resolve_model", "cached_official_checkpoint"]

log = logging.getLogger(__name__)

DEFAULT_REPO = "robbyant/lingbot-map"
DEFAULT_CHECKPOINT = "lingbot-map-long.pt"
TINY_WARNING = (
    "USING THE TINY PRESET WITH UNTRAINED (SYNTHETIC) WEIGHTS: the outputs exercise every stage "
    "but are not a reconstruction. Pass --model with the official checkpoint (or put "
    f"{DEFAULT_CHECKPOINT} from {DEFAULT_REPO} into the Hugging Face cache) for real results."
)


def cached_official_checkpoint(filename: str = DEFAULT_CHECKPOINT) -> Path | None:
    """The official checkpoint's path if it is already in the local hub cache (no download)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(DEFAULT_REPO, filename)
    except Exception:  # noqa: BLE001 - a broken cache is the same as no cache here
        return None
    return Path(path) if isinstance(path, str) else None


def _tiny(device: torch.device, backend: str, overrides: dict):
    import mapstream

    log.warning(TINY_WARNING)
    model = mapstream.fill_synthetic_(mapstream.build_model("tiny", backend=backend, **overrides))
    return model.to(device).eval(), "tiny (synthetic weights)", [TINY_WARNING]


def resolve_model(
    spec: str, *, filename: str, device: torch.device, demo: bool = False, backend: str = "auto", **overrides,
):
    """Returns (model, description, warnings).

    `spec` is "tiny", a checkpoint path, a folder, or a hub repo id. With `demo`, the official
    checkpoint is used only if it is already cached; otherwise the tiny preset (loudly).
    `overrides`: runtime settings of the model's configuration (e.g. camera_num_iterations).
    """
    from ..models.checkpoint import load_model

    if spec == "tiny":
        return _tiny(device, backend, overrides)
    if demo and spec == DEFAULT_REPO:
        cached = cached_official_checkpoint(filename)
        if cached is None:
            return _tiny(device, backend, overrides)
        spec = str(cached)
    # The architecture follows the checkpoint ("auto"): the command line has no preset option.
    if Path(spec).is_file():
        return load_model(spec, preset="auto", device=device, backend=backend, **overrides), spec, []
    return (load_model(spec, filename=filename, preset="auto", device=device, backend=backend, **overrides),
            f"{spec} ({filename})", [])
