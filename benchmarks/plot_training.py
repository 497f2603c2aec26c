"""Loss curves of a training run, from its metrics.jsonl, or of the stages of a curriculum.

    python3 benchmarks/plot_training.py runs/small/metrics.jsonl docs/images/small_training.png
    python3 benchmarks/plot_training.py runs/small_flow/metrics.jsonl runs/small_clip8/metrics.jsonl \
        runs/small_clip16/metrics.jsonl docs/images/small_shipped.png

Plots the total loss and its camera and depth parts against the step (each log line is
the loss of one step; a moving median over 5 lines smooths the batch-to-batch noise), the
held-out camera errors where the run validated (`--val-every`), and the learning rate.
Several files are stages run one after the other: their steps are counted on from the end
of the stage before, and a dashed line with the run's name (its folder, or the file's own name for a copy)
marks where each begins
(each stage scores its own held-out clips, so the held-out curves jump there).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def smooth(values: np.ndarray, width: int = 5) -> np.ndarray:
    pad = width // 2
    padded = np.pad(values, pad, mode="edge")
    return np.array([np.median(padded[i:i + width]) for i in range(len(values))])


def chain(stages: list[Path]) -> tuple[list[dict], list[tuple[int, str]]]:
    """The records of ``stages`` on one step axis, and where each stage starts (its step
    offset, and its run folder's name, or the file's own for a copy named otherwise)."""
    records, starts, offset = [], [], 0
    for path in stages:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        starts.append((offset, path.parent.name if path.stem == "metrics" else path.stem))
        records += [{**row, "step": row["step"] + offset} for row in rows]
        offset += max((row["step"] for row in rows), default=0)
    return records, starts


def plot(metrics: Path | list[Path], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records, starts = chain([metrics] if isinstance(metrics, Path) else list(metrics))
    step = np.array([r["step"] for r in records])
    validated = [r for r in records if "val_rotation_deg" in r]
    rows = 3 if validated else 2
    fig, axes = plt.subplots(rows, 1, figsize=(7, 5 + 2 * (rows - 2)), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1, 2][:rows]})
    ax, lr_ax = axes[0], axes[-1]
    if validated:  # the held-out clips, the same at every validation: no smoothing needed
        val_ax, val_step = axes[1], [r["step"] for r in validated]
        for key, colour in (("val_rotation_deg", "tab:cyan"), ("val_translation_deg", "tab:blue")):
            val_ax.plot(val_step, [r[key] for r in validated], color=colour, marker=".", label=key)
        val_ax.set_ylabel("held-out error (°)")
        val_ax.grid(alpha=0.3)
        val_ax.legend(fontsize=8, loc="upper left")
        scored = [r for r in validated if "val_auc30" in r]  # runs from before it was recorded have none
        if scored:
            auc_ax = val_ax.twinx()
            auc_ax.plot([r["step"] for r in scored], [r["val_auc30"] for r in scored], color="tab:red",
                        marker=".", label="val_auc30")
            auc_ax.set_ylabel("held-out AUC@30")
            auc_ax.legend(fontsize=8, loc="upper right")
    for key, colour in (("loss", "black"), ("camera", "tab:blue"), ("camera_rotation", "tab:cyan"),
                        ("camera_fov", "tab:purple"), ("camera_pairs", "tab:pink"), ("depth", "tab:orange"),
                        ("flow", "tab:red")):
        logged = [r for r in records if key in r]  # depth only on dense steps, flow only where weighed
        if not logged:
            continue
        at, values = np.array([r["step"] for r in logged]), np.array([r[key] for r in logged])
        ax.plot(at, values, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(at, smooth(values), color=colour, label=key)
    ax.set_ylabel("loss (one step per point)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    lr_ax.plot(step, [r["lr"] for r in records], color="tab:green")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    lr_ax.grid(alpha=0.3)
    if len(starts) > 1:
        for offset, name in starts:
            for axis in axes:
                axis.axvline(offset, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(name, (offset, 0.0), xycoords=("data", "axes fraction"), xytext=(3, 3),
                        textcoords="offset points", va="bottom", fontsize=7, color="grey")
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    return target


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit("usage: plot_training.py METRICS.jsonl [MORE.jsonl ...] TARGET.png")
    print(plot([Path(a) for a in sys.argv[1:-1]], Path(sys.argv[-1])))
