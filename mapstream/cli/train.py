"""`mapstream train`: train a model from scratch or fine-tune a checkpoint (mapstream.train).

The flags are `TrainConfig`'s option groups, each shown in its own panel of `--help`; the loss
weights are `LossWeights`' fields spelled `--loss-NAME`.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Optional

import tyro

from ..train.config import (
    DataOptions, DistributedOptions, LogOptions, ModelOptions, OptimOptions, ScheduleOptions, TrainConfig,
)
from ..train.losses import LossWeights
from ._flags import as_flags

LOSS_PREFIX = "loss_"


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` in its source, on one line, with
    reST's markup (``code``, :func:`name`) reduced to its text."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for declared, after in zip(body, body[1:]):
        if isinstance(declared, ast.AnnAssign) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            text = re.sub(r":\w+:`([^`]*)`", r"\1", after.value.value).replace("``", "")
            docs[declared.target.id] = " ".join(text.split())
    return docs


def _loss_flags() -> type:
    """A dataclass of `LossWeights`' fields as flags `--loss-NAME`: each field's type, default
    and docstring, so that the loss weights are declared once, in mapstream.train.losses."""
    types, docs = typing.get_type_hints(LossWeights), _field_docs(LossWeights)
    return dataclasses.make_dataclass("LossFlags", [
        (LOSS_PREFIX + f.name, types[f.name], field(default=f.default, metadata={"help": docs.get(f.name)}))
        for f in dataclasses.fields(LossWeights)
    ], frozen=True)


LossFlags = _loss_flags()


def _group(cls: type, title: str) -> Any:
    """A field of `Train` holding option group ``cls``: its flags unprefixed, in a panel of
    `--help` titled "TITLE options"."""
    return Annotated[cls, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name=title)]


@dataclass(frozen=True)
class Train:
    """Train a model on procedural clips or posed folders, or fine-tune a checkpoint; several GPUs through torchrun.

    A YAML file (--config) sets any of the options below (its keys are their names with
    underscores; `loss:` a mapping of the loss options' names without `loss_`); a flag given on
    the command line overrides the file. The run writes checkpoints, logs and
    OUT/model.safetensors, and resumes from the latest checkpoint in --out.
    """

    ON_INTERRUPT: ClassVar[str] = "the latest checkpoint is in the output folder; the same command resumes from it"

    config: Optional[Path] = None
    """YAML file of training options (keys: the option names with underscores; recipes/ holds examples)."""
    quiet: bool = False
    """No progress bar."""
    data: _group(DataOptions, "data") = field(default_factory=DataOptions)
    model: _group(ModelOptions, "model and fine-tuning") = field(default_factory=ModelOptions)
    optim: _group(OptimOptions, "optimisation") = field(default_factory=OptimOptions)
    loss: _group(LossFlags, "loss") = field(default_factory=LossFlags)
    """The loss terms' weights and hyper-parameters (docs/TRAINING.md, "Losses"); a --config file's `loss:` maps them by their names without `loss_`."""
    schedule: _group(ScheduleOptions, "schedule and checkpoints") = field(default_factory=ScheduleOptions)
    distributed: _group(DistributedOptions, "device and distributed") = field(default_factory=DistributedOptions)
    log: _group(LogOptions, "logging and validation") = field(default_factory=LogOptions)

    @classmethod
    def of(cls, run: TrainConfig, /, **others: Any) -> "Train":
        """The flags whose values are ``run``'s (what a --config file makes the defaults);
        ``others``: `config`, `quiet`."""
        loss = LossFlags(**{LOSS_PREFIX + f.name: getattr(run.loss, f.name) for f in dataclasses.fields(LossWeights)})
        return cls(data=_fill(DataOptions, run), model=_fill(ModelOptions, run), optim=_fill(OptimOptions, run),
                   loss=loss, schedule=_fill(ScheduleOptions, run), distributed=_fill(DistributedOptions, run),
                   log=_fill(LogOptions, run), **others)

    def train_config(self) -> TrainConfig:
        """The run's configuration: the flags' values (whose defaults are the --config file's,
        see `parse_train`)."""
        from ..train.config import from_dict

        values: dict[str, Any] = {}
        for group in (self.data, self.model, self.optim, self.schedule, self.distributed, self.log):
            values.update(dataclasses.asdict(group))
        values["loss"] = LossWeights(**{f.name.removeprefix(LOSS_PREFIX): getattr(self.loss, f.name)
                                        for f in dataclasses.fields(self.loss)})
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


def _fill(group: type, config: TrainConfig) -> Any:
    """Option group ``group`` holding ``config``'s values."""
    return group(**{f.name: getattr(config, f.name) for f in dataclasses.fields(group)})


def parse_train(args: list[str]) -> Train:
    """`mapstream train ARGS`: a --config file's values become the defaults of the flags, so
    that every flag given on the command line overrides the file, whatever its value."""
    default = None
    path = _config_path(args)
    if path is not None:
        from ..train.config import load_config

        default = Train.of(load_config(path), config=path)
    return tyro.cli(Train, args=args, prog="mapstream train", default=default)


def _config_path(args: list[str]) -> Optional[Path]:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--config="):
            return Path(arg.split("=", 1)[1])
    return None
