"""Building a GCTStream for a checkpoint and loading its weights without holding them twice."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

from ..compat import GCTStream
from ..config import DEFAULT_IMAGE_SIZE, get_preset, preset_names, split_overrides
from .files import (
    IMAGE_SIZE_KEY,
    TRAINED_VIEWS_KEY,
    is_safetensors,
    is_torch_zip,
    read_state_dict,
    recorded_preset,
    resolve_checkpoint,
    training_records,
)
from .report import CheckpointError, LoadReport, compare_keys

log = logging.getLogger(__name__)

# Keyword arguments of GCTStream itself (not configuration overrides).
_MODEL_KWARGS = ("backend", "num_frame_for_scale", "compile")


class _StorageFreeParameters(TorchFunctionMode):
    """Tensor factories without an explicit device allocate on the meta device (no memory),
    so parameters cost nothing until a checkpoint's tensors are assigned to them. Tensors
    built from Python data (`torch.tensor`, e.g. constant buffers) stay real."""

    _FACTORIES = frozenset({
        torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.full,
        torch.rand, torch.randn, torch.randint, torch.normal,
    })

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self._FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _build(preset: str, overrides: dict[str, Any], *, storage: bool) -> GCTStream:
    p = get_preset(preset)
    if storage:
        return GCTStream(p.model, p.stream, **overrides)
    with _StorageFreeParameters():
        return GCTStream(p.model, p.stream, **overrides)


def _match(state_dict: Mapping[str, torch.Tensor], preset: str, enable_point: bool) -> LoadReport:
    """How the checkpoint's keys and shapes match `preset`'s model (values not read)."""
    shapes = _build(preset, {"enable_point": enable_point}, storage=False).state_dict()
    return compare_keys({k: v.shape for k, v in shapes.items()}, state_dict, "", check_values=False)


def _fits(state_dict: Mapping[str, torch.Tensor], preset: str, enable_point: bool) -> bool:
    """Whether the checkpoint has exactly the keys and shapes of `preset`'s model."""
    return _match(state_dict, preset, enable_point).ok


def _fitting_preset(state_dict: Mapping[str, torch.Tensor], preset: str, overrides: dict[str, Any]) -> str | None:
    """Another preset whose model the checkpoint fits exactly, if any."""
    enable_point = overrides.get("enable_point", False)
    return next((name for name in preset_names() if name != preset and _fits(state_dict, name, enable_point)), None)


_OFFICIAL = "lingbot-map"


def _preset_of(state_dict: Mapping[str, torch.Tensor], enable_point: bool) -> str:
    """`load_model(preset="auto")`: the preset whose model the checkpoint fits (the official
    one first); when none fits exactly, the one with the most keys of the right shape, so that
    a damaged or edited checkpoint is reported against the model it was saved from (the
    official one on a tie)."""
    reports = {name: _match(state_dict, name, enable_point) for name in dict.fromkeys([_OFFICIAL, *preset_names()])}
    fitting = [name for name, report in reports.items() if report.ok]
    if fitting:
        if fitting[0] != _OFFICIAL:
            log.info("the checkpoint fits preset %r: building that", fitting[0])
        return fitting[0]
    matched = {name: r.model_keys - len(r.missing) - len(r.mismatched) for name, r in reports.items()}
    closest = max(reports, key=lambda name: matched[name])  # dicts keep order: the official one wins a tie
    log.info("the checkpoint fits no preset exactly; closest: %r (%d of its %d keys match)",
             closest, matched[closest], reports[closest].model_keys)
    return closest


def _is_memory_mapped(path: Path) -> bool:
    """Whether `read_state_dict` maps ``path``'s tensors from the file (torch's zip format is memory-mapped)."""
    return not is_safetensors(path) and is_torch_zip(path)


def _storages(state_dict: Mapping[str, torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in state_dict.values() if t.untyped_storage().nbytes()}


def _detach_from_file(model: torch.nn.Module, mapped: set[int]) -> None:
    """Copy into memory of their own the weights that are still the checkpoint's tensors
    mapped from its file (storages ``mapped``): loading assigns those tensors, and a `.to()`
    that changes neither device nor dtype keeps them, so the model would read the file for
    as long as it lives, and writing over the file (saving a new checkpoint to the same path)
    would change its weights or crash it."""
    if not mapped:
        return
    for module in model.modules():
        for group in (module._parameters, module._buffers):
            for name, t in group.items():
                if t is None or t.untyped_storage().data_ptr() not in mapped:
                    continue
                if isinstance(t, torch.nn.Parameter):
                    t.data = t.data.clone()
                else:
                    group[name] = t.clone()


def _meta_tensors(model: torch.nn.Module) -> list[str]:
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    return [name for name, t in tensors if t.is_meta]


def _load_weights(
    state_dict: dict[str, torch.Tensor], preset: str, overrides: dict[str, Any], strict: bool, source: str
) -> tuple[GCTStream, LoadReport]:
    skeleton = _build(preset, overrides, storage=False)
    shapes = {k: v.shape for k, v in skeleton.state_dict().items()}
    report = compare_keys(shapes, state_dict, source)
    if not report.ok:
        message = report.describe(preset=preset, fits_preset=_fitting_preset(state_dict, preset, overrides))
        if strict:
            raise CheckpointError(message, report)
        log.warning("%s", message)
    bad = set(report.missing) | {k for k, _, _ in report.mismatched} | set(report.non_finite)
    usable = {k: v for k, v in state_dict.items() if k in shapes and k not in bad}
    if not bad:
        skeleton.load_state_dict(usable, strict=True, assign=True)
        if not _meta_tensors(skeleton):
            return skeleton, report
        log.debug("tensors %s were not materialised; building the model in memory", _meta_tensors(skeleton))
    # Partial load (or a module whose buffers need real construction): a regular model,
    # with the checkpoint's tensors copied over its initial values.
    model = _build(preset, overrides, storage=True)
    model.load_state_dict(usable, strict=False)
    return model, report


def load_model(
    source: str | os.PathLike,
    *,
    filename: str | None = None,
    preset: str | None = None,
    strict: bool = True,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    trust_pickle: bool = False,
    enable_point: bool | Literal["auto"] = "auto",
    **overrides: Any,
) -> GCTStream:
    """Build a GCTStream and load a checkpoint into it; returns the model in eval mode.

    Args:
        source: a `.pt`/`.safetensors` file, a folder holding `filename`, a Hugging Face
            repo id such as "robbyant/lingbot-map" (downloaded once, then cached), or
            "small": mapstream's shipped small weights (as `mapstream run --model small`), or
            "tiny": the tiny preset with seeded synthetic weights (as `--model tiny`; not a
            reconstruction).
        filename: file inside the repo or folder (default "lingbot-map-long.pt").
        preset: architecture preset ("lingbot-map", "tiny", ...), or "auto": the preset whose
            keys and shapes the checkpoint fits (the official one first; when none fits, the
            error is reported against the official one). None (the default): the preset the
            file records (a safetensors file written by `mapstream train`, the shipped small
            weights), else the official one.
        strict: raise CheckpointError unless checkpoint and model have exactly the same
            keys and shapes. False: load what matches, log a warning (see `load_report`).
        device: where the weights go.
        dtype: cast floating-point weights (and buffers) to this dtype. Default: float32,
            whatever the checkpoint stores. The forward pass expects float32 weights (the
            heads run in fp32); mixed precision comes from `Session(precision=...)`.
        revision: hub revision (branch, tag or commit).
        cache_dir: hub cache folder (default: $HF_HUB_CACHE or ~/.cache/huggingface/hub).
        trust_pickle: allow `.pt` files that pickle Python objects besides tensors (runs
            code from the file: only for files from a trusted source).
        enable_point: build the point head; "auto" builds it iff the checkpoint holds
            `point_head.*` weights. An explicit value is kept even if it does not match the
            checkpoint (strict loading then reports the difference).
        **overrides: configuration overrides as for `build_model` (e.g.
            `kv_cache_sliding_window=32`, `backend="sdpa"`).

    The match of checkpoint and model is attached as `model.load_report` (a LoadReport).
    """
    p = get_preset(_OFFICIAL if preset in ("auto", None) else preset)  # fail on typos before any download
    split_overrides(p.model, p.stream, {k: v for k, v in overrides.items() if k not in _MODEL_KWARGS})
    if enable_point not in (True, False, "auto"):
        raise ValueError(f"enable_point must be True, False or 'auto', got {enable_point!r}")

    if source == UNTRAINED_TINY and not Path(source).exists():
        return _untrained_tiny(preset, enable_point, device, dtype, overrides)
    start = time.perf_counter()
    path = resolve_checkpoint(source, filename=filename, revision=revision, cache_dir=cache_dir)
    records = training_records(path)  # a damaged header is told before the tensors load
    if preset is None:
        preset = recorded_preset(path) or _OFFICIAL
        if preset != _OFFICIAL:
            log.info("%s records its preset, %r: building that", path, preset)
    state_dict = read_state_dict(path, trust_pickle=trust_pickle)
    if enable_point == "auto":
        enable_point = any(k.startswith("point_head.") for k in state_dict)
    if preset == "auto":
        preset = _preset_of(state_dict, enable_point)
    model, report = _load_weights(state_dict, preset, {**overrides, "enable_point": enable_point}, strict, str(path))
    mapped = _storages(state_dict) if _is_memory_mapped(path) else set()
    del state_dict
    model.to(device=device, dtype=dtype or torch.float32)
    _detach_from_file(model, mapped)
    report.image_size, report.trained_views = records.get(IMAGE_SIZE_KEY), records.get(TRAINED_VIEWS_KEY)
    model.load_report = report
    log.info(
        "loaded %d of %d tensors from %s in %.1f s", report.loaded, report.model_keys, path, time.perf_counter() - start
    )
    return model.eval()


UNTRAINED_TINY = "tiny"
"""The name `mapstream run --model tiny` takes: the tiny preset with seeded synthetic weights."""


def _untrained_tiny(preset: str | None, enable_point: bool | Literal["auto"], device: str | torch.device,
                    dtype: torch.dtype | None, overrides: dict[str, Any]) -> GCTStream:
    """`load_model("tiny")`: the tiny preset filled with seeded synthetic weights, as
    `mapstream run --model tiny` runs it (for trying the tool and tests: not a reconstruction)."""
    from ..models import fill_synthetic_

    if preset not in (None, "auto", UNTRAINED_TINY):
        raise ValueError(f"load_model('tiny') builds the tiny preset; preset={preset!r} does not apply")
    log.warning("load_model('tiny'): the tiny preset with untrained (synthetic) weights; its outputs are not a "
                "reconstruction")
    model = fill_synthetic_(_build(UNTRAINED_TINY, {**overrides, "enable_point": enable_point is True}, storage=True))
    return model.to(device=device, dtype=dtype or torch.float32).eval()


def model_image_size(model: torch.nn.Module) -> int:
    """The frame width a run feeds ``model`` unless told otherwise: what its checkpoint records
    (`LoadReport.image_size`), else `DEFAULT_IMAGE_SIZE`."""
    report = getattr(model, "load_report", None)
    recorded = report.image_size if isinstance(report, LoadReport) else None
    return recorded if recorded is not None else DEFAULT_IMAGE_SIZE


def model_trained_views(model: torch.nn.Module) -> int | None:
    """The most frames one training clip of ``model``'s weights held, as its checkpoint records
    (`LoadReport.trained_views`); None for weights that record none (the official ones, a
    built model)."""
    report = getattr(model, "load_report", None)
    return report.trained_views if isinstance(report, LoadReport) else None
