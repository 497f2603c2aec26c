"""A run's records in its output folder: metrics.jsonl, TensorBoard scalars, log lines."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from ..io.atomic import atomic_write_text
from .checkpointing import latest_checkpoint, prune_checkpoints

__all__ = ["start_logs", "tensorboard_writer", "log_step"]

log = logging.getLogger("mapstream.train.trainer")


def start_logs(out: Path, resume: bool) -> None:
    """A fresh run deletes the folder's old checkpoints and metrics; a resumed one keeps the
    metrics of the steps its checkpoint holds (the later ones are computed again)."""
    latest = latest_checkpoint(out)
    metrics = out / "metrics.jsonl"
    if not resume:
        prune_checkpoints(out, 0)
        metrics.unlink(missing_ok=True)
    elif metrics.is_file():
        step = int(latest.stem.split("-")[1]) if latest is not None else 0
        kept = [line for line in metrics.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        atomic_write_text(metrics, "".join(line + "\n" for line in kept))


def tensorboard_writer(out: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError("TensorBoard logs need the tensorboard package (pip install 'mapstream[train]'), "
                          "or pass --no-tensorboard") from exc
    return SummaryWriter(str(out / "tensorboard"))


def log_step(out: Path, writer, step: int, means: dict[str, float], lr: float, norm: float, seconds: float,
             phases: dict[str, float], peak_gib: float | None = None) -> None:
    """One log step's record; `seconds` is the whole step, `phases` its parts by name (data:
    producing the batch, forward, loss, backward, optimizer), recorded as NAME_seconds;
    `peak_gib` the accelerator's peak memory so far (None on the CPU: not recorded)."""
    parts = " ".join(f"{k} {v:.4f}" for k, v in means.items() if k != "loss")
    split = ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
    memory = f", peak {peak_gib:.1f} GiB" if peak_gib is not None else ""
    log.info("step %d loss %.4f (%s) lr %.3g grad-norm %.3g %.2f s/step%s%s", step, means["loss"], parts,
             lr, norm, seconds, f" ({split})" if split else "", memory)
    record = {"step": step, **means, "lr": lr, "grad_norm": norm, "step_seconds": seconds,
              **{f"{k}_seconds": v for k, v in phases.items()}}
    if peak_gib is not None:
        record["peak_gib"] = peak_gib
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    if writer is not None:
        for key, value in means.items():
            writer.add_scalar(f"loss/{key}", value, step)
        writer.add_scalar("train/lr", lr, step)
        writer.add_scalar("train/grad_norm", norm, step)
        writer.add_scalar("train/step_seconds", seconds, step)
        if peak_gib is not None:
            writer.add_scalar("train/peak_gib", peak_gib, step)
        for key, value in phases.items():
            writer.add_scalar(f"train/{key}_seconds", value, step)
