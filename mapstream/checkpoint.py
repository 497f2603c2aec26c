"""Loading and converting checkpoints: official `.pt` files, `.safetensors`, hub repos.

    model = load_model("lingbot-map-long.pt")                      # local file
    model = load_model("robbyant/lingbot-map")                     # hub (cached)
    convert_checkpoint("lingbot-map-long.pt", "lingbot-map-long.safetensors")

Loading is strict: every tensor of the model must come from the checkpoint with the right
shape and the checkpoint must hold nothing else, or a `CheckpointError` lists the
differences (`strict=False` loads what matches, logs the same report and attaches it as
`model.load_report`).

Memory: the checkpoint's tensors become the model's parameters (`load_state_dict(assign=True)`
on a model built without parameter storage), so the weights are never held twice. `.pt`
files (torch's zip format) are memory-mapped, as are `.safetensors` files with safetensors
>= 0.8 (older versions read one in-memory copy): pages are read from disk on first use and
are copy-on-write, so the file never changes. Casting (`dtype`) or moving (`device`) makes
the one copy in the target dtype/device.

`.pt` files are read with `torch.load(weights_only=True)`, which executes no pickled code;
files that also pickle other Python objects (e.g. training arguments) are refused unless
the caller passes `trust_pickle=True`.
"""
from __future__ import annotations

import logging
import os
import pickle
import re
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

from .compat import GCTStream
from .config import get_preset, preset_names, split_overrides
from .hub import CHECKPOINT_SUFFIXES, DEFAULT_FILENAME, download_checkpoint, looks_like_repo_id
from .weights import int8


__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "IMAGE_SIZE_KEY",
    "CheckpointError",
    "LoadReport",
    "checkpoint_filter_fn",
    "convert_checkpoint",
    "convert_main",
    "default_converted_path",
    "load_model",
    "model_image_size",
    "read_state_dict",
    "recorded_image_size",
    "resolve_checkpoint",
]

log = logging.getLogger(__name__)

IMAGE_SIZE_KEY = "image_size"
"""A safetensors file's metadata entry: the frame width (pixels) its weights were trained at."""
DEFAULT_IMAGE_SIZE = 518
"""The official weights' frame width, taken for any checkpoint that records none."""

# Keys under these top-level entries of a training checkpoint are the model's weights.
_WRAPPER_KEYS = ("model", "state_dict")
# Keyword arguments of GCTStream itself (not configuration overrides).
_MODEL_KWARGS = ("backend", "num_frame_for_scale", "compile")
_LIST_LIMIT = 8  # keys listed one by one before they are grouped by prefix


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked: not a state dict, pickled objects
    without `trust_pickle=True`, or keys/shapes that do not match the model (then
    `report` holds the details)."""

    def __init__(self, message: str, report: LoadReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# --------------------------------------------------------------------------- key report
@dataclass
class LoadReport:
    """How a checkpoint's keys matched a model's state dict."""

    source: str
    model_keys: int
    missing: list[str] = field(default_factory=list)
    """In the model, not in the checkpoint (model order)."""
    unexpected: list[str] = field(default_factory=list)
    """In the checkpoint, not in the model (checkpoint order)."""
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """(key, checkpoint shape, model shape) for keys in both with different shapes."""
    non_finite: list[str] = field(default_factory=list)
    """Keys of the model whose checkpoint tensor holds NaN or Inf (a damaged file, or one
    saved from a diverged run: every prediction would be NaN)."""
    point_head_keys: int = 0
    """The model's `point_head.*` keys (0 without a point head)."""
    image_size: int | None = None
    """The frame width the checkpoint records its weights were trained at (`IMAGE_SIZE_KEY`),
    None when it records none (the official checkpoints: trained at `DEFAULT_IMAGE_SIZE`)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.non_finite)

    @property
    def loaded(self) -> int:
        """Tensors taken from the checkpoint."""
        return self.model_keys - len(self.missing) - len(self.mismatched) - len(self.non_finite)

    def describe(self, *, preset: str | None = None, fits_preset: str | None = None) -> str:
        """A multi-line account of the differences, with what to do about them.

        `preset`: the model's preset; `fits_preset`: another preset the checkpoint matches."""
        if self.ok:
            return f"{self.source}: all {self.model_keys} tensors match the model"
        lines = [f"Checkpoint {self.source} does not match the model:"]
        if self.missing:
            lines.append(f"  {_count(self.missing, 'missing key')} (in the model, not in the checkpoint): "
                         f"{_summarize_keys(self.missing)}")
        if self.unexpected:
            lines.append(f"  {_count(self.unexpected, 'unexpected key')} (in the checkpoint, not in the model): "
                         f"{_summarize_keys(self.unexpected)}")
        if self.mismatched:
            shown = [f"{k}: checkpoint {list(c)} vs model {list(m)}" for k, c, m in self.mismatched[:_LIST_LIMIT]]
            more = len(self.mismatched) - len(shown)
            lines.append(f"  {_count(self.mismatched, 'key')} with a different shape: " + "; ".join(shown)
                         + (f"; and {more} more" if more > 0 else ""))
        if self.non_finite:
            lines.append(f"  {_count(self.non_finite, 'tensor')} holding NaN or Inf values: "
                         f"{_summarize_keys(self.non_finite)}")
        lines.extend(f"  -> {hint}" for hint in self._hints(preset, fits_preset))
        return "\n".join(lines)

    def _hints(self, preset: str | None, fits_preset: str | None) -> list[str]:
        hints = []
        found = self.model_keys - len(self.missing)
        if fits_preset is not None:
            hints.append(f"the checkpoint matches preset {fits_preset!r}: pass preset={fits_preset!r} "
                         "(or preset='auto')")
        elif found < self.model_keys / 2:
            hints.append(
                f"only {found} of the model's {self.model_keys} keys are in the checkpoint: it does not look "
                f"like a LingBot-Map checkpoint{f' for preset {preset!r}' if preset else ''} (wrong file or model?)"
            )
        extra_point = sum(k.startswith("point_head.") for k in self.unexpected)
        missing_point = sum(k.startswith("point_head.") for k in self.missing)
        if extra_point and not missing_point:
            hints.append("the checkpoint has a point head: build it with enable_point=True (or 'auto')")
        elif missing_point and not extra_point and missing_point == self.point_head_keys:
            hints.append("the checkpoint has no point head: use enable_point=False (or 'auto')")
        elif missing_point:
            hints.append(
                f"the checkpoint's point head is not the model's ({missing_point} of its {self.point_head_keys} "
                f"point_head keys missing, {extra_point} unexpected): a damaged file or another version of the head"
            )
        if self.mismatched:
            hints.append("different shapes mean another architecture: check the preset and overrides "
                         "(img_size, embed_dim, depth, ...)")
        if self.non_finite:
            hints.append("NaN or Inf weights make every prediction NaN: the file is damaged or comes from a "
                         "diverged training run; download or copy it again")
        if self.loaded:
            hints.append("in Python, load_model(..., strict=False) loads the matching tensors anyway (missing ones "
                         "keep their initial values, as do those holding NaN or Inf; unexpected ones are ignored)")
        return hints


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _summarize_keys(keys: list[str], limit: int = _LIST_LIMIT) -> str:
    """All keys when few; else one entry per top-level module, e.g. "62 under point_head.*"
    (the prefix is the longest one the group's keys share)."""
    if len(keys) <= limit:
        return ", ".join(keys)
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.split(".", 1)[0], []).append(key)
    parts = []
    for members in groups.values():
        if len(members) == 1:
            parts.append(members[0])
            continue
        split = [m.split(".") for m in members]
        common = []
        for pieces in zip(*(s[:-1] for s in split)):
            if len(set(pieces)) > 1:
                break
            common.append(pieces[0])
        parts.append(f"{len(members)} under {'.'.join(common) or members[0].split('.')[0]}.*")
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f", and {more} more groups" if more > 0 else "")


def compare_keys(
    model_shapes: Mapping[str, torch.Size], state_dict: Mapping[str, torch.Tensor], source: str,
    *, check_values: bool = True,
) -> LoadReport:
    """Match a checkpoint's keys and shapes against the model's, and (`check_values`) find the
    tensors holding NaN or Inf."""
    report = LoadReport(source=source, model_keys=len(model_shapes),
                        point_head_keys=sum(k.startswith("point_head.") for k in model_shapes))
    for key, shape in model_shapes.items():
        if key not in state_dict:
            report.missing.append(key)
        elif tuple(state_dict[key].shape) != tuple(shape):
            report.mismatched.append((key, tuple(state_dict[key].shape), tuple(shape)))
        elif check_values and not _finite(state_dict[key]):
            report.non_finite.append(key)
    report.unexpected = [key for key in state_dict if key not in model_shapes]
    return report


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in `t` (integer and boolean tensors always are); reads every page of a
    memory-mapped tensor, which loading does anyway."""
    if not (t.is_floating_point() or t.is_complex()) or t.is_meta:
        return True
    return bool(torch.isfinite(t).all())


# --------------------------------------------------------------------------- reading
def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Canonical key names: drop every `_orig_mod.` component (torch.compile, of the whole
    model or of a submodule), a leading `module.` (DataParallel / DDP) and a prefix that every
    key shares above the model's parts (a training wrapper's attribute, `_wrapper_prefix`).
    Pure: returns a new dict in the same order; raises CheckpointError if two keys become one."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, value in state_dict.items():
        parts = [p for p in key.split(".") if p != "_orig_mod"]
        while len(parts) > 1 and parts[0] == "module":
            parts = parts[1:]
        name = ".".join(parts)
        if name in out:
            raise CheckpointError(
                f"checkpoint keys {origin[name]!r} and {key!r} both name {name!r} once the "
                "torch.compile/DataParallel prefixes are removed; the file holds two models?"
            )
        out[name] = value
        origin[name] = key
    prefix = _wrapper_prefix(list(out))
    if prefix:
        log.info("every checkpoint key starts with %r (a training wrapper's attribute): removed", prefix)
        out = {key[len(prefix):]: value for key, value in out.items()}
    return out


# The model's top-level parts: the first component of every key of a LingBot-Map state dict.
_MODEL_PARTS = frozenset({"aggregator", "camera_head", "depth_head", "point_head"})


def _wrapper_prefix(keys: list[str]) -> str:
    """The dotted prefix that every key shares above the model's own parts (``model.`` of a
    PyTorch Lightning module, ``net.``...), or "" when there is none or the keys below it are
    not the model's."""
    parts = [key.split(".") for key in keys]
    depth = 0
    while parts and all(len(p) > depth + 1 for p in parts) and len({p[depth] for p in parts}) == 1 \
            and parts[0][depth] not in _MODEL_PARTS:
        depth += 1
    if depth and any(p[depth] in _MODEL_PARTS for p in parts):
        return ".".join(parts[0][:depth]) + "."
    return ""


def _is_safetensors(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    header_len = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 2 <= header_len <= path.stat().st_size - 8


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _torch_load(path: Path, trust_pickle: bool) -> Any:
    # mmap needs torch's zip format; files in the legacy format are read into memory.
    mmap = _is_zip(path)
    if not mmap:
        log.info("%s is not in torch's zip format: reading it into memory (no mmap)", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        objects = _pickled_objects(path, exc)
        if not objects:
            raise CheckpointError(_unreadable(path, exc)) from exc
        if not trust_pickle:
            raise CheckpointError(_pickle_refusal(path, objects)) from exc
    except Exception as exc:  # corrupt, truncated or not a checkpoint at all
        raise CheckpointError(_unreadable(path, exc)) from exc
    log.warning("%s holds pickled Python objects; unpickling them because trust_pickle=True", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap, pickle_module=_stand_in_pickle)
    except Exception as exc:  # code run by the unpickling failed, or the file is damaged
        raise CheckpointError(_unreadable(path, exc)) from exc


class _StandIn:
    """An object of a class the checkpoint names but this Python cannot import (a training
    run's own config class, say): it takes any arguments and state and keeps none. Only the
    checkpoint's tensors are wanted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _StandInUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            log.info("the checkpoint names %s.%s, which is not importable here: read as a stand-in", module, name)
            return type(name, (_StandIn,), {"__module__": module})


# What torch.load needs of a pickle module, with the unpickler above.
_stand_in_pickle = types.SimpleNamespace(__name__="pickle", Unpickler=_StandInUnpickler, load=pickle.load)


def _pickled_objects(path: Path, exc: Exception) -> list[str]:
    """The types weights_only loading refused (empty: the file is not a valid pickle)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # zip format only
    except Exception:
        found = []
    return found or re.findall(r"GLOBAL (\S+) was not an allowed global", str(exc))


def _unreadable(path: Path, exc: Exception) -> str:
    detail = " ".join(str(exc).split())[-300:]
    return (
        f"could not read {path} as a PyTorch or safetensors checkpoint ({type(exc).__name__}: {detail}); "
        "is it a checkpoint, and was it copied completely?"
    )


def _pickle_refusal(path: Path, objects: list[str]) -> str:
    return (
        f"{path} holds pickled Python objects besides tensors ({', '.join(objects)}); loading them would "
        "run code stored in the file, so mapstream refused. If you trust where the file comes from, pass "
        "trust_pickle=True (or allow those types with torch.serialization.add_safe_globals); "
        "convert_checkpoint() then writes a .safetensors copy that needs no trust. On the command line: "
        f"mapstream convert {path} --trust-pickle, then use the .safetensors file it writes."
    )


def _unwrap(obj: Any, path: Path) -> Mapping[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint object (checked to hold only tensors)."""
    if isinstance(obj, Mapping):
        wrapped = [k for k in _WRAPPER_KEYS if isinstance(obj.get(k), Mapping)]
        if wrapped:
            obj = obj[wrapped[0]]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a state dict (a dict of tensors)")
    if not obj:
        raise CheckpointError(f"{path} holds an empty dict: no weights")
    others = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise CheckpointError(
            f"{path} is not a state dict: entries {', '.join(others[:_LIST_LIMIT])}"
            f"{' ...' if len(others) > _LIST_LIMIT else ''} are not tensors (and no "
            f"{' or '.join(repr(k) for k in _WRAPPER_KEYS)} entry holds the weights)"
        )
    return obj


def _restore_storage(tensors: dict[str, torch.Tensor], storage: str | None, path: Path) -> dict[str, torch.Tensor]:
    """Float weights from a safetensors file's tensors, as its metadata says they are stored."""
    if storage == int8.INT8_ROWS:
        try:
            return int8.dequantize(tensors)
        except ValueError as exc:
            raise CheckpointError(f"{path} is damaged: {exc}; write it again from its source") from exc
    if storage is not None:
        raise CheckpointError(f"{path} stores its weights as {storage!r}, which this mapstream does not read "
                              f"(it reads {int8.INT8_ROWS!r}); upgrade mapstream, or write the file again in "
                              "float16 or float32")
    packed = sorted(k for k, v in tensors.items() if v.dtype == torch.int8)
    if packed:
        raise CheckpointError(f"{path} holds 8-bit tensors ({_summarize_keys(packed)}) but its metadata does not "
                              f"say how they are scaled ({int8.STORAGE_KEY!r}); write it with "
                              "mapstream.weights.int8.quantize and that metadata")
    return tensors


def recorded_image_size(path: str | os.PathLike) -> int | None:
    """The frame width a checkpoint file's metadata records its weights were trained at, or
    None (a `.pt` file, or a safetensors file without the record). CheckpointError for an
    unreadable file or a record that is not a width."""
    path = Path(path)
    if not _is_safetensors(path):
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt", device="cpu") as handle:
            value = (handle.metadata() or {}).get(IMAGE_SIZE_KEY)
    except Exception as exc:  # a damaged header
        raise CheckpointError(_unreadable(path, exc)) from exc
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise CheckpointError(f"{path} records {IMAGE_SIZE_KEY}={value!r} in its metadata, which is not a width in "
                              "pixels; write the file again with a positive integer there, or without the entry")
    return int(value)


def model_image_size(model: torch.nn.Module) -> int:
    """The frame width a run feeds ``model`` unless told otherwise: what its checkpoint records
    (`LoadReport.image_size`), else `DEFAULT_IMAGE_SIZE`."""
    report = getattr(model, "load_report", None)
    recorded = report.image_size if isinstance(report, LoadReport) else None
    return recorded if recorded is not None else DEFAULT_IMAGE_SIZE


def read_state_dict(path: str | os.PathLike, *, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The weights of a local checkpoint file, with canonical key names.

    `.pt`/`.pth` (a state dict, or a dict holding one under "model" or "state_dict"; tensors
    memory-mapped) or `.safetensors` (recognised by content, not by name). Raises
    CheckpointError for files that hold no state dict or pickled objects (see module doc).
    """
    path = Path(path)
    if _is_safetensors(path):
        from safetensors import safe_open

        try:  # one open reads the metadata (how the weights are stored) and the tensors
            with safe_open(str(path), "pt", device="cpu") as handle:
                metadata = handle.metadata() or {}
                obj: Any = {key: handle.get_tensor(key) for key in handle.keys()}
        except Exception as exc:  # a damaged header or a truncated file
            raise CheckpointError(_unreadable(path, exc)) from exc
        obj = _restore_storage(obj, metadata.get(int8.STORAGE_KEY), path)
    else:
        obj = _torch_load(path, trust_pickle)
    return checkpoint_filter_fn(_unwrap(obj, path))


def resolve_checkpoint(
    source: str | os.PathLike,
    *,
    filename: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The local file for `source`: an existing file, a folder (with `filename`, default
    lingbot-map-long.pt), or a hub repo id "owner/name" (downloaded and cached).

    A string that exists locally is always a path; a missing path that does not look like a
    repo id raises FileNotFoundError without contacting the hub.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a path or a hub repo id, got {type(source).__name__}")
    path = Path(source).expanduser()
    if not path.exists():
        if isinstance(source, str) and looks_like_repo_id(source):
            return download_checkpoint(source, filename or DEFAULT_FILENAME, revision=revision, cache_dir=cache_dir)
        raise FileNotFoundError(_not_found_message(str(source), path))
    if revision is not None:
        raise ValueError(f"revision={revision!r} only applies to hub repo ids; {path} is a local path")
    if path.is_dir():
        file = path / (filename or DEFAULT_FILENAME)
        if not file.is_file():
            found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in CHECKPOINT_SUFFIXES)
            raise FileNotFoundError(
                f"Checkpoint file not found: {file}. Checkpoints in {path}: {', '.join(found) or 'none'}; "
                "choose one with filename=... (--checkpoint-file on the command line)"
            )
        return file
    if filename is not None:
        raise ValueError(f"filename={filename!r} only applies to hub repo ids and folders; {path} is a file")
    return path


def _not_found_message(source: str, path: Path) -> str:
    message = (
        f"Checkpoint file not found: {source} (looked for {path.absolute()}). Pass the path of a "
        ".pt or .safetensors file, or a Hugging Face repo id such as 'robbyant/lingbot-map'."
    )
    parts = source.split("/")
    if len(parts) >= 3 and looks_like_repo_id("/".join(parts[:2])):
        message += (
            f" For a file of a hub repo use load_model({'/'.join(parts[:2])!r}, "
            f"filename={'/'.join(parts[2:])!r})."
        )
    return message


# --------------------------------------------------------------------------- building
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
    """Whether `read_state_dict` maps ``path``'s tensors from the file (`_torch_load`)."""
    return not _is_safetensors(path) and _is_zip(path)


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
    preset: str = "lingbot-map",
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
        source: a `.pt`/`.safetensors` file, a folder holding `filename`, or a Hugging Face
            repo id such as "robbyant/lingbot-map" (downloaded once, then cached).
        filename: file inside the repo or folder (default "lingbot-map-long.pt").
        preset: architecture preset ("lingbot-map", "tiny"), or "auto": the preset whose keys
            and shapes the checkpoint fits (the official one first; when none fits, the error
            is reported against the official one).
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
    p = get_preset(_OFFICIAL if preset == "auto" else preset)  # fail on typos before any download
    split_overrides(p.model, p.stream, {k: v for k, v in overrides.items() if k not in _MODEL_KWARGS})
    if enable_point not in (True, False, "auto"):
        raise ValueError(f"enable_point must be True, False or 'auto', got {enable_point!r}")

    start = time.perf_counter()
    path = resolve_checkpoint(source, filename=filename, revision=revision, cache_dir=cache_dir)
    image_size = recorded_image_size(path)
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
    report.image_size = image_size
    model.load_report = report
    log.info(
        "loaded %d of %d tensors from %s in %.1f s", report.loaded, report.model_keys, path, time.perf_counter() - start
    )
    return model.eval()


# --------------------------------------------------------------------------- conversion
def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    filename: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    trust_pickle: bool = False,
) -> Path:
    """Write the weights of checkpoint `src` (anything `load_model` accepts as a source) to
    the `.safetensors` file `dst`, with canonical key names; returns `dst`.

    The file is written next to `dst` under a temporary name and moved into place, so `dst`
    is either the old file or the complete new one. Metadata: format ("pt"), architecture,
    source file name, mapstream version, tensor and parameter counts, and the trained frame
    width when the source records one (`IMAGE_SIZE_KEY`).
    """
    from safetensors.torch import save_file

    from .io.atomic import atomic_path

    from ._version import __version__

    path = resolve_checkpoint(src, filename=filename, revision=revision, cache_dir=cache_dir)
    state_dict = {k: v.contiguous() for k, v in read_state_dict(path, trust_pickle=trust_pickle).items()}
    metadata = {
        "format": "pt",
        "architecture": "GCTStream",
        "source_file": path.name,
        "mapstream_version": __version__,
        "tensors": str(len(state_dict)),
        "parameters": str(sum(t.numel() for t in state_dict.values())),
    }
    if (width := recorded_image_size(path)) is not None:  # the weights' own width travels with them
        metadata[IMAGE_SIZE_KEY] = str(width)
    as_folder = os.fspath(dst).endswith(("/", os.sep))  # "out/": a folder, made if missing
    dst = Path(dst).expanduser()
    if dst.is_dir() or as_folder:
        dst = dst / path.with_suffix(".safetensors").name
    if dst.exists() and dst.resolve() == path.resolve():
        raise ValueError(f"{dst} is the checkpoint being converted; give another output path")
    with atomic_path(dst) as tmp:
        save_file(state_dict, str(tmp), metadata=metadata)
    log.info("wrote %s (%s tensors, %s parameters) from %s", dst, metadata["tensors"], metadata["parameters"], path)
    return dst


def default_converted_path(src: str) -> Path:
    """Where `convert` writes when given no destination: beside a local file with the suffix
    replaced; inside a local folder, named after the checkpoint file it holds by default
    (`lingbot-map-long.safetensors`: load it with `--checkpoint-file` or its path; a folder
    still loads its `.pt` by default); for a hub repo id, that name in the working folder."""
    local = Path(src).expanduser()
    if local.is_file():
        return local.with_suffix(".safetensors")
    name = Path(DEFAULT_FILENAME).stem + ".safetensors"
    return local / name if local.is_dir() else Path(name)


def convert_main(src: str, dst: str | None = None, *, trust_pickle: bool = False) -> int:
    """CLI entry: convert `src` to `.safetensors` at `dst` (default: `default_converted_path`:
    beside a local file, inside a local folder, in the working folder for a hub repo id).
    Prints nothing; logs the output path (INFO) or the error (ERROR).
    `trust_pickle` as for `load_model`. Returns the exit status: 0 on success, 1 if the
    checkpoint is missing or unreadable."""
    try:
        convert_checkpoint(src, dst if dst is not None else default_converted_path(src), trust_pickle=trust_pickle)
    except (OSError, ValueError) as exc:  # missing file, hub failure, CheckpointError, disk full
        log.error("%s", exc)
        return 1
    return 0
