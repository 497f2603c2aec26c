"""Which network a run uses: a checkpoint file, a hub id, or the untrained tiny preset.

A hub id is fetched with a quick look for the network first (`mapstream.hub`): a run on a
machine without network reads the hub cache at once, and when the checkpoint is not there it
stops in seconds with every way forward that works offline, instead of after half a minute of
retries.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..export.run_info import UNTRAINED_MODEL

__all__ = ["DEFAULT_REPO", "DEFAULT_CHECKPOINT", "cached_official_checkpoint", "resolve_model", "uses_untrained_weights"]

log = logging.getLogger(__name__)

HUB_PROBE_SECONDS = 3.0
"""How long a run waits for a connection to the hub before it reads only the hub cache."""
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
    return model.to(device).eval(), UNTRAINED_MODEL, [TINY_WARNING]


def uses_untrained_weights(spec: str, *, filename: str, demo: bool = False) -> bool:
    """Whether `resolve_model` of these arguments gives the tiny preset's untrained weights
    (known before loading anything: a live view says so from the start)."""
    return spec == "tiny" or (demo and spec == DEFAULT_REPO and cached_official_checkpoint(filename) is None)


def resolve_model(
    spec: str, *, filename: str, device: torch.device, demo: bool = False, backend: str = "auto", **overrides,
):
    """Returns (model, description, warnings).

    `spec` is "tiny", a checkpoint path, a folder, or a hub repo id. With `demo`, the official
    checkpoint is used only if it is already cached; otherwise the tiny preset (loudly).
    `overrides`: runtime settings of the model's configuration (e.g. camera_num_iterations).
    """
    from ..checkpoint import load_model

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
    if _is_hub_id(spec):
        source, file_in_source = _hub_checkpoint(spec, filename), None
    else:
        source, file_in_source = spec, filename  # a folder holding `filename` (or a missing path)
    return (load_model(source, filename=file_in_source, preset="auto", device=device, backend=backend, **overrides),
            f"{spec} ({filename})", [])


def _is_hub_id(spec: str) -> bool:
    from ..hub import looks_like_repo_id

    return not Path(spec).expanduser().exists() and looks_like_repo_id(spec)


def _hub_checkpoint(repo_id: str, filename: str) -> Path:
    """The checkpoint's local path, fetched or read from the hub cache; offline and not
    cached, a HubDownloadError that names the ways forward of a run without network."""
    from ..hub import HubDownloadError, download_checkpoint, hub_cache_dir

    try:
        return download_checkpoint(repo_id, filename, probe_timeout=HUB_PROBE_SECONDS)
    except HubDownloadError as err:
        raise HubDownloadError(_offline_ways(repo_id, filename, err.reason or str(err), hub_cache_dir()),
                               reason=err.reason) from err


def _offline_ways(repo_id: str, filename: str, reason: str, cache: Path) -> str:
    repo_folder = f"models--{repo_id.replace('/', '--')}"
    return (
        f"cannot get the checkpoint {filename} of {repo_id}: {reason}. Ways forward without network:\n"
        f"  - a local copy of the checkpoint: --model /path/to/{filename} "
        f"(RunOptions(model=...)), downloaded elsewhere from {repo_id} on the Hugging Face hub;\n"
        f"  - the hub cache: copy {repo_folder} from the cache of a machine that downloaded it "
        f"(`hf download {repo_id} {filename}`) into {cache} (or point HF_HUB_CACHE at such a cache);\n"
        f"  - --model tiny (RunOptions(model='tiny')): the untrained tiny preset, to try every stage of "
        "mapstream without the weights (its outputs are not a reconstruction)."
    )
