"""The training loop: exact resume, exports that load_model reads, fine-tuning modes, the
command line and its YAML file, and two DDP processes training as one with the doubled batch."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import mapstream
from mapstream.cli.train import parse_train
from mapstream.train.checkpointing import latest_checkpoint, list_checkpoints, load_checkpoint
from mapstream.train.config import TrainConfig, load_config
from mapstream.train.forward import clip_forward
from mapstream.train.lora import add_lora, select_trainable
from mapstream.train.losses import LossWeights
from mapstream.train.trainer import build_training_model, lr_factor, train

SMALL = dict(model="tiny", frames=2, image_hw=(28, 28), num_scale_frames=1, batch_size=1, warmup_steps=1, log_every=1,
             tensorboard=False, device="cpu")


def _config(out, **kw) -> TrainConfig:
    return TrainConfig(out=out, **{**SMALL, **kw})


def test_two_runs_of_n_steps_with_a_resume_equal_one_run_of_2n(tmp_path):
    whole = train(_config(tmp_path / "whole", steps=2, checkpoint_every=1, ema_decay=0.5), progress=False)
    first = train(_config(tmp_path / "halves", steps=2, ema_decay=0.5), progress=False, stop_at=1)
    assert first.weights is None and first.checkpoint == latest_checkpoint(tmp_path / "halves")
    second = train(_config(tmp_path / "halves", steps=2, ema_decay=0.5), progress=False)
    assert (first.start_step, second.start_step, second.steps) == (0, 1, 2)
    assert first.losses + second.losses == whole.losses  # bit for bit
    a, b = load_file(whole.weights), load_file(second.weights)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [s for s, _ in list_checkpoints(tmp_path / "whole")] == [1, 2]
    metrics = [json.loads(line)["step"] for line in (tmp_path / "halves" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2]


def test_lora_export_loads_and_computes_what_the_trained_model_computes(tmp_path):
    summary = train(_config(tmp_path, steps=1, finetune="lora", lora_rank=2, lr=1e-2), progress=False)
    exported = mapstream.load_model(summary.weights, preset=summary.preset)
    trained, _ = build_training_model(_config(tmp_path, steps=2))
    base = {k: v.clone() for k, v in trained.state_dict().items()}
    add_lora(trained, 2, 16.0)
    trained.load_state_dict(load_checkpoint(latest_checkpoint(tmp_path))["model"])
    assert any(not torch.equal(exported.state_dict()[k], base[k]) for k in base if ".attn.qkv." in k)
    # Only the adapted projections changed: everything else is the base model.
    for key, value in exported.state_dict().items():
        if ".attn." not in key or not key.startswith(("aggregator.frame_blocks", "aggregator.global_blocks")):
            assert torch.equal(value, base[key]), key
    images = torch.rand(1, 3, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = clip_forward(trained.eval(), images, num_scale_frames=2), clip_forward(exported, images, num_scale_frames=2)
    for key in ("pose_enc", "depth", "depth_conf"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5)


def test_fine_tuning_modes_train_what_they_say():
    model, _ = build_training_model(TrainConfig(steps=1))
    heads = select_trainable(model, "heads")
    assert heads and all(n.startswith(("camera_head", "depth_head")) for n in heads)
    frozen = select_trainable(model, "full", freeze_patch_embed=True, freeze_frame_blocks=True)
    assert not any(n.startswith(("aggregator.patch_embed", "aggregator.frame_blocks")) for n in frozen)
    assert any(n.startswith("aggregator.global_blocks") for n in frozen)
    add_lora(model, 4, 8.0)
    lora = select_trainable(model, "lora")
    assert len(lora) == 2 * 2 * 2 * model.config.depth  # A and B, qkv and proj, frame and global blocks
    assert all(p.requires_grad == (n in lora) for n, p in model.named_parameters())


def test_the_schedule_warms_up_then_decays_to_the_floor():
    f = [lr_factor(s, 2, 10, 0.1) for s in range(10)]
    assert f[:3] == [0.5, 1.0, 1.0] and f[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[1:], f[2:]))


def test_a_yaml_file_sets_options_and_flags_override_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("frames: 3\nimage_hw: [28, 42]\nlr: 0.001\nprecision: bf16\nmore_image_hw: [[14, 28]]\n"
                    "loss:\n  depth: 2.0\n  camera: 4.0\n")
    config = parse_train(["--config", str(path), "--lr", "3e-4", "--steps", "5", "--loss-camera", "3.0"]).train_config()
    assert (config.frames, config.image_hw, config.lr, config.steps) == (3, (28, 42), 3e-4, 5)
    assert (config.loss.depth, config.loss.camera, config.more_image_hw) == (2.0, 3.0, ((14, 28),))
    assert config.precision == "bf16"
    # A flag given with its default value still overrides the file.
    config = parse_train([f"--config={path}", "--precision", "fp32", "--loss-camera", "1.25"]).train_config()
    assert (config.precision, config.loss.camera, config.lr) == ("fp32", 1.25, 0.001)
    every_loss_flag = parse_train(["--loss-camera-direction", "0.5", "--loss-camera-pairs", "0.25",
                                   "--loss-flow", "2"]).train_config().loss
    assert (every_loss_flag.camera_direction, every_loss_flag.camera_pairs, every_loss_flag.flow) == (0.5, 0.25, 2.0)
    assert load_config(path).lr == 0.001
    path.write_text("frams: 3\n")
    with pytest.raises(ValueError, match=r"unknown key .frams. \(did you mean .frames.\?\)"):
        load_config(path)


def test_bad_input_is_told_clearly(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="neither a preset"):
        train(_config(tmp_path, steps=1, model="tinyy"))
    bad = tmp_path / "bad.safetensors"
    save_file({"not.a.key": torch.zeros(2)}, str(bad))
    with pytest.raises(mapstream.CheckpointError):
        train(_config(tmp_path, steps=1, model=str(bad), preset="tiny"))
    (tmp_path / "frames").mkdir()
    with pytest.raises(FileNotFoundError, match="no posed folder"):
        train(_config(tmp_path, steps=1, data=tmp_path / "frames"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            train(_config(tmp_path, steps=1, precision="bf16"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dense_every, flow", [(1, 0.0), (2, 1.0)])
def test_two_ddp_processes_train_as_one_with_the_doubled_batch(tmp_path, dense_every, flow):
    flags = ["--model", "tiny", "--frames", "2", "--image-hw", "28", "28", "--num-scale-frames", "1",
             "--warmup-steps", "1", "--steps", "2", "--dense-every", str(dense_every), "--loss-flow", str(flow),
             "--log-every", "1", "--no-tensorboard", "--device", "cpu", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
              f"--master_port={_free_port()}", "-m", "mapstream", "train"]
    done = subprocess.run(launch + flags + ["--batch-size", "1", "--out", str(tmp_path / "ddp")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    one = train(_config(tmp_path / "one", steps=2, batch_size=2, dense_every=dense_every,
                        loss=LossWeights(flow=flow)), progress=False)
    two = [json.loads(line)["loss"] for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert two == pytest.approx(list(one.losses), rel=1e-5, abs=1e-6)
    a, b = load_file(tmp_path / "ddp" / "model.safetensors"), load_file(one.weights)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_steps_between_dense_steps_train_the_trunk_and_camera_alone(tmp_path):
    """--dense-every 2: steps 0, 2, ... run and supervise the depth head; step 1 leaves it out of
    the forward, so it gets no gradient and no update (AdamW skips it, weight decay included)
    while the trunk and camera head move."""
    one = train(_config(tmp_path / "one", steps=1, dense_every=2), progress=False)
    two = train(_config(tmp_path / "two", steps=2, dense_every=2), progress=False)
    a, b = load_file(one.weights), load_file(two.weights)
    depth = [k for k in a if k.startswith("depth_head.")]
    assert depth and all(torch.equal(a[k], b[k]) for k in depth)
    for prefix in ("camera_head.", "aggregator."):
        assert any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix)), prefix
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert ["depth" in r for r in records] == [True, False] and all("camera" in r for r in records)
    every = train(_config(tmp_path / "every", steps=2), progress=False)
    assert every.losses[0] == two.losses[0] and every.losses[1] != two.losses[1]  # the camera-only loss differs
    with pytest.raises(ValueError, match="dense_every"):
        _config(tmp_path, dense_every=0)


def test_every_logged_step_carries_the_depth_loss_when_log_every_is_a_multiple_of_dense_every(tmp_path):
    train(_config(tmp_path / "run", steps=8, dense_every=2, log_every=4), progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8] and all("depth" in r for r in records)


def test_a_flow_head_trains_beside_the_network_resumes_exactly_and_stays_out_of_the_export(tmp_path):
    flow = dict(frames=3, image_hw=(28, 56), loss=LossWeights(flow=1.0), steps=2)
    whole = train(_config(tmp_path / "whole", **flow), progress=False)
    train(_config(tmp_path / "halves", **flow), progress=False, stop_at=1)
    state = load_checkpoint(latest_checkpoint(tmp_path / "halves"))
    assert set(state["flow_head"]) == {"proj.weight", "proj.bias"} and state["flow_head"]["proj.weight"].shape == (4, 256)
    second = train(_config(tmp_path / "halves", **flow), progress=False)
    assert whole.losses[:1] + second.losses == whole.losses  # bit for bit, the flow head's state resumed
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["flow"] > 0 for r in records)  # a loss on the patches whose flow is known
    plain = train(_config(tmp_path / "plain", frames=3, image_hw=(28, 56), steps=1), progress=False)
    assert load_file(whole.weights).keys() == load_file(plain.weights).keys()  # the export holds no flow head
    with pytest.raises(ValueError, match="trained with a patch-flow head"):
        train(_config(tmp_path / "halves", frames=3, image_hw=(28, 56), steps=3), progress=False)
    with pytest.raises(ValueError, match="trained without a patch-flow head"):
        train(_config(tmp_path / "plain", **{**flow, "steps": 3}), progress=False)
    with pytest.raises(ValueError, match="--matching-init draws initial weights"):
        train(_config(tmp_path / "again", model=str(whole.weights), matching_init=True), progress=False)


def test_the_ema_forgets_its_start_during_its_warm_up():
    from mapstream.train.ema import EMA

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = EMA(model, 0.999)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)  # decay min(0.999, 1/10): 0.1 of the start is left
    torch.testing.assert_close(ema.shadow["weight"], torch.full((1, 2), 0.9), rtol=0, atol=1e-7)
    ema.update(model)  # decay 2/11 of what is left
    torch.testing.assert_close(ema.shadow["weight"], torch.full((1, 2), 1 - 0.1 * 2 / 11), rtol=0, atol=1e-7)
    assert ema.current_decay() == pytest.approx(3 / 12)
    for _ in range(10000):
        ema.updates += 1
    assert ema.current_decay() == 0.999
    again = EMA(model, 0.999)
    again.load_state_dict(ema.state_dict())
    assert again.updates == ema.updates and torch.equal(again.shadow["weight"], ema.shadow["weight"])


def test_a_time_limit_stops_at_a_log_step_and_the_same_command_continues(tmp_path, capsys):
    whole = train(_config(tmp_path / "whole", steps=4, log_every=2), progress=False)
    limited = _config(tmp_path / "legs", steps=4, log_every=2, time_limit_minutes=1e-9)
    first = train(limited, progress=False)
    assert first.steps == 2  # the first log step, with a checkpoint and the weights so far
    assert first.checkpoint == latest_checkpoint(tmp_path / "legs") and first.checkpoint.stem.endswith("00000002")
    from safetensors import safe_open
    with safe_open(str(first.weights), "pt") as handle:
        assert handle.metadata()["step"] == "2"
        so_far = {k: handle.get_tensor(k) for k in handle.keys()}
    state = load_checkpoint(first.checkpoint)
    averaged = state["ema"]["shadow"] if "ema" in state else {}
    assert all(torch.equal(so_far[k], averaged.get(k, v).float()) for k, v in state["model"].items())
    second = train(dataclasses.replace(limited, time_limit_minutes=None), progress=False)
    assert (second.start_step, second.steps) == (2, 4) and second.weights == first.weights
    from mapstream.cli.main import main
    cli = tmp_path / "cli"
    flags = ["train", "--model", "tiny", "--frames", "2", "--image-hw", "28", "28", "--num-scale-frames", "1",
             "--batch-size", "1", "--warmup-steps", "1", "--log-every", "2", "--steps", "4", "--no-tensorboard",
             "--device", "cpu", "--quiet", "--out", str(cli)]
    assert main(flags + ["--time-limit-minutes", "1e-9"]) == 0
    said = capsys.readouterr().out
    assert "stopped at step 2 of 4" in said and f"weights so far: {cli / 'model.safetensors'}" in said
    assert first.losses + second.losses == whole.losses
    records = [json.loads(line) for line in (tmp_path / "legs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    assert all(set(r) >= {"data_seconds", "forward_seconds", "loss_seconds", "backward_seconds",
                          "optimizer_seconds"} for r in records)


def test_prefetching_scenes_trains_exactly_as_drawing_them_in_place(tmp_path):
    plain = train(_config(tmp_path / "plain", steps=3, reuse_reversed=True), progress=False)
    ahead = train(_config(tmp_path / "ahead", steps=3, reuse_reversed=True, prefetch_scenes=True), progress=False)
    assert ahead.losses == plain.losses
    assert all(torch.equal(a, b) for a, b in zip(load_file(plain.weights).values(), load_file(ahead.weights).values()))


def test_a_run_going_on_from_an_export_with_its_next_clip_sees_only_new_clips(tmp_path):
    from safetensors import safe_open

    from mapstream.train.data import ProceduralClips

    first = train(_config(tmp_path / "first", steps=3, batch_size=2, reuse_reversed=True), progress=False)
    with safe_open(str(first.weights), "pt") as handle:
        next_clip = int(handle.metadata()["next_clip"])
    assert next_clip == 4  # steps 0-2: renderings 0 and 1 (each serves two steps) of two clips
    seen = {s for step in range(3) for s in ProceduralClips(2, 2, (28, 28), reuse_reversed=True).seeds(step)}
    going_on = ProceduralClips(2, 2, (28, 28), reuse_reversed=True, first_clip=next_clip)
    fresh = [s for step in range(6) for s in going_on.seeds(step)]
    assert not seen & set(fresh)
    # The same clips as the first run's own later steps, and so for every rank of a DDP run.
    later = ProceduralClips(2, 2, (28, 28), reuse_reversed=True)
    assert fresh == [s for step in range(4, 10) for s in later.seeds(step)]
    ranks = [ProceduralClips(1, 2, (28, 28), rank=r, world_size=2, first_clip=next_clip) for r in range(2)]
    assert sorted(s for r in ranks for s in r.seeds(0)) == going_on.seeds(0)
    assert ranks[0].next_clip(3) == next_clip + 6
    second = train(_config(tmp_path / "second", steps=1, batch_size=2, model=str(first.weights), preset="tiny",
                           first_clip=next_clip), progress=False)
    with safe_open(str(second.weights), "pt") as handle:
        assert handle.metadata()["next_clip"] == str(next_clip + 2)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="first_clip"):
            TrainConfig(first_clip=bad)
        with pytest.raises(ValueError, match="first_clip"):
            ProceduralClips(1, 2, (28, 28), first_clip=bad)
    with pytest.raises(ValueError, match="first_clip applies to procedural clips"):
        TrainConfig(first_clip=4, data=tmp_path)


def test_procedural_clips_take_their_sizes_in_turn():
    from mapstream.train.data import ProceduralClips

    clips = ProceduralClips(1, 2, [(28, 42), (14, 28)], num_batches=3)
    shapes = [tuple(clips.batch(step)["images"].shape[-2:]) for step in range(3)]
    assert shapes == [(28, 42), (14, 28), (28, 42)]
    assert tuple(ProceduralClips(1, 2, (28, 42)).batch(0)["images"].shape[-2:]) == (28, 42)
    with pytest.raises(ValueError, match="multiples of 14"):
        ProceduralClips(1, 2, [(28, 42), (20, 28)])


def test_procedural_clips_take_their_lengths_in_turn_over_every_size(tmp_path):
    from mapstream.train.data import ProceduralClips

    clips = ProceduralClips(1, 2, [(28, 42), (14, 28)], more_frames=(4,), num_batches=6, reuse_reversed=True)
    batches = [clips.batch(step) for step in range(6)]
    shapes = [tuple(b["images"].shape[1:2]) + tuple(b["images"].shape[-2:]) for b in batches]
    # Each rendering serves two steps (as rendered, then reversed); lengths change every two sizes.
    assert shapes == [(2, 28, 42), (2, 28, 42), (2, 14, 28), (2, 14, 28), (4, 28, 42), (4, 28, 42)]
    for b in batches:
        S = b["images"].shape[1]
        assert b["depth"].shape[1] == b["T_world_cam"].shape[1] == b["K"].shape[1] == S
    assert [clips.frames_of(r) for r in range(5)] == [2, 2, 4, 4, 2]
    # A rendering's clips are those its seeds draw at its length.
    from mapstream.train.render import sample_clip

    spec = sample_clip(clips.seeds(4)[0], 4, (28, 42))
    np.testing.assert_allclose(batches[4]["T_world_cam"][0].numpy(), spec.T_world_cam, atol=1e-5)
    run = train(_config(tmp_path / "lengths", steps=2, more_frames=(3,)), progress=False)
    assert len(run.losses) == 2 and all(math.isfinite(x) for x in run.losses)
    assert load_config(None, more_frames=[3, 4]).more_frames == (3, 4)
    with pytest.raises(ValueError, match="more_frames"):
        TrainConfig(more_frames=(0,))
    with pytest.raises(ValueError, match="more_frames applies to procedural clips"):
        TrainConfig(more_frames=(4,), data=tmp_path)
    with pytest.raises(ValueError, match="more_frames"):
        ProceduralClips(1, 2, (28, 42), more_frames=(2, -1))


def test_every_recipe_in_the_repository_is_a_valid_configuration():
    from pathlib import Path

    recipes = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
    assert len(recipes) >= 5
    cpu_stages = {"small_clip24.yaml"}  # ran on two CPU cores (docs/TRAINING.md)
    for recipe in recipes:
        config = load_config(recipe)
        assert config.device == ("cpu" if recipe.name in cpu_stages else "cuda") and config.steps > 0, recipe.name
    flow = load_config(recipes[0].parent / "small_flow.yaml")
    assert flow.matching_init and flow.loss.flow == 1.0 and flow.frames == 2 and flow.frame_step == flow.val_frame_step == 3
    # The shipped model's chain: each stage starts from the previous stage's export.
    clip8 = load_config(recipes[0].parent / "small_clip8.yaml")
    clip16 = load_config(recipes[0].parent / "small_clip16.yaml")
    assert not clip8.matching_init and clip8.frames == 8 and clip8.model == str(flow.out / "model.safetensors")
    assert clip16.frames == 16 and clip16.frame_step == 1 and clip16.model == str(clip8.out / "model.safetensors")
    # The last stage trains the default stream settings' scale frames.
    clip24 = load_config(recipes[0].parent / "small_clip24.yaml")
    assert clip24.model == str(clip16.out / "model.safetensors") and clip24.frames == 24
    assert clip24.num_scale_frames == mapstream.StreamConfig().num_scale_frames
    # and the shipped stage continues it at the size the procedural sequences are scored at.
    hw294 = load_config(recipes[0].parent / "small_hw294.yaml")
    assert hw294.model == str(clip24.out / "model.safetensors") and hw294.image_hw == (168, 294)
    assert (hw294.frames, hw294.num_scale_frames) == (clip24.frames, clip24.num_scale_frames)
    assert all(c.min_lr_ratio == 1.0 for c in (flow, clip8, clip16, clip24, hw294))  # legs of one schedule
    # The sixth stage grows it into the deeper preset, then decays the learning rate.
    deep = load_config(recipes[0].parent / "small_deep.yaml")
    decay = load_config(recipes[0].parent / "small_deep_decay.yaml")
    assert deep.model == str(hw294.out / "model.safetensors") and (deep.preset, deep.deepen) == ("small", "small-deep")
    assert decay.model == str(deep.out / "model.safetensors") and decay.preset == "small-deep" and decay.deepen is None
    assert deep.min_lr_ratio == 1.0 and decay.min_lr_ratio == 0.1 and (deep.steps, decay.steps) == (1175, 555)
    assert all((c.frames, c.image_hw, c.batch_size) == (hw294.frames, hw294.image_hw, hw294.batch_size) for c in (deep, decay))


def test_a_log_record_carries_the_accelerators_peak_memory_only_when_there_is_one(tmp_path, caplog):
    from mapstream.train.logs import log_step

    with caplog.at_level(logging.INFO, logger="mapstream.train.trainer"):
        log_step(tmp_path, None, 5, {"loss": 1.5}, 1e-3, 0.5, 1.25, {"data": 0.25}, peak_gib=12.5)
        log_step(tmp_path, None, 6, {"loss": 1.0}, 1e-3, 0.5, 1.25, {"data": 0.25})
    first, second = (json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert first == {"step": 5, "loss": 1.5, "lr": 1e-3, "grad_norm": 0.5, "step_seconds": 1.25,
                     "data_seconds": 0.25, "peak_gib": 12.5}
    assert "peak_gib" not in second and second["step"] == 6
    assert "peak 12.5 GiB" in caplog.records[0].getMessage() and "GiB" not in caplog.records[1].getMessage()


def test_an_export_records_the_width_it_was_trained_at_which_runs_of_it_take(tmp_path):
    from mapstream.checkpoint import model_image_size

    summary = train(_config(tmp_path, steps=1, image_hw=(28, 42), more_image_hw=((42, 56),)), progress=False)
    exported = mapstream.load_model(summary.weights, preset=summary.preset)
    assert exported.load_report.image_size == 42 == model_image_size(exported)  # --image-hw's, not a further size


def test_an_export_records_the_longest_clip_it_learned_from(tmp_path):
    """A run from a preset records its longest clips (--frames or --more-frames); a run from an
    export that records more keeps that; from an export that records fewer, its own; from a
    checkpoint that records none (the official weights), none."""
    from safetensors.torch import save_file

    from mapstream.checkpoint import model_trained_views, recorded_trained_views
    from mapstream.train.trainer import trained_views

    first = train(_config(tmp_path / "first", steps=1, frames=2, more_frames=(3,)), progress=False)
    assert recorded_trained_views(first.weights) == 3
    assert model_trained_views(mapstream.load_model(first.weights, preset=first.preset)) == 3
    assert recorded_trained_views(train(_config(tmp_path / "plain", steps=1), progress=False).weights) == 2
    going_on = dataclasses.replace(_config(tmp_path / "on", steps=1), model=str(first.weights), preset="tiny")
    assert trained_views(going_on) == 3
    assert trained_views(dataclasses.replace(going_on, frames=5)) == 5
    unrecorded = tmp_path / "official.safetensors"
    save_file(load_file(first.weights), str(unrecorded))
    assert trained_views(dataclasses.replace(going_on, model=str(unrecorded), frames=5)) is None
    last = train(dataclasses.replace(going_on, out=str(tmp_path / "last"), model=str(unrecorded)), progress=False)
    assert recorded_trained_views(last.weights) is None
