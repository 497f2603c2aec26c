"""Loss curves of a training run, from its metrics.jsonl.

    python3 benchmarks/plot_training.py runs/small/metrics.jsonl docs/images/small_training.png

Plots the total loss and its camera and depth parts against the step (each log line is
the loss of one step; a moving median over 5 lines smooths the batch-to-batch noise), the
held-out camera errors where the run validated (`--val-every`), and the learning rate.
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


def plot(metrics: Path, target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
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
        val_ax.legend(fontsize=8)
    for key, colour in (("loss", "black"), ("camera", "tab:blue"), ("camera_rotation", "tab:cyan"),
                        ("camera_fov", "tab:purple"), ("depth", "tab:orange")):
        values = np.array([r[key] for r in records])
        ax.plot(step, values, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(step, smooth(values), color=colour, label=key)
    ax.set_ylabel("loss (one step per point)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    lr_ax.plot(step, [r["lr"] for r in records], color="tab:green")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    lr_ax.grid(alpha=0.3)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    return target


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]), Path(sys.argv[2])))
