"""The training loop: AdamW with warm-up and cosine decay, checkpoints, resume, DDP or FSDP.

`train(config)` runs on one process, or on each process `torchrun` starts (`WORLD_SIZE` > 1):
every process then trains on its own share of the clips (the data's `rank`/`world_size`) a
DDP replica or, with `distributed: fsdp`, a shard of the model (`mapstream.train.distributed`);
either averages the gradients, and only rank 0 writes files. Because each process's loss is
the mean over its clips and the processes' gradients are averaged, N processes with B clips
each train exactly as one process with N B clips.

A run in an output folder that holds checkpoints continues from the latest one: the weights,
the EMA, the optimizer's moments, the schedule, the step and the RNG states come back, and the
data, which depends only on the step, continues where it stopped, so the resumed run computes
what the uninterrupted run computes.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import IMAGE_SIZE_KEY, TRAINED_VIEWS_KEY, recorded_trained_views, resolve_checkpoint
from ..io.atomic import atomic_write_text, prepare_dir
from ..progress import progress_bar
from .checkpointing import (
    checkpoint_path, export_weights, latest_checkpoint, load_checkpoint, prune_checkpoints,
    remove_interrupted_writes, rng_state, save_checkpoint, set_rng_state,
)
from .config import TrainConfig, config_dict
from .deepen import deepen_state_dict
from .distributed import Parallel
from .ema import EMA
from .flow import PatchFlowHead
from .forward import clip_forward
from .init import init_for_training_, init_head_for_training_
from .lora import add_lora, merged_state_dict, select_trainable
from .logs import log_step, start_logs, tensorboard_writer
from .losses import total_loss
from .validate import Validation

__all__ = ["TrainSummary", "train", "build_training_model", "lr_factor", "trained_views"]

log = logging.getLogger(__name__)
WEIGHTS_NAME = "model.safetensors"
RUN_FILES = frozenset({WEIGHTS_NAME, "config.json", "val_references.json", "metrics.jsonl"})
"""The files a run writes atomically into its output folder (besides its checkpoints)."""


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """What a run did."""

    out: Path
    """The output folder."""
    start_step: int
    """The step the run started from (0, or the resumed checkpoint's)."""
    steps: int
    """The step the run reached."""
    losses: tuple[float, ...]
    """The total loss of each step this run took (averaged over all processes)."""
    weights: Path | None
    """The exported model.safetensors: at the last step, or at a stop by the time limit (the
    weights so far); None when interrupted."""
    checkpoint: Path | None
    """The latest checkpoint written."""
    preset: str
    """The architecture (load the weights with `mapstream.load_model(weights, preset=preset)`)."""
    trained_parameters: int
    """Number of trained scalars."""
    world_size: int
    seconds: float


def lr_factor(step: int, warmup_steps: int, steps: int, min_ratio: float) -> float:
    """The learning rate of the update at `step` (from 0) over the peak: linear warm-up to 1 over
    `warmup_steps` updates, then a cosine from 1 down to `min_ratio` at the last step."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _preset_of(model) -> str:
    from ..config import get_preset, preset_names

    for name in preset_names():
        if dataclasses.replace(get_preset(name).model, enable_point=model.config.enable_point) == model.config:
            return name
    return "auto"


def build_training_model(config: TrainConfig) -> tuple[nn.Module, str]:
    """The model to train (on the CPU, fp32) and its preset: a preset name's architecture with
    random weights drawn from `config.seed`, or a loaded checkpoint."""
    import mapstream
    from ..config import preset_names

    if config.model in preset_names():
        if config.deepen is not None:
            raise ValueError(f"--deepen grows a trained checkpoint, but --model {config.model} is a preset name: "
                             "give the checkpoint to deepen as --model")
        model = mapstream.build_model(config.model, enable_point=config.enable_point)
        return init_for_training_(model, config.seed, matching=config.matching_init), config.model
    if config.matching_init:
        raise ValueError(f"--matching-init draws initial weights, but --model {config.model} is a checkpoint: "
                         "drop the flag, or give a preset name to train from scratch")
    source = Path(config.model).expanduser()
    if not source.exists() and "/" not in config.model:
        raise ValueError(f"--model {config.model}: neither a preset ({', '.join(preset_names())}) "
                         "nor an existing checkpoint file or folder")
    model = mapstream.load_model(config.model, filename=config.checkpoint_file, preset=config.preset)
    if config.deepen is not None:
        model = _deepened(model, config.deepen)
    if config.enable_point and model.point_head is None:
        model = _with_new_point_head(config, model)
    return model, config.deepen or (_preset_of(model) if config.preset == "auto" else config.preset)


def trained_views(config: TrainConfig) -> int | None:
    """What the export records as the most frames one training clip held: this run's longest
    clips, or the initial checkpoint's record where longer; None when the initial checkpoint
    records none (the official weights: their clips' length is not known, and this run's
    shorter clips would understate it)."""
    from ..config import preset_names

    longest = max((config.frames, *config.more_frames))
    if config.model in preset_names():
        return longest
    recorded = recorded_trained_views(resolve_checkpoint(config.model, filename=config.checkpoint_file))
    return None if recorded is None else max(recorded, longest)


def _deepened(loaded: nn.Module, preset: str) -> nn.Module:
    """`loaded` grown into the deeper `preset` (`mapstream.train.deepen`): the same function."""
    from ..config import get_preset

    target = dataclasses.replace(get_preset(preset).model, enable_point=loaded.config.enable_point)
    model = type(loaded)(target, loaded.stream_config)
    model.load_state_dict(deepen_state_dict(loaded.state_dict(), loaded.config, target))
    log.info("deepened the checkpoint into %s: %d -> %d parameters, every added block the identity", preset,
             sum(p.numel() for p in loaded.parameters()), sum(p.numel() for p in model.parameters()))
    return model.eval()


def _with_new_point_head(config: TrainConfig, loaded: nn.Module) -> nn.Module:
    """`loaded` rebuilt with a point head drawn from `config.seed` (the official checkpoints
    and most trained ones have none); every other weight is the checkpoint's."""
    model = type(loaded)(dataclasses.replace(loaded.config, enable_point=True), loaded.stream_config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("point_head.") for k in missing), (missing, unexpected)
    init_head_for_training_(model, "point_head", config.seed)
    log.info("%s has no point head: training a new one (drawn from seed %d)", config.model, config.seed)
    return model.eval()


class _Clips(nn.Module):
    """The clip forward as a module, so that DDP sees (and synchronises) its forward; with a
    flow head (a training-only read-out of the patch tokens) it also predicts patch_flow."""

    def __init__(self, model: nn.Module, num_scale_frames: int, checkpoint_layers: bool, attention: str,
                 dense_autocast: bool, flow_head: PatchFlowHead | None = None) -> None:
        super().__init__()
        self.model, self.num_scale_frames, self.checkpoint_layers = model, num_scale_frames, checkpoint_layers
        self.attention, self.dense_autocast, self.flow_head = attention, dense_autocast, flow_head

    def forward(self, images: torch.Tensor, num_scale_frames: int | None = None, dense: bool = True) -> dict[str, Any]:
        scale = self.num_scale_frames if num_scale_frames is None else num_scale_frames
        out = clip_forward(self.model, images, num_scale_frames=scale, dense=dense,
                           checkpoint_layers=self.checkpoint_layers, attention=self.attention,
                           dense_autocast=self.dense_autocast, keep_layers=self.flow_head is not None)
        if self.flow_head is not None:
            out["patch_flow"] = self.flow_head(out.pop("layers")[-1][:, :, self.model.config.num_special_tokens:])
        return out


def _data(config: TrainConfig, rank: int, world: int, device: torch.device, start_step: int):
    from .data import FolderClips, ProceduralClips

    if config.data is None:
        sizes = [tuple(config.image_hw), *(tuple(hw) for hw in config.more_image_hw)]
        return ProceduralClips(config.batch_size, config.frames, sizes, rank=rank, world_size=world,
                               device=device, start_step=start_step, reuse_reversed=config.reuse_reversed,
                               path_kinds=config.path_kinds, reuse_mirrored=config.reuse_mirrored,
                               objects=config.scene_objects, frame_step=config.frame_step,
                               prefetch_scenes=config.prefetch_scenes, synthetic_share=config.synthetic_share,
                               first_clip=config.first_clip, more_frames=config.more_frames)
    return FolderClips(config.data, config.batch_size, config.frames, config.image_hw[1], stride=config.folder_stride,
                       seed=config.seed, rank=rank, world_size=world, device=device, start_step=start_step)


def _distributed(config: TrainConfig) -> tuple[int, int, torch.device, bool]:
    """(rank, world size, device, whether this call set up the process group)."""
    from ..device import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(config.device)
    if world <= 1:
        return 0, 1, device, False
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device, started


def _flow_head(config: TrainConfig, model: nn.Module, state: dict | None, world: int,
               device: torch.device) -> PatchFlowHead | None:
    """The training-only patch-flow head when --loss-flow weighs it (drawn from --seed, or the
    resumed checkpoint's); None otherwise."""
    if not config.loss.flow:
        if state is not None and "flow_head" in state:
            raise ValueError(f"the checkpoint in {config.out} was trained with a patch-flow head: resume it with "
                             "its --loss-flow, or start over (--no-resume or another --out)")
        return None
    if world > 1 and config.distributed == "fsdp":
        raise ValueError("--loss-flow's head is not sharded by --distributed fsdp: use --distributed ddp")
    head = init_for_training_(PatchFlowHead(2 * model.config.embed_dim), config.seed)
    if state is not None:
        if "flow_head" not in state:
            raise ValueError(f"the checkpoint in {config.out} was trained without a patch-flow head: resume it "
                             "with --loss-flow 0, or start over (--no-resume or another --out)")
        head.load_state_dict(state["flow_head"])
    return head.to(device).train()


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            # Biases, norms, LayerScale factors and tokens keep their scale: no weight decay.
            (decay if p.ndim >= 2 and "token" not in name and "pos_embed" not in name else plain).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=tuple(config.betas))


def _mean_over_ranks(values: dict[str, torch.Tensor], world: int) -> tuple[list[str], torch.Tensor]:
    """The parts' names and their means over the ranks, still on the device: reading them
    waits for the GPU, which the loop does only when it logs."""
    names = sorted(values)
    stacked = torch.stack([values[n].detach().float().reshape(()) for n in names])
    if world > 1:
        dist.all_reduce(stacked)
        stacked /= world
    return names, stacked


class _PhaseClock:
    """Seconds of each phase of a step (`mark(name)` ends the phase `name`), the device waited
    for at each boundary so that its queued work counts where it was issued. Off (`timed`
    False) it records nothing and never waits."""

    def __init__(self, device: torch.device, timed: bool) -> None:
        self.device, self.timed, self.seconds = device, timed, {}
        self.start = self._last = self._now() if timed else time.perf_counter()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, name: str) -> None:
        if self.timed:
            now = self._now()
            self.seconds[name], self._last = now - self._last, now


def _out_of_time(started: float, limit_minutes: float | None, world: int, device: torch.device) -> bool:
    """Whether the run's time is up; every rank gets the answer of the slowest one."""
    if limit_minutes is None:
        return False
    over = time.perf_counter() - started > 60.0 * limit_minutes
    if world > 1:
        flag = torch.tensor([float(over)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        over = bool(flag.item())
    return over


def train(config: TrainConfig, *, progress: bool | None = None, stop_at: int | None = None) -> TrainSummary:
    """Run (or continue) the training `config` describes; see the module docstring.

    stop_at: end after this step with a checkpoint, as an interruption would (a job that has
    only so much time); the next call continues the same schedule towards `config.steps`.
    """
    started = time.perf_counter()
    rank, world, device, own_group = _distributed(config)
    try:
        return _train(config, rank, world, device, progress, started, stop_at or config.steps)
    finally:
        if own_group:
            dist.destroy_process_group()


def _train(config: TrainConfig, rank: int, world: int, device: torch.device, progress, started,
           stop_at: int) -> TrainSummary:
    if config.precision == "bf16" and device.type != "cuda":
        raise ValueError("--precision bf16 needs a CUDA device (autocast on the CPU is not supported here)")
    out = Path(config.out)
    lead = rank == 0
    if lead:
        prepare_dir(out)
        remove_interrupted_writes(out, RUN_FILES)  # a run killed mid-write (kill -9) left its temp files
        start_logs(out, config.resume)
    model, preset = build_training_model(config)
    if config.finetune == "lora":
        add_lora(model, config.lora_rank, config.lora_alpha, seed=config.seed)
    trained = select_trainable(model, config.finetune, freeze_patch_embed=config.freeze_patch_embed,
                               freeze_frame_blocks=config.freeze_frame_blocks)
    model.to(device).train()
    parallel = Parallel(config.distributed, world, rank, device)
    start_step, resumed = 0, latest_checkpoint(out) if config.resume else None
    state = load_checkpoint(resumed) if resumed is not None else None
    flow_head = _flow_head(config, model, state, world, device)
    if state is not None:  # the full weights, before sharding splits them
        model.load_state_dict(state["model"])
    clips = _Clips(model, config.num_scale_frames, config.checkpoint_layers, config.attention,
                   config.autocast_dense_heads and config.precision == "bf16", flow_head)
    forward: nn.Module = parallel.wrap(clips, model, some_unused=config.dense_every > 1)
    optimizer = _optimizer(clips, config)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, config.steps, config.min_lr_ratio))
    ema = EMA(model, config.ema_decay) if config.ema_decay is not None else None

    if state is not None:
        parallel.load_optimizer_state(model, optimizer, state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        if ema is not None and "ema" in state:
            parallel.load_ema_state(ema, state["ema"])
        set_rng_state(state["rng"])
        start_step = int(state["step"])
        for group, base in zip(optimizer.param_groups, schedule.base_lrs):  # the schedule of this --steps
            group["lr"] = base * lr_factor(start_step, config.warmup_steps, config.steps, config.min_lr_ratio)
        changed = {k for k, v in config_dict(config).items() if state["config"].get(k) != v}
        # How long this call runs and how it spreads over processes, not what it trains.
        changed -= {"steps", "resume", "time_limit_minutes", "distributed", "prefetch_scenes"}
        log.info("resuming from %s (step %d)%s", resumed, start_step,
                 f"; settings changed since: {sorted(changed)}" if changed else "")
    if start_step >= config.steps:
        log.info("%s already holds step %d of %d: nothing to train", out, start_step, config.steps)

    del state  # the checkpoint's tensors are loaded; keep no second copy through the run
    writer = tensorboard_writer(out) if lead and config.tensorboard else None
    validation = Validation(config.val_clips, config.val_frames or config.frames, tuple(config.image_hw), device,
                            path_kinds=config.path_kinds, loss=config.loss,
                            num_scale_frames=config.val_scale_frames or None,
                            frame_step=config.val_frame_step) if config.val_every else None
    if lead:
        atomic_write_text(out / "config.json", json.dumps(config_dict(config), indent=2) + "\n")
        log.info("training %d parameters (%s, %s) on %d process(es) (%s), device %s", sum(
            p.numel() for p in model.parameters() if p.requires_grad), preset, config.finetune, world,
            config.distributed, device)
        if validation is not None:
            levels = validation.references(model.config.patch_size if config.loss.flow else None)
            atomic_write_text(out / "val_references.json", json.dumps(levels, indent=2) + "\n")
            log.info("held-out levels of no motion learned: %s",
                     ", ".join(f"{k} {v:.4g}" for k, v in levels.items()))

    params = [p for p in clips.parameters() if p.requires_grad]
    autocast = torch.autocast("cuda", torch.bfloat16) if config.precision == "bf16" else nullcontext()
    data = _data(config, rank, world, device, start_step)
    batches = iter(data)
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # this process's step losses not yet read back from the device
    step, saved, last_checkpoint = start_step, start_step, resumed
    timed_out = False

    def checkpoint() -> Path | None:
        """Write a checkpoint (rank 0) and return its path; sharded, every rank takes part in
        gathering the full tensors."""
        if not (lead or parallel.sharded):
            return None
        state = {"model": parallel.model_state(model), "optimizer": parallel.optimizer_state(model, optimizer),
                 "schedule": schedule.state_dict(), "step": step, "rng": rng_state(), "config": config_dict(config)}
        if ema is not None:
            state["ema"] = parallel.ema_state(ema)
        if flow_head is not None:
            state["flow_head"] = flow_head.state_dict()
        if not lead:
            return None
        path = save_checkpoint(checkpoint_path(out, step), state)
        prune_checkpoints(out, config.keep_checkpoints)
        return path

    bar = progress_bar(config.steps, desc="train", unit="step", initial=start_step, progress=progress if lead else False)
    try:
        with bar:
            while step < min(stop_at, config.steps):
                # A log step times its phases apart, waiting for the device at each boundary.
                clock = _PhaseClock(device, timed=(step + 1) % config.log_every == 0)
                tick = clock.start
                batch = next(batches)
                clock.mark("data")
                with autocast:
                    # Dense steps are in phase with the log steps (step + 1 a multiple of
                    # log_every): with log_every a multiple of dense_every, every log carries
                    # the depth loss.
                    pred = forward(batch["images"], dense=(step + 1 - config.log_every) % config.dense_every == 0)
                clock.mark("forward")
                loss, parts = total_loss(pred, batch, config.loss)
                clock.mark("loss")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                clock.mark("backward")
                norm = parallel.full(
                    torch.nn.utils.clip_grad_norm_(params, config.grad_clip if config.grad_clip > 0 else math.inf))
                lr = optimizer.param_groups[0]["lr"]
                optimizer.step()
                schedule.step()
                if ema is not None:
                    ema.update(model)
                clock.mark("optimizer")
                step += 1
                names, stacked = _mean_over_ranks(parts, world)
                pending.append(stacked[names.index("loss")])
                bar.update(1)
                last = step in (config.steps, stop_at)
                if step % config.log_every == 0 or last:
                    seconds = time.perf_counter() - tick
                    losses.extend(torch.stack(pending).tolist())
                    pending.clear()
                    bar.set_postfix_str(f"loss {losses[-1]:.4f}")
                    values = dict(zip(names, stacked.tolist()))
                    if validation is not None and (step % config.val_every == 0 or last):
                        values.update(validation(forward, autocast))  # every rank: FSDP gathers
                    if lead:
                        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
                        log_step(out, writer, step, values, lr, float(norm), seconds, clock.seconds, peak)
                    if not last and _out_of_time(started, config.time_limit_minutes, world, device):
                        log.info("time limit of %s minutes reached at step %d", config.time_limit_minutes, step)
                        stop_at = step
                        last = timed_out = True
                if step % config.checkpoint_every == 0 or last:
                    written = checkpoint()
                    last_checkpoint, saved = written or last_checkpoint, step  # written: None off rank 0
    except KeyboardInterrupt:
        losses.extend(torch.stack(pending).tolist() if pending else [])
        # Sharded, the gather needs every rank, which an interruption stops anywhere: the
        # latest periodic checkpoint is where the run continues.
        if lead and step > saved and not parallel.sharded:
            last_checkpoint = checkpoint()
            log.info("interrupted: wrote %s (step %d)", last_checkpoint, step)
        raise
    finally:
        if writer is not None:
            writer.close()
        data.close()  # procedural clips' scene-prefetching worker, if any

    weights = None
    # Procedural clips: where a run going on from this export starts to see clips it never saw.
    next_clip = data.next_clip(step) if hasattr(data, "next_clip") else None
    # A stop by the time limit is agreed by every process, so the export (a gather, sharded)
    # is safe there too: each leg of a job leaves usable weights.
    if (lead or parallel.sharded) and (step >= config.steps or timed_out):
        with (ema.applied(model) if ema is not None else nullcontext()):
            # Sharded runs hold no LoRA adapters (Parallel.wrap refuses them): the state is the export.
            # Written inside: the unsharded state's tensors are the parameters, restored on exit.
            exported = parallel.model_state(model) if parallel.sharded else merged_state_dict(model)
            if lead:
                # The width runs of these weights take by default (more_image_hw's are further sizes).
                metadata = {"format": "pt", "architecture": "GCTStream", "preset": preset, "step": str(step),
                            "finetune": config.finetune, "ema": str(ema is not None),
                            IMAGE_SIZE_KEY: str(config.image_hw[1])}
                if next_clip is not None:
                    metadata["next_clip"] = str(next_clip)
                if (views := trained_views(config)) is not None:
                    metadata[TRAINED_VIEWS_KEY] = str(views)
                weights = export_weights(exported, out / WEIGHTS_NAME, metadata)
    if weights is not None:
        log.info("wrote %s (step %d; load it with mapstream.load_model(path, preset=%r))", weights, step, preset)
        if next_clip is not None:
            log.info("a run going on from these weights sees new clips with --first-clip %d", next_clip)
    if world > 1:
        dist.barrier()
    return TrainSummary(out=out, start_step=start_step, steps=step, losses=tuple(losses), weights=weights,
                        checkpoint=last_checkpoint, preset=preset, trained_parameters=sum(
                            p.numel() for n, p in model.named_parameters() if n in set(trained)),
                        world_size=world, seconds=time.perf_counter() - started)
