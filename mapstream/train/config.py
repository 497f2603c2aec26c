"""The training run's configuration: one frozen dataclass, readable from a YAML file.

`TrainConfig` holds everything a run depends on. Its fields are declared in option groups
(`DataOptions`, `ModelOptions`, `OptimOptions`, `ScheduleOptions`, `DistributedOptions`,
`LogOptions`) that it inherits, so a run reads `config.lr` while `mapstream train --help`
shows each group in its own panel; the loss weights are `config.loss` (`LossWeights`).
`load_config(path, **overrides)` reads a YAML file whose keys are its fields (`loss:` a mapping
of `LossWeights` fields) and applies keyword overrides on top. The checkpoints store the configuration, so a resumed run can say what
changed.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from ..config import get_preset
from ..validation import check_count
from .distributed import DISTRIBUTED_MODES
from .forward import ATTENTION_KINDS
from .losses import LossWeights
from .render import SCENE_OBJECTS, check_object_range, check_path_kinds, check_share

__all__ = ["TrainConfig", "DataOptions", "DistributedOptions", "LogOptions", "ModelOptions",
           "OptimOptions", "ScheduleOptions", "FINETUNE_MODES", "check_train_config", "config_dict", "from_dict", "load_config"]

FINETUNE_MODES = ("full", "heads", "lora")


@dataclass(frozen=True)
class DataOptions:
    """The training clips: a posed folder or procedural rooms, their size and how many a step takes."""

    data: Optional[Path] = None
    """A posed folder (TUM, COLMAP text, transforms.json, benchmark layout) or a folder of them; default: procedural clips rendered on the training device."""
    frames: int = 8
    """Frames per training clip."""
    image_hw: tuple[int, int] = (294, 518)
    """Height and width of procedural clips (multiples of 14); a folder's frames take the width and their own aspect's height."""
    more_image_hw: tuple[tuple[int, int], ...] = ()
    """Further sizes of procedural clips: step k renders the (k mod n)-th of (image_hw, *more_image_hw), so that a model learns several resolutions."""
    more_frames: tuple[int, ...] = ()
    """Further lengths of procedural clips, taken in turn as the sizes are (each length over every size): a model that streams longer than its clips learns the later frames too."""
    reuse_reversed: bool = False
    """Procedural clips: each rendered batch also serves the next step with its clips' frames in reverse order (another clip for the causal model), halving the rendering per step."""
    reuse_mirrored: bool = False
    """Procedural clips: each rendered batch also serves a step mirrored left to right (the world mirrored with the images: still a valid posed clip); with --reuse-reversed one rendering serves four steps."""
    path_kinds: tuple[str, ...] = ()
    """Procedural clips: draw only these camera paths (forward, orbit, loop, pan); empty: all of them."""
    scene_objects: tuple[int, int] = SCENE_OBJECTS
    """Procedural clips: the least and most objects in a room (more objects: more landmarks to follow between frames, and more rendering); the held-out clips keep the default."""
    frame_step: int = 1
    """Procedural clips: take every k-th camera of a path drawn k times longer (larger motion between frames, as a video with frames skipped); the held-out clips take --val-frame-step."""
    synthetic_share: float = 0.0
    """Procedural clips: the share drawn from mapstream.synthetic's own family (render_sequence's rooms and inward orbit, with seeds reserved for training, at drawn arcs, fields of view and room sizes) instead of the wide draw; the held-out clips keep the wide draw."""
    first_clip: int = 0
    """Procedural clips: the training split's clip index that step 0 draws from. A run that goes on from another run's export with a fresh optimizer passes the next_clip that export records, so it trains on new clips instead of the ones the other run saw."""
    prefetch_scenes: bool = False
    """Procedural clips: draw the next rendering's rooms and camera paths in a worker process while the current one trains (the same batches; the drawing is CPU work the training loop would otherwise wait for)."""
    folder_stride: int = 1
    """Frame step inside a clip cut from a folder."""
    batch_size: int = 4
    """Clips per step on each process (the global batch is this times the number of processes)."""
    num_scale_frames: int = 2
    """The first frames of each clip, which see each other as streaming's scale frames do; the later ones see only earlier frames."""


@dataclass(frozen=True)
class ModelOptions:
    """The model trained: from scratch or a checkpoint, and which of its weights train."""

    model: str = "tiny"
    """A preset name (trained from scratch: random weights drawn from --seed) or a checkpoint to fine-tune (a .pt/.safetensors file, a folder, a Hugging Face repo id)."""
    preset: str = "auto"
    """Architecture of the checkpoint given by --model ("auto": the preset its keys and shapes fit); unused for a preset name."""
    checkpoint_file: Optional[str] = None
    """File inside the folder or repo given by --model (default: load_model's)."""
    matching_init: bool = False
    """From scratch (--model a preset): draw the patch embedding's position table as 2-D sines and cosines and tie the global blocks' keys to their queries, so that tokens attend to like content in other frames from the first step (with --loss-flow, what lets a small network learn to match frames; docs/TRAINING.md)."""
    deepen: Optional[str] = None
    """A deeper preset of the same width (e.g. small-deep) to grow the checkpoint given by --model into before training: its blocks spread over the deeper stacks, the added blocks starting as the identity, so training starts from the checkpoint's function (mapstream.train.deepen)."""
    enable_point: bool = False
    """Build and train the world-point head; a checkpoint without one gets a new head drawn from --seed."""
    finetune: Literal["full", "heads", "lora"] = "full"
    """full: train every weight (less what --freeze-patch-embed / --freeze-frame-blocks freeze); heads: only the camera, depth and point heads; lora: only low-rank adapters on the trunk's attention projections."""
    freeze_patch_embed: bool = False
    """Keep the patch embedding (the DINOv2 ViT) fixed."""
    freeze_frame_blocks: bool = False
    """Keep the trunk's frame-attention blocks fixed."""
    lora_rank: int = 8
    """Rank of each LoRA adapter (--finetune lora)."""
    lora_alpha: float = 16.0
    """LoRA's scale numerator: an adapter adds (alpha / rank) B A to its projection's weight."""
    seed: int = 0
    """Seed of the initial weights, LoRA adapters, and of a folder's clip order."""


@dataclass(frozen=True)
class OptimOptions:
    """The optimizer (AdamW) and how each step computes."""

    lr: float = 1e-4
    """Peak learning rate of AdamW, reached at the end of the warm-up."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's moment decay rates."""
    weight_decay: float = 0.05
    """AdamW's decoupled weight decay (not applied to biases, norms, tokens and LayerScale factors)."""
    grad_clip: float = 1.0
    """Largest global gradient norm (larger gradients are scaled down to it); 0 turns clipping off."""
    ema_decay: Optional[float] = None
    """Keep an exponential moving average of the trained weights with this decay (e.g. 0.999); the exported weights are the average's."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """bf16: the forward in bfloat16 autocast (CUDA only; losses, optimizer and weights stay fp32)."""
    autocast_dense_heads: bool = True
    """With --precision bf16, run the depth (and point) head in bf16 too (the camera head stays fp32): half the memory traffic of the full-resolution DPT; inference runs the heads in fp32 either way."""
    dense_every: int = 1
    """Run and supervise the depth (and point) head every this many steps, in phase with the logged steps; the steps between train the trunk and the camera head alone, at about half the cost of a full step (the full-resolution dense heads are most of a small network's step). With --log-every a multiple of it, every logged step carries the depth loss."""
    checkpoint_layers: bool = False
    """Recompute each trunk layer's activations in the backward pass instead of keeping them: less memory, about a third more time."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Global attention of the training forward: flex (compiled FlexAttention, which skips the blocks the block-causal mask hides), sdpa (a dense mask), or auto (flex on CUDA, sdpa elsewhere)."""


@dataclass(frozen=True)
class ScheduleOptions:
    """How long the run is, the learning rate's schedule, and its checkpoints."""

    steps: int = 1000
    """Optimizer steps of the whole run (a resumed run continues up to this count)."""
    warmup_steps: int = 100
    """Steps of linear warm-up from 0 to --lr; cosine decay to --min-lr-ratio times --lr follows until --steps."""
    min_lr_ratio: float = 0.01
    """The learning rate at the last step, as a fraction of --lr."""
    out: Path = Path("runs/train")
    """Output folder: checkpoints, logs, TensorBoard events and the final model.safetensors. A run there is resumed."""
    checkpoint_every: int = 500
    """Write a checkpoint every this many steps (and at the end, and on Ctrl-C)."""
    keep_checkpoints: int = 2
    """How many of the latest checkpoints stay in the output folder."""
    resume: bool = True
    """Continue from the latest checkpoint in --out; --no-resume starts over, deleting the old checkpoints and logs there."""
    time_limit_minutes: Optional[float] = None
    """Stop with a checkpoint at the first log step after this many minutes (a job with a time limit); running again continues the schedule."""


@dataclass(frozen=True)
class DistributedOptions:
    """Where the run computes: one device, or several GPUs under torchrun."""

    device: str = "auto"
    """cpu, cuda, cuda:N or auto; under torchrun each process takes the GPU of its LOCAL_RANK."""
    distributed: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: ddp (each process holds the whole model) or fsdp (each holds a 1/N shard of the weights, gradients and optimizer state; FSDP2); one process ignores it."""


@dataclass(frozen=True)
class LogOptions:
    """What the run logs, and the held-out clips it scores."""

    log_every: int = 10
    """Log the loss parts, learning rate, gradient norm and step time every this many steps."""
    tensorboard: bool = True
    """Write TensorBoard scalars to OUT/tensorboard (needs the train extra: pip install mapstream[train])."""
    val_every: int = 0
    """Score held-out procedural clips (the "val" split, rendered once) every this many steps, a multiple of --log-every: losses, camera rotation and direction errors in degrees, depth abs_rel, as val_* in the metrics; 0: never."""
    val_clips: int = 8
    """How many held-out clips --val-every scores (one forward, at --image-hw)."""
    val_frames: int = 0
    """Frames of each held-out clip; 0: --frames. Lets a run on short clips be scored at the length it will stream."""
    val_scale_frames: int = 0
    """Scale frames of the held-out clips; 0: --num-scale-frames."""
    val_frame_step: int = 1
    """Frame step of the held-out clips (as --frame-step): score a run on fast motion at the motion it trains on."""


@dataclass(frozen=True)
class TrainConfig(LogOptions, DistributedOptions, ScheduleOptions, OptimOptions, ModelOptions, DataOptions):
    """A training or fine-tuning run (docs/TRAINING.md, "Training: the command and its options"):
    the fields of the option groups above, and the loss weights."""

    loss: LossWeights = field(default_factory=LossWeights)
    """Weights of the loss terms and their hyper-parameters (docs/TRAINING.md, "Losses")."""

    def __post_init__(self) -> None:
        check_train_config(self)


def check_train_config(c: TrainConfig) -> None:
    """ValueError naming the field for a value a run cannot use."""
    for name in ("frames", "batch_size", "num_scale_frames", "steps", "checkpoint_every", "log_every",
                 "keep_checkpoints", "lora_rank", "folder_stride", "frame_step", "dense_every"):
        check_count(name, getattr(c, name))
    check_count("warmup_steps", c.warmup_steps, least=0)
    check_count("first_clip", c.first_clip, least=0)
    for count in c.more_frames:
        check_count("more_frames", count)
    if c.more_frames and c.data is not None:
        raise ValueError("more_frames applies to procedural clips; a --data folder's clips are --frames long")
    if c.first_clip and c.data is not None:
        raise ValueError("first_clip applies to procedural clips; a --data folder's clips follow --seed")
    check_count("val_every", c.val_every, least=0)
    check_count("val_clips", c.val_clips)
    check_object_range(c.scene_objects)
    check_count("val_frames", c.val_frames, least=0)
    check_count("val_scale_frames", c.val_scale_frames, least=0)
    check_count("val_frame_step", c.val_frame_step)
    if (c.val_scale_frames or c.num_scale_frames) > (c.val_frames or c.frames):
        raise ValueError(f"the held-out clips' {c.val_scale_frames or c.num_scale_frames} scale frames exceed "
                         f"their {c.val_frames or c.frames} frames: lower --val-scale-frames or raise --val-frames")
    if c.val_every and c.val_every % c.log_every:
        raise ValueError(f"val_every ({c.val_every}) must be a multiple of log_every ({c.log_every}): "
                         "validation is recorded with a log step's metrics")
    if len(c.image_hw) != 2 or any(int(s) < 14 or int(s) % 14 for s in c.image_hw):
        raise ValueError(f"image_hw must be two multiples of 14, got {c.image_hw}")
    for hw in c.more_image_hw:
        if len(hw) != 2 or any(int(s) < 14 or int(s) % 14 for s in hw):
            raise ValueError(f"more_image_hw must hold pairs of multiples of 14, got {hw}")
    if c.time_limit_minutes is not None and not c.time_limit_minutes > 0:
        raise ValueError(f"time_limit_minutes must be > 0, got {c.time_limit_minutes}")
    if not c.lr > 0 or not 0 <= c.min_lr_ratio <= 1 or c.weight_decay < 0 or c.grad_clip < 0:
        raise ValueError(f"need lr > 0, 0 <= min_lr_ratio <= 1, weight_decay >= 0, grad_clip >= 0; got "
                         f"{c.lr}, {c.min_lr_ratio}, {c.weight_decay}, {c.grad_clip}")
    if len(c.betas) != 2 or not all(0 <= b < 1 for b in c.betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {c.betas}")
    if c.ema_decay is not None and not 0 < c.ema_decay < 1:
        raise ValueError(f"ema_decay must be in (0, 1), got {c.ema_decay}")
    if c.finetune not in FINETUNE_MODES:
        raise ValueError(f"finetune must be one of {FINETUNE_MODES}, got {c.finetune!r}")
    if c.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {c.precision!r}")
    check_path_kinds(c.path_kinds)
    check_share(c.synthetic_share)
    if c.deepen is not None:
        get_preset(c.deepen)  # a ValueError naming the valid presets
    if c.attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {c.attention!r}")
    if not c.lora_alpha > 0:
        raise ValueError(f"lora_alpha must be > 0, got {c.lora_alpha}")
    if c.distributed not in DISTRIBUTED_MODES:
        raise ValueError(f"distributed must be one of {DISTRIBUTED_MODES}, got {c.distributed!r}")


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The configuration as plain YAML/JSON values (paths as strings, tuples as lists)."""
    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return list(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(dataclasses.asdict(config))


_VALUES = "the configuration"
"""`from_dict`'s source when the values come from no file."""


def from_dict(values: dict[str, Any], *, source: str = _VALUES) -> TrainConfig:
    """A TrainConfig from plain values (`config_dict`'s form); an unknown key, a value of the
    wrong type or one a run cannot use is a ValueError naming ``source`` (a file's path, where
    the values come from one) and the key."""
    names = {f.name: f for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - set(names), key=str)
    if unknown:
        raise ValueError(f"{source}: {_unknown_keys(unknown, names)}; the keys are the options of "
                         "`mapstream train --help`, spelled with underscores (image_hw for --image-hw)")
    hints = typing.get_type_hints(TrainConfig)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key == "loss":
            kwargs[key] = value if isinstance(value, LossWeights) else _loss_weights(value, source)
            continue
        value = _typed(value, hints[key], f"{source}: {key}")
        if key in ("data", "out") and value is not None:
            kwargs[key] = Path(value)
        elif key == "more_image_hw":
            kwargs[key] = tuple(tuple(hw) for hw in value)
        elif isinstance(value, list):
            kwargs[key] = tuple(value)
        else:
            kwargs[key] = value
    try:
        return TrainConfig(**kwargs)
    except ValueError as err:
        raise ValueError(f"{source}: {err}" if source != _VALUES else str(err)) from err


def _loss_weights(value: Any, source: str) -> LossWeights:
    names = [f.name for f in dataclasses.fields(LossWeights)]
    if not isinstance(value, dict):
        raise ValueError(f"{source}: loss: must be a mapping of loss weights (e.g. `loss: {{camera: 1.0}}`), "
                         f"got {value!r}; its keys: {', '.join(names)}")
    unknown = sorted(set(value) - set(names), key=str)
    if unknown:
        raise ValueError(f"{source}: under loss: {_unknown_keys(unknown, names)}; its keys are the loss "
                         "options of `mapstream train --help` without --loss- (camera for --loss-camera)")
    hints = typing.get_type_hints(LossWeights)
    return LossWeights(**{k: _typed(v, hints[k], f"{source}: loss: {k}") for k, v in value.items()})


_KINDS = {float: ((int, float), "a number"), int: ((int,), "an integer"), bool: ((bool,), "true or false"),
          str: ((str,), "a string"), Path: ((str, Path), "a path"), tuple: ((list, tuple), "a list")}


def _typed(value: Any, hint: Any, what: str) -> Any:
    """``value`` if it has the kind of type ``hint`` (a float also from a string such as YAML's
    `1e-4`, which YAML reads as a string); else a ValueError: WHAT must be KIND, got VALUE."""
    options = [a for a in typing.get_args(hint) if a is not type(None)] \
        if typing.get_origin(hint) is typing.Union else [hint]
    if value is None and len(options) < len(typing.get_args(hint)):
        return None
    base = options[0]
    base = str if typing.get_origin(base) is Literal else typing.get_origin(base) or base
    if base is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if base in _KINDS:
        kinds, kind = _KINDS[base]
        if not isinstance(value, kinds) or (isinstance(value, bool) and base is not bool):
            raise ValueError(f"{what} must be {kind}, got {value!r}")
    return value


def load_config(path: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """The configuration of YAML file `path` (keys: TrainConfig's fields), `overrides` applied on top.

    A file that is missing, not YAML, or not a mapping raises FileNotFoundError or ValueError
    in one line naming it (and the line of a syntax error)."""
    values: dict[str, Any] = {} if path is None else _read_yaml(Path(path))
    values.update(overrides)
    return from_dict(values, source=str(path) if path is not None else _VALUES)


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"--config {path}: {what}; give a YAML file of training options "
                                "(recipes/ holds examples)")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path}{where}: not valid YAML ({problem}); fix the file "
                         "(a training configuration is lines of `option: value`)") from err
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file; give a YAML file of training options") from err
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: a training configuration is a mapping of training options (lines such as "
                         f"`frames: 8`), not a {type(loaded).__name__}")
    return loaded


def _unknown_keys(keys: list[str], known) -> str:
    """'unknown key 'frams' (did you mean 'frames'?)', for each of ``keys``."""
    told = []
    for key in keys:
        close = difflib.get_close_matches(str(key), list(known), n=1)
        told.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(told)}"
