"""Reading a checkpoint file: its format (safetensors, torch zip or legacy pickle), the state
dict inside it with canonical key names, and its metadata; and finding the file for a path,
a folder or a hub repo id."""
from __future__ import annotations

import logging
import os
import pickle
import re
import types
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..hub import CHECKPOINT_SUFFIXES, DEFAULT_FILENAME, download_checkpoint, looks_like_repo_id
from ..weights import int8, small_weights
from .report import LIST_LIMIT, CheckpointError, summarize_keys

log = logging.getLogger(__name__)

IMAGE_SIZE_KEY = "image_size"
"""A safetensors file's metadata entry: the frame width (pixels) its weights were trained at."""
TRAINED_VIEWS_KEY = "trained_views"
"""A safetensors file's metadata entry: the most frames one clip of its weights' training held
(mapstream's training forward keeps every frame of a clip in view: past this many, a stream's
cache holds more than the weights learned to use)."""

# Keys under these top-level entries of a training checkpoint are the model's weights.
_WRAPPER_KEYS = ("model", "state_dict")


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


def is_safetensors(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    header_len = int.from_bytes(head[:8], "little")
    return head[8:9] == b"{" and 2 <= header_len <= path.stat().st_size - 8


def is_torch_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


_LEGACY_TORCH_MAGIC = pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2)
"""How a file of torch's legacy (pre-zip) format begins at the default protocol: its magic
number, pickled."""


class _NoGlobals(pickle.Unpickler):
    """Reads plain data only: a pickle naming any class or function stops here, unrun."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}")


def is_plain_pickle(path: Path) -> bool:
    """Whether ``path`` is a pickle that torch.save did not write (``pickle.dump`` of a dict,
    say): it starts with a pickle, and that pickle is not torch's legacy magic number."""
    with open(path, "rb") as f:
        if f.read(1) != b"\x80":  # a pickle's protocol opcode
            return False
        f.seek(0)
        try:
            first = _NoGlobals(f).load()
        except Exception:  # names a class, or is no pickle after all: not torch's magic number either
            return True
    return first != torch.serialization.MAGIC_NUMBER


def _torch_load(path: Path, trust_pickle: bool) -> Any:
    # mmap needs torch's zip format; files in the legacy format are read into memory.
    mmap = is_torch_zip(path)
    if not mmap:
        if is_plain_pickle(path):
            raise CheckpointError(
                f"{path} is a plain Python pickle, not a checkpoint written by torch.save or safetensors; save the "
                "weights with torch.save(model.state_dict(), path) or safetensors.torch.save_file, and load that"
            )
        log.info("%s is not in torch's zip format: reading it into memory (no mmap)", path)
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: the error below says what matters
            warnings.simplefilter("ignore", UserWarning)
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
    detail = " ".join(str(exc).split())
    detail = detail if len(detail) <= 300 else detail[:297] + "..."  # its beginning says what it is
    return (
        f"could not read {path} as a PyTorch or safetensors checkpoint ({type(exc).__name__}: {detail}); "
        "is it a checkpoint, and was it copied completely?"
    )


def _misnamed_safetensors(path: Path) -> str:
    """What a file named .safetensors that is not one is (its first bytes say)."""
    with open(path, "rb") as f:
        head = f.read(len(_LEGACY_TORCH_MAGIC))
    if head[:4] == b"PK\x03\x04" or head == _LEGACY_TORCH_MAGIC:
        return (f"{path} is named .safetensors but is a PyTorch checkpoint (torch.save); rename it to "
                f"{path.with_suffix('.pt').name} and load or convert that")
    return (f"{path} is named .safetensors but is not a safetensors file (it does not begin with a safetensors "
            "header): it is damaged, cut short, or a file of another kind renamed; write or download it again")


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
            f"{path} is not a state dict: entries {', '.join(others[:LIST_LIMIT])}"
            f"{' ...' if len(others) > LIST_LIMIT else ''} are not tensors (and no "
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
        raise CheckpointError(f"{path} holds 8-bit tensors ({summarize_keys(packed)}) but its metadata does not "
                              f"say how they are scaled ({int8.STORAGE_KEY!r}); write it with "
                              "mapstream.weights.int8.quantize and that metadata")
    return tensors


SHIPPED_SMALL = "small"
"""The name of mapstream's shipped small weights as a checkpoint source (as `--model small`)."""

PRESET_KEY = "preset"
"""The metadata entry of a safetensors file (written by `mapstream train`) naming the
architecture preset its weights were trained as."""


def recorded_preset(path: str | os.PathLike) -> str | None:
    """The architecture preset a safetensors file's metadata records (`PRESET_KEY`), or None
    (a `.pt` file, no record, or a name that is no preset of this mapstream)."""
    from ..config import preset_names

    path = Path(path)
    if not is_safetensors(path):
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt", device="cpu") as handle:
            name = (handle.metadata() or {}).get(PRESET_KEY)
    except Exception as exc:  # a damaged header
        raise CheckpointError(_unreadable(path, exc)) from exc
    return name if name in preset_names() else None


# What a file's metadata may record of its weights' training, with what each value must be.
_TRAINING_RECORDS = {IMAGE_SIZE_KEY: "a width in pixels", TRAINED_VIEWS_KEY: "a count of frames"}


def recorded_image_size(path: str | os.PathLike) -> int | None:
    """The frame width a checkpoint file's metadata records its weights were trained at, or
    None (a `.pt` file, or a safetensors file without the record). CheckpointError for an
    unreadable file or a record that is not a width."""
    return training_records(path).get(IMAGE_SIZE_KEY)


def recorded_trained_views(path: str | os.PathLike) -> int | None:
    """The most frames one training clip of a checkpoint file's weights held, as its metadata
    records (`TRAINED_VIEWS_KEY`), or None (a `.pt` file, or a safetensors file without the
    record: the official checkpoints). CheckpointError for an unreadable file or a record that
    is not a count."""
    return training_records(path).get(TRAINED_VIEWS_KEY)


def training_records(path: str | os.PathLike) -> dict[str, int]:
    """What a safetensors file's metadata records of its weights' training (`IMAGE_SIZE_KEY`,
    `TRAINED_VIEWS_KEY`), the entries it has, from one read of its header; {} for a `.pt`
    file. CheckpointError for an unreadable file or a record that is not a positive integer."""
    path = Path(path)
    if not is_safetensors(path):
        return {}
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
    except Exception as exc:  # a damaged header
        raise CheckpointError(_unreadable(path, exc)) from exc
    records = {}
    for key, what in _TRAINING_RECORDS.items():
        value = metadata.get(key)
        if value is None:
            continue
        if not value.isdigit() or int(value) < 1:
            raise CheckpointError(f"{path} records {key}={value!r} in its metadata, which is not {what}; "
                                  "write the file again with a positive integer there, or without the entry")
        records[key] = int(value)
    return records


def read_state_dict(path: str | os.PathLike, *, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The weights of a local checkpoint file, with canonical key names.

    `.pt`/`.pth` (a state dict, or a dict holding one under "model" or "state_dict"; tensors
    memory-mapped) or `.safetensors` (recognised by content, not by name). Raises
    CheckpointError for files that hold no state dict or pickled objects (see module doc).
    """
    path = Path(path)
    if is_safetensors(path):
        from safetensors import safe_open

        try:  # one open reads the metadata (how the weights are stored) and the tensors
            with safe_open(str(path), "pt", device="cpu") as handle:
                metadata = handle.metadata() or {}
                obj: Any = {key: handle.get_tensor(key) for key in handle.keys()}
        except Exception as exc:  # a damaged header or a truncated file
            raise CheckpointError(_unreadable(path, exc)) from exc
        obj = _restore_storage(obj, metadata.get(int8.STORAGE_KEY), path)
    elif path.suffix.lower() == ".safetensors":
        raise CheckpointError(_misnamed_safetensors(path))
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

    ``"small"`` (the name `mapstream run --model small` takes) is mapstream's shipped small
    weights (`mapstream.weights`). A string that exists locally is always a path; a missing
    path that does not look like a repo id raises FileNotFoundError without contacting the hub.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a path or a hub repo id, got {type(source).__name__}")
    path = Path(source).expanduser()
    if source == SHIPPED_SMALL and not path.exists():
        shipped = small_weights()
        if shipped is None:
            raise FileNotFoundError("this installation of mapstream has no shipped small model "
                                    "(mapstream/weights/small.safetensors); give a checkpoint file or hub repo id")
        path = shipped
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

