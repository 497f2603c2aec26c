"""`mapstream train`: train a model from scratch or fine-tune a checkpoint (mapstream.train)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import tyro

from ..train.config import TrainConfig
from ..train.losses import LossWeights
from ._flags import as_flags


@dataclass(frozen=True)
class Train(TrainConfig):
    """Train a model on procedural clips or posed folders, or fine-tune a checkpoint; several GPUs through torchrun.

    A YAML file (--config) sets any of the options below (its keys are their names with
    underscores; `loss:` a mapping); a flag given with a value other than its default overrides
    the file. The run writes checkpoints, logs and OUT/model.safetensors, and resumes from the
    latest checkpoint in --out.
    """

    ON_INTERRUPT: ClassVar[str] = "the latest checkpoint is in the output folder; the same command resumes from it"

    loss: tyro.conf.Suppress[LossWeights] = field(default_factory=LossWeights)
    # The loss weights as flat flags (--loss-camera), as every other command spells its groups.
    loss_camera: float = LossWeights.camera
    """Weight of the camera loss in the total (docs/TRAINING.md, "Losses")."""
    loss_depth: float = LossWeights.depth
    """Weight of the depth loss in the total."""
    loss_points: float = LossWeights.points
    """Weight of the world-point loss in the total (with a point head)."""
    loss_camera_gamma: float = LossWeights.camera_gamma
    """Decay over the camera head's iterations (the last weighs 1, the one before gamma, ...)."""
    loss_camera_delta: float = LossWeights.camera_delta
    """Width of the camera loss's quadratic (Huber) zone; 0 gives L1."""
    loss_camera_translation: float = LossWeights.camera_translation
    """Weight of the translation part of the camera loss."""
    loss_camera_rotation: float = LossWeights.camera_rotation
    """Weight of the rotation part of the camera loss."""
    loss_camera_fov: float = LossWeights.camera_fov
    """Weight of the field-of-view part of the camera loss."""
    loss_camera_direction: float = LossWeights.camera_direction
    """Weight of the translation-direction part of the camera loss (1 - cos between predicted and true translation: a small motion's direction asked for as firmly as a large one's)."""
    loss_camera_pairs: float = LossWeights.camera_pairs
    """Weight of the pairwise direction part of the camera loss (1 - cos between predicted and true direction of every later frame's centre seen from each frame: what pose AUC scores besides rotation)."""
    loss_depth_alpha: float = LossWeights.depth_alpha
    """Weight of the depth confidence's -alpha log(conf) regulariser."""
    loss_depth_gradient: float = LossWeights.depth_gradient
    """Weight of the depth gradient term."""
    loss_points_alpha: float = LossWeights.points_alpha
    """Weight of the point confidence's -alpha log(conf) regulariser."""
    loss_points_gradient: float = LossWeights.points_gradient
    """Weight of the point-map gradient term."""
    loss_placed: float = LossWeights.placed
    """Weight of the placed-points loss (each pixel's predicted depth placed by its predicted camera, against its true world point: ties the path's scale to the depth's, what a fused cloud needs); 0: off."""
    loss_flow: float = LossWeights.flow
    """Weight of the patch-flow loss (each patch's displacement to the first and the previous frame, read by a training-only head; helps a model from scratch learn to match frames); 0: no flow head."""
    loss_flow_delta: float = LossWeights.flow_delta
    """Width of the patch-flow loss's quadratic (Huber) zone, in patches."""
    loss_gradient_scales: int = LossWeights.gradient_scales
    """Image scales of the gradient terms."""
    config: Optional[Path] = None
    """YAML file of training options (keys: the option names with underscores)."""
    quiet: bool = False
    """No progress bar."""

    def __post_init__(self) -> None:
        pass  # checked once the file and the flags are merged, in train_config()

    def train_config(self) -> TrainConfig:
        """The run's configuration: the flags' values (whose defaults are the --config file's,
        see `parse_train`)."""
        from ..train.config import from_dict

        values: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainConfig)}
        values["loss"] = LossWeights(**{g.name: getattr(self, "loss_" + g.name) for g in dataclasses.fields(LossWeights)})
        return from_dict(values)

    def main(self) -> int:
        from ..train.trainer import train

        try:
            config = self.train_config()
        except ValueError as err:
            raise ValueError(as_flags(str(err), Train)) from err
        summary = train(config, progress=not self.quiet)
        if summary.world_size > 1 and summary.weights is None:
            return 0  # the other processes of a torchrun: rank 0 prints the summary
        if summary.steps < config.steps:
            print(f"stopped at step {summary.steps} of {config.steps} (checkpoint: {summary.checkpoint}; "
                  f"weights so far: {summary.weights}); the same command continues the run")
            return 0
        first = summary.losses[0] if summary.losses else float("nan")
        last = summary.losses[-1] if summary.losses else float("nan")
        print(
            f"trained steps {summary.start_step}..{summary.steps} of {summary.preset} ({config.finetune}, "
            f"{summary.trained_parameters:,} parameters) on {summary.world_size} process(es) in {summary.seconds:.1f} s; "
            f"loss {first:.4f} -> {last:.4f}\n"
            f"weights: {summary.weights} (mapstream run --model {summary.weights}); checkpoint: {summary.checkpoint}"
        )
        return 0


def parse_train(args: list[str]) -> Train:
    """`mapstream train ARGS`: a --config file's values become the defaults of the flags, so
    that every flag given on the command line overrides the file, whatever its value."""
    import tyro

    default = None
    path = _config_path(args)
    if path is not None:
        from ..train.config import load_config

        base = load_config(path)
        default = Train(**{f.name: getattr(base, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "loss"},
                        **{"loss_" + f.name: getattr(base.loss, f.name) for f in dataclasses.fields(LossWeights)},
                        config=path)
    return tyro.cli(Train, args=args, prog="mapstream train", default=default)


def _config_path(args: list[str]) -> Optional[Path]:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--config="):
            return Path(arg.split("=", 1)[1])
    return None
