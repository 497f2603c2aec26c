"""Training step time and peak memory of an architecture, through `mapstream.train.train`.

    python3 benchmarks/train_step.py --preset lingbot-map --device cuda --precision bf16 \
        --frames 8 --hw 294 518 --batch-size 1 --steps 4 --checkpoint-layers --out step.json

Runs a few optimizer steps of the real loop on procedural clips (random weights: the time
and memory of a step do not depend on their values) and reports the mean time of the steps
after the first (which pays for warm-up, compilation and allocation) and the peak GPU memory.
`--kernels K` also profiles the run and lists the K GPU kernels that take the most time, per
step. Writes JSON with `--out`; prints one line (and the kernel table).

Under torchrun every process runs the loop on its GPU (`--batch-size` clips each) as
`--distributed` ddp or fsdp says, and rank 0 reports each process's peak memory:

    torchrun --standalone --nproc_per_node=8 benchmarks/train_step.py --preset lingbot-map \
        --device cuda --precision bf16 --frames 8 --hw 294 518 --batch-size 1 --steps 3 \
        --checkpoint-layers --distributed fsdp --out fsdp_step.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import os
import shutil
import tempfile
from pathlib import Path

import torch


@contextlib.contextmanager
def _kernel_profile(top: int, steps: int):
    """Yields a dict that, on exit, holds the `top` GPU kernels by total time (ms per step)."""
    kernels: dict[str, float] = {}
    if top <= 0 or not torch.cuda.is_available():
        yield kernels
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield kernels
    rows = [(e.key, e.device_time_total) for e in prof.key_averages() if e.device_time_total > 0]
    for name, micros in sorted(rows, key=lambda r: -r[1])[:top]:
        kernels[name[:110]] = micros / 1e3 / steps


def _process_group(device: str) -> tuple[int, int]:
    """(rank, world size); under torchrun the process group is started here, so that `train`
    leaves it up for gathering the processes' peak memory afterwards."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _shared_folder(rank: int, world: int) -> str:
    """A temporary folder rank 0 makes and every process uses (train's output folder is shared)."""
    folder = [tempfile.mkdtemp(prefix="train_step_") if rank == 0 else None]
    if world > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(folder, src=0)
    return folder[0]


def main(argv: list[str] | None = None) -> dict:
    from mapstream.train.config import TrainConfig
    from mapstream.train.trainer import train

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--hw", type=int, nargs=2, default=(294, 518))
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--checkpoint-layers", action="store_true")
    ap.add_argument("--finetune", choices=("full", "heads", "lora"), default="full")
    ap.add_argument("--attention", choices=("auto", "sdpa", "flex"), default="auto")
    ap.add_argument("--kernels", type=int, default=0, help="list this many of the costliest GPU kernels")
    ap.add_argument("--distributed", choices=("ddp", "fsdp"), default="ddp",
                    help="under torchrun: DDP replicas or FSDP shards (one process: no difference)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is not timed)")
    rank, world = _process_group(args.device)
    folder = _shared_folder(rank, world)
    on_gpu = torch.cuda.is_available() and args.device.startswith("cuda")
    try:
        config = TrainConfig(
            model=args.preset, device=args.device, precision=args.precision, frames=args.frames,
            image_hw=tuple(args.hw), batch_size=args.batch_size, steps=args.steps, warmup_steps=1,
            checkpoint_layers=args.checkpoint_layers, finetune=args.finetune, out=Path(folder),
            checkpoint_every=args.steps, log_every=1, tensorboard=False, attention=args.attention,
            distributed=args.distributed,
        )
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        with _kernel_profile(args.kernels, args.steps) as kernels:
            summary = train(config, progress=False)
        records = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]
        peaks = [torch.cuda.max_memory_allocated() if on_gpu else None]
        if world > 1:
            import torch.distributed as dist

            peaks = [None] * world
            dist.all_gather_object(peaks, torch.cuda.max_memory_allocated() if on_gpu else None)
            # Every process leaves together: one tearing its group down while a peer's transport
            # still sends or receives can abort that peer at exit.
            dist.barrier()
            dist.destroy_process_group()
    finally:
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    times = [r["step_seconds"] for r in records if "step_seconds" in r][1:]
    phases = {name: statistics.mean(r[f"{name}_seconds"] for r in records[1:])
              for name in ("data", "forward", "loss", "backward", "optimizer")}
    result = {
        "preset": args.preset, "device": args.device, "precision": args.precision, "frames": args.frames,
        "hw": list(args.hw), "batch_size": args.batch_size, "checkpoint_layers": args.checkpoint_layers,
        "finetune": args.finetune, "attention": args.attention, "kernels_ms_per_step": kernels,
        "trained_parameters": summary.trained_parameters,
        "distributed": args.distributed, "world_size": world, "global_batch": args.batch_size * world,
        "peak_gpu_bytes_per_process": peaks,
        "step_seconds": statistics.mean(times), "phase_seconds": phases, "losses": list(summary.losses),
        "peak_gpu_bytes": max(peaks) if on_gpu else None,
    }
    if rank != 0:
        return result
    peak = f", peak {result['peak_gpu_bytes'] / 2**30:.1f} GiB" if result["peak_gpu_bytes"] else ""
    spread = f" x {world} processes ({args.distributed})" if world > 1 else ""
    print(f"{args.preset} {args.precision} {args.frames}x{args.hw[0]}x{args.hw[1]} batch {args.batch_size}{spread}: "
          f"{result['step_seconds']:.3f} s/step ({', '.join(f'{k} {v:.3f}' for k, v in phases.items())}){peak}")
    for name, ms in kernels.items():
        print(f"  {ms:9.2f} ms/step  {name}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
