"""A training run's current weights in half precision, split into files small enough to carry.

    python3 benchmarks/half_weights.py split RUN_DIR OUT_DIR     # latest checkpoint (EMA if kept) -> OUT_DIR/weights-{0,1}.safetensors
    python3 benchmarks/half_weights.py join OUT_DIR FILE.safetensors

The halves hold disjoint keys; `join` writes one float16 safetensors file that
`mapstream.load_model(FILE, preset=...)` reads.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def split(run: Path, out: Path, parts: int = 2) -> list[Path]:
    from mapstream.train.checkpointing import latest_checkpoint, load_checkpoint

    path = latest_checkpoint(run)
    if path is None:
        raise SystemExit(f"{run} holds no checkpoint")
    state = load_checkpoint(path)
    weights = state["model"]
    if "ema" in state:
        shadow = state["ema"]["shadow"]  # the averaged parameters
        weights = {k: shadow.get(k, v) for k, v in weights.items()}
    half = {k: v.detach().to("cpu", torch.float16 if v.is_floating_point() else v.dtype).contiguous()
            for k, v in weights.items()}
    keys, total, files = sorted(half), sum(v.numel() * v.element_size() for v in half.values()), []
    budget, chunk, size = total / parts, {}, 0
    for key in keys:
        chunk[key] = half[key]
        size += half[key].numel() * half[key].element_size()
        if size >= budget and len(files) < parts - 1:
            files.append(chunk)
            chunk, size = {}, 0
    files.append(chunk)
    meta = {"step": str(state["step"]), "source": path.name}
    written = []
    for i, tensors in enumerate(files):
        written.append(out / f"weights-{i}.safetensors")
        save_file(tensors, str(written[-1]), metadata=meta)
    print(f"step {state['step']}: {len(half)} tensors in {len(written)} files")
    return written


def join(folder: Path, target: Path) -> Path:
    tensors, meta = {}, {}
    for path in sorted(folder.glob("weights-*.safetensors")):
        from safetensors import safe_open
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or meta
        tensors.update(load_file(str(path)))
    save_file(tensors, str(target), metadata=meta)
    return target


if __name__ == "__main__":
    verb, a, b = sys.argv[1:4]
    split(Path(a), Path(b)) if verb == "split" else join(Path(a), Path(b))
