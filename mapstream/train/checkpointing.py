"""Training checkpoints (everything a run needs to continue exactly) and the final weights.

A checkpoint is `OUT/checkpoints/step-NNNNNNNN.pt`, written under a temporary name and renamed
into place, so an interrupted write never leaves a half file under a checkpoint's name; the
temp files of a run killed mid-write (kill -9 runs no cleanup) are never listed as checkpoints
and `remove_interrupted_writes` deletes them when the next run starts. It
holds plain tensors and numbers only (loaded with `weights_only=True`): the model's and the
EMA's tensors, the optimizer's and the scheduler's state, the step, the RNG states and the
configuration. The final weights are `OUT/model.safetensors` under the official keys (LoRA
merged in), which `mapstream.load_model` reads.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io.atomic import atomic_path, remove_stale_temp_files

__all__ = [
    "checkpoint_path", "list_checkpoints", "latest_checkpoint", "save_checkpoint", "load_checkpoint",
    "prune_checkpoints", "remove_interrupted_writes", "rng_state", "set_rng_state", "export_weights",
]

_NAME = re.compile(r"^step-(\d{8,})\.pt$")


def checkpoint_path(out: Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step-{step:08d}.pt"


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, path) of the finished checkpoints in `out`, oldest first (temporary files are not listed)."""
    folder = Path(out) / "checkpoints"
    found = [(int(m.group(1)), p) for p in folder.glob("step-*.pt") if (m := _NAME.match(p.name))]
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    found = list_checkpoints(out)
    return found[-1][1] if found else None


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which
        raise ValueError(f"{path}: not a readable training checkpoint ({exc})") from exc


def prune_checkpoints(out: Path, keep: int) -> None:
    """Delete all but the `keep` latest checkpoints."""
    found = list_checkpoints(out)
    for _, path in found[: max(0, len(found) - keep)]:
        path.unlink(missing_ok=True)


def remove_interrupted_writes(out: Path, run_files: frozenset[str]) -> list[Path]:
    """Delete the temp files that writes of checkpoints and of ``run_files`` (names in `out`)
    left when their process was killed; other files stay. Call it before the run writes."""
    out = Path(out)
    removed = remove_stale_temp_files(out / "checkpoints", recursive=False, targets=lambda n: bool(_NAME.match(n)))
    return removed + remove_stale_temp_files(out, recursive=False, targets=run_files.__contains__)


def rng_state() -> dict[str, Any]:
    """Every random generator a step may draw from, as tensors and numbers."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def export_weights(state_dict: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> Path:
    """Write `state_dict` as a float32 safetensors file, atomically."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
               for k, v in state_dict.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return path
