"""Which network a run uses: a checkpoint file, a hub id, mapstream's shipped small model, or
the untrained tiny preset.

A hub id is fetched with a quick look for the network first (`mapstream.hub`): a run on a
machine without network reads the hub cache at once. When the official checkpoint (the
default) is not there, the run goes on with mapstream's own small model (`mapstream.weights`)
and says so in its log and run.json with every way to the official weights that works
offline; any other checkpoint that cannot be had stops the run in seconds with those ways,
instead of after half a minute of retries.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..export.run_info import UNTRAINED_MODEL
from ..hub import DEFAULT_FILENAME as DEFAULT_CHECKPOINT, DEFAULT_REPO
from ..weights import SMALL_MODEL, SMALL_WARNING, small_weights

__all__ = ["DEFAULT_REPO", "DEFAULT_CHECKPOINT", "cached_official_checkpoint", "known_fallback", "prepare_for_inference",
           "resolve_model"]

log = logging.getLogger(__name__)

HUB_PROBE_SECONDS = 3.0
"""How long a run waits for a connection to the hub before it reads only the hub cache."""
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


def _small(device: torch.device, backend: str, overrides: dict, why: str | None = None):
    from ..checkpoint import load_model

    path = small_weights()
    if path is None:
        raise FileNotFoundError("this installation of mapstream has no shipped small model "
                                "(mapstream/weights/small.safetensors); give --model a checkpoint, or --model tiny")
    warnings = [SMALL_WARNING] if why is None else [SMALL_WARNING, why]
    for warning in warnings:
        log.warning(warning)
    model = load_model(path, preset="auto", device=device, backend=backend, **overrides)  # the preset it fits
    return model.eval(), SMALL_MODEL, warnings


def known_fallback(spec: str, *, filename: str, demo: bool = False) -> str | None:
    """"tiny" or "small" when `resolve_model` of these arguments is known, before loading
    anything, to give those weights (a live view says so from the start), else None. (A run
    whose official checkpoint turns out to be unreachable falls back later; its log and
    run.json say so.)"""
    if spec in ("tiny", "small"):
        return spec
    if demo and spec == DEFAULT_REPO and cached_official_checkpoint(filename) is None:
        return "small" if small_weights() is not None else "tiny"
    return None


def resolve_model(
    spec: str, *, filename: str, device: torch.device, demo: bool = False, backend: str = "auto", **overrides,
):
    """Returns (model, description, warnings).

    `spec` is "tiny", "small" (the shipped weights), a checkpoint path, a folder, or a hub repo
    id. The official checkpoint (`DEFAULT_REPO`) is used whenever it is cached or can be
    fetched (with `demo`, only if it is already cached); otherwise the shipped small model,
    loudly (the tiny preset where mapstream ships no weights).
    `overrides`: runtime settings of the model's configuration (e.g. camera_num_iterations).
    """
    from ..checkpoint import load_model
    from ..hub import HubDownloadError

    fallback = known_fallback(spec, filename=filename, demo=demo)  # the one place that decides it
    if fallback == "tiny":
        return _tiny(device, backend, overrides)
    if fallback == "small":
        return _small(device, backend, overrides)
    if spec == DEFAULT_REPO and (cached := cached_official_checkpoint(filename)) is not None:
        spec = str(cached)
    # The architecture follows the checkpoint ("auto"): the command line has no preset option.
    if Path(spec).is_file():
        return load_model(spec, preset="auto", device=device, backend=backend, **overrides), spec, []
    if _is_hub_id(spec):
        try:
            source, file_in_source = _hub_checkpoint(spec, filename), None
        except HubDownloadError as err:
            if spec != DEFAULT_REPO or small_weights() is None:
                raise
            return _small(device, backend, overrides, why=f"The official weights are not at hand: {err}")
    else:
        source, file_in_source = spec, filename  # a folder holding `filename` (or a missing path)
    return (load_model(source, filename=file_in_source, preset="auto", device=device, backend=backend, **overrides),
            f"{spec} ({filename})", [])


def prepare_for_inference(model, precision: str, *, low_precision_heads: bool, trunk_weights: str,
                          memory=None):
    """`model` as a run, a server or a fleet worker streams with it: cast to `precision`
    (bf16 / fp16; the heads too with `low_precision_heads` or where the `--gpu-memory` plan
    `memory` gave their fp32 up), the trunk's linear weights stored as `trunk_weights` says,
    and the dense heads as many frames at a time as the plan chose. Returns `model`."""
    if memory is not None:
        model.dense_chunk_frames = memory.dense_chunk_frames
    if precision in ("bf16", "fp16"):
        model.cast_for_inference(precision, heads=low_precision_heads or (memory is not None and
                                                                          memory.low_precision_heads))
    return model.quantize_trunk(trunk_weights)


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
        f"  - --model small (RunOptions(model='small')): mapstream's own small model, shipped inside the package "
        "(trained on procedural rooms; far less accurate than the official weights);\n"
        f"  - --model tiny (RunOptions(model='tiny')): the untrained tiny preset, to try every stage of "
        "mapstream without the weights (its outputs are not a reconstruction)."
    )
