"""``run.json``: configuration, versions, timings, FPS, peak memory of a run.

:func:`write_run_json` takes any mapping (nested dicts, lists, numbers, strings, and common
non-JSON values, converted as listed in :func:`to_jsonable`) and writes it atomically with
sorted keys (a stable order that diffs well), 2-space indentation and strict JSON (non-finite
floats become ``null``). :func:`runtime_versions` gathers the versions worth recording.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from mapstream.io.atomic import atomic_write_text

logger = logging.getLogger(__name__)

__all__ = ["UNTRAINED_MODEL", "names_untrained_weights", "runtime_versions", "to_jsonable", "write_run_json"]

UNTRAINED_MODEL = "tiny (synthetic weights)"
"""The model a run records when it ran on the tiny preset's seeded random weights."""


def names_untrained_weights(model: object) -> bool:
    """Whether a run's recorded model is untrained weights (`UNTRAINED_MODEL`, any case)."""
    return isinstance(model, str) and "synthetic weights" in model.lower()


def to_jsonable(value: Any) -> Any:
    """Recursively convert ``value`` to plain JSON types.

    Mappings -> dict with ``str`` keys; lists/tuples/sets -> list (sets sorted by string);
    numpy scalars/arrays -> Python numbers/lists; non-finite floats -> None; paths, enums
    (their value), dataclasses (as dicts), torch dtypes/devices and anything else -> ``str``.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(value, key=str)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, PurePath):
        return str(value)
    logger.debug("run.json: storing %s as str", type(value).__name__)
    return str(value)


def runtime_versions() -> dict[str, Any]:
    """Python, platform, mapstream / torch / numpy versions, CUDA version and GPU names."""
    versions: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    for package in ("mapstream", "torch", "numpy", "pillow", "trimesh", "plyfile", "matplotlib"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    try:
        import torch

        versions["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            versions["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return versions


def write_run_json(info: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``info`` as JSON (sorted keys, see the module docstring) atomically; returns the path."""
    if not isinstance(info, Mapping):
        raise TypeError(f"run info must be a mapping, got {type(info).__name__}")
    text = json.dumps(to_jsonable(info), indent=2, sort_keys=True, allow_nan=False, ensure_ascii=False)
    path = atomic_write_text(path, text + "\n")
    logger.info("wrote %s", path)
    return path
