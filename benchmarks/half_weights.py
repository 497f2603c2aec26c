"""A training run's current weights in half precision, split into files small enough to carry.

    python3 benchmarks/half_weights.py split RUN_DIR OUT_DIR     # latest checkpoint (EMA if kept) -> OUT_DIR/weights-{0,1,...}.safetensors
    python3 benchmarks/half_weights.py join OUT_DIR FILE.safetensors
    python3 benchmarks/half_weights.py ship RUN_DIR mapstream/weights/small.safetensors   # one file, as the package ships it
    python3 benchmarks/half_weights.py ship OUT_DIR mapstream/weights/small.safetensors   # the same from split's halves
    python3 benchmarks/half_weights.py ship RUN_DIR FILE.safetensors --int8   # large matrices in 8 bits (mapstream.weights.int8)
    python3 benchmarks/half_weights.py ship RUN_DIR FILE.safetensors --preset small-deep   # another preset's weights
    python3 benchmarks/half_weights.py ship OUT_DIR FILE.safetensors --image-size 294   # the width runs take by default
    python3 benchmarks/half_weights.py ship OUT_DIR FILE.safetensors --trained-views 48   # the longest training clip

The parts hold disjoint keys; `join` writes one float16 safetensors file that
`mapstream.load_model(FILE, preset=...)` reads. `ship` writes a run's weights as one float16
file whose metadata names its preset (``small`` unless --preset says), the frame width it
was trained at (the run's, or --image-size) and the most frames one of its training clips held
(as `mapstream train`'s export records it, or --trained-views), the form of mapstream's shipped
weights.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mapstream.checkpoint import IMAGE_SIZE_KEY, TRAINED_VIEWS_KEY

CARRY_BYTES = 12 * 2**20  # the device returns files of 16 MB at most; a part may end one tensor past this


def half_weights(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The latest checkpoint's weights (the EMA's where kept) in float16, and its step and name."""
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
    meta = {"step": str(state["step"]), "source": path.name}
    width = state.get("config", {}).get("image_hw", (None, None))[1]  # the width the run trained at
    if width is not None:
        meta[IMAGE_SIZE_KEY] = str(width)
    if (views := _trained_views(state.get("config"))) is not None:
        meta[TRAINED_VIEWS_KEY] = str(views)
    return half, meta


def _trained_views(config: dict | None) -> int | None:
    """What the run's export records as its longest training clip (`mapstream.train.trainer.
    trained_views`), or None where the run's configuration or initial weights are not at hand."""
    from mapstream.train.config import from_dict
    from mapstream.train.trainer import trained_views

    if not config:
        return None
    try:
        return trained_views(from_dict(config, source="the checkpoint's configuration"))
    except (OSError, ValueError) as exc:  # the initial checkpoint is elsewhere: ship --trained-views says it
        print(f"the longest training clip is not recorded ({exc}); ship --trained-views records it")
        return None


def ship(run: Path, target: Path, preset: str = "small", int8: bool = False, image_size: int | None = None,
         trained_views: int | None = None) -> Path:
    """RUN_DIR is a training run, or a folder of halves that `split` wrote on another machine;
    with `int8`, the large matrices are stored in 8 bits with a scale per row, about half the
    bytes (every loader of mapstream reads that form). `image_size` records the width runs of
    the file take by default, `trained_views` the most frames one training clip held, where the
    source does not record them (or records others)."""
    half, meta = read_halves(run) if any(run.glob("weights-*.safetensors")) else half_weights(run)
    meta = {**meta, "preset": preset}
    if image_size is not None:
        meta[IMAGE_SIZE_KEY] = str(image_size)
    if trained_views is not None:
        meta[TRAINED_VIEWS_KEY] = str(trained_views)
    if int8:
        from mapstream.weights.int8 import INT8_ROWS, STORAGE_KEY, quantize

        half, meta = quantize(half), {**meta, STORAGE_KEY: INT8_ROWS}
    save_file(half, str(target), metadata=meta)
    return target


def split(run: Path, out: Path, parts: int | None = None) -> list[Path]:
    """At least two files, and as many more as keep each under CARRY_BYTES."""
    half, meta = half_weights(run)
    keys, total, files = sorted(half), sum(v.numel() * v.element_size() for v in half.values()), []
    parts = parts or max(2, math.ceil(total / CARRY_BYTES))
    budget, chunk, size = total / parts, {}, 0
    for key in keys:
        chunk[key] = half[key]
        size += half[key].numel() * half[key].element_size()
        if size >= budget and len(files) < parts - 1:
            files.append(chunk)
            chunk, size = {}, 0
    files.append(chunk)
    written = []
    for i, tensors in enumerate(files):
        written.append(out / f"weights-{i}.safetensors")
        save_file(tensors, str(written[-1]), metadata=meta)
    print(f"step {meta['step']}: {len(half)} tensors in {len(written)} files")
    return written


def read_halves(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    tensors, meta = {}, {}
    for path in sorted(folder.glob("weights-*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            meta = handle.metadata() or meta
        tensors.update(load_file(str(path)))
    return tensors, meta


def join(folder: Path, target: Path) -> Path:
    tensors, meta = read_halves(folder)
    save_file(tensors, str(target), metadata=meta)
    return target


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", choices=("split", "join", "ship"))
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--int8", action="store_true", help="ship: large matrices in 8 bits")
    parser.add_argument("--preset", help="ship: the preset the file names (default: small)")
    parser.add_argument("--image-size", type=int,
                        help="ship: the frame width runs of the file take by default (default: the run's own)")
    parser.add_argument("--trained-views", type=int,
                        help="ship: the most frames one training clip held (default: as the run's export records)")
    args = parser.parse_args()
    if args.verb != "ship" and (args.int8 or args.preset or args.image_size or args.trained_views):
        parser.error("only ship takes --int8, --preset, --image-size and --trained-views")
    options = ({"int8": args.int8, "preset": args.preset or "small", "image_size": args.image_size,
                "trained_views": args.trained_views} if args.verb == "ship" else {})
    {"split": split, "join": join, "ship": ship}[args.verb](args.source, args.target, **options)
