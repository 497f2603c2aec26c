"""`mapstream train --help` shows its options in groups, each declared once with the part of
`TrainConfig` it fills; the flags and their defaults are the configuration's, and every recipe
reads the same through the flags as through `load_config`."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from mapstream.cli.train import parse_train
from mapstream.train.config import (
    DataOptions, DistributedOptions, LogOptions, ModelOptions, OptimOptions, ScheduleOptions, TrainConfig, load_config,
)
from mapstream.train.losses import LossWeights

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))

PANELS = {
    "options": {"--config", "--quiet"},  # and -h, --help
    "data options": DataOptions,
    "model and fine-tuning options": ModelOptions,
    "optimisation options": OptimOptions,
    "loss options": {"--loss-" + f.name.replace("_", "-") for f in dataclasses.fields(LossWeights)},
    "schedule and checkpoints options": ScheduleOptions,
    "device and distributed options": DistributedOptions,
    "logging and validation options": LogOptions,
}
"""The panels of `--help` in their order, and the flags each holds (a group: its fields' flags)."""


def _flags(group) -> set[str]:
    if isinstance(group, set):
        return group
    return {"--" + f.name.replace("_", "-") for f in dataclasses.fields(group)}


def _help(monkeypatch, capsys) -> str:
    monkeypatch.setenv("COLUMNS", "100")  # one column of panels
    with pytest.raises(SystemExit) as stopped:
        parse_train(["--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def test_the_help_shows_each_group_in_its_panel_with_config_first(monkeypatch, capsys):
    text = _help(monkeypatch, capsys)
    # A panel's title: in a box on a terminal, else over a line of dashes.
    heads = list(re.finditer(r"^(?:╭─ (.+?) ─+╮| (\S.*?) *\n -{20,} *)$", text, flags=re.M))
    assert [h[1] or h[2] for h in heads] == list(PANELS)
    for head, end in zip(heads, [*heads[1:], None]):
        body = text[head.end():end.start() if end else None]
        shown = set(re.findall(r"^[^\w-]{0,3}(--[a-z][a-z0-9-]*)", body, flags=re.M))
        assert shown == _flags(PANELS[head[1] or head[2]]), head[0]


def test_the_groups_hold_every_option_of_the_configuration_once():
    grouped = [f.name for g in (DataOptions, ModelOptions, OptimOptions, ScheduleOptions, DistributedOptions,
                                LogOptions) for f in dataclasses.fields(g)]
    assert len(grouped) == len(set(grouped)) == 55
    assert [f.name for f in dataclasses.fields(TrainConfig)] == [*grouped, "loss"]


def test_no_flags_give_the_configurations_defaults_and_flags_land_in_their_fields():
    assert parse_train([]).train_config() == TrainConfig()
    config = parse_train(["--frames", "3", "--finetune", "lora", "--betas", "0.8", "0.9", "--loss-depth-alpha", "0.5",
                          "--keep-checkpoints", "4", "--distributed", "fsdp", "--val-clips", "2",
                          "--no-tensorboard", "--quiet"]).train_config()
    assert config == dataclasses.replace(TrainConfig(), frames=3, finetune="lora", betas=(0.8, 0.9), keep_checkpoints=4,
                                         distributed="fsdp", val_clips=2, tensorboard=False,
                                         loss=LossWeights(depth_alpha=0.5))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_reads_the_same_through_the_flags(recipe):
    config = load_config(recipe)
    assert parse_train(["--config", str(recipe)]).train_config() == config
    assert config != TrainConfig()
