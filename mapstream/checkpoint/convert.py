"""Writing any checkpoint `load_model` reads as a `.safetensors` file with canonical keys."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..hub import DEFAULT_FILENAME
from .files import read_state_dict, resolve_checkpoint, training_records

log = logging.getLogger(__name__)


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

    from .._version import __version__
    from ..io.atomic import atomic_path

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
    # What the weights record of their training travels with them.
    metadata.update({key: str(value) for key, value in training_records(path).items()})
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
