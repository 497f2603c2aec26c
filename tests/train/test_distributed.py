"""FSDP training (mapstream.train.distributed): two sharded processes train as one process with
the doubled batch, their exports load with load_model, and checkpoints resume across modes."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import mapstream
from mapstream.train.checkpointing import latest_checkpoint, load_checkpoint
from mapstream.train.config import TrainConfig
from mapstream.train.distributed import Parallel
from mapstream.train.lora import add_lora
from mapstream.train.trainer import _Clips, build_training_model, train

SMALL = dict(model="tiny", frames=2, image_hw=(28, 28), num_scale_frames=1, warmup_steps=1, log_every=1,
             tensorboard=False, device="cpu", ema_decay=0.5, val_every=1, val_clips=2)
FLAGS = ["--val-every", "1", "--val-clips", "2", "--model", "tiny", "--frames", "2", "--image-hw", "28", "28", "--num-scale-frames", "1",
         "--warmup-steps", "1", "--log-every", "1", "--no-tensorboard", "--device", "cpu", "--quiet",
         "--ema-decay", "0.5", "--batch-size", "1", "--distributed", "fsdp"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out, *flags: str) -> None:
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
              f"--master_port={_free_port()}", "-m", "mapstream", "train"]
    done = subprocess.run(launch + FLAGS + list(flags) + ["--out", str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _losses(out, key: str = "loss") -> list[float]:
    return [json.loads(line)[key] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_weights(a_path, b_path) -> None:
    a, b = load_file(a_path), load_file(b_path)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_two_fsdp_processes_train_as_one_with_the_doubled_batch_and_resume_across_modes(tmp_path):
    whole = train(TrainConfig(out=tmp_path / "one", steps=3, batch_size=2, **SMALL), progress=False)
    # Sharded: stopped by the time limit at step 1 (a gathered checkpoint), then continued.
    _torchrun(tmp_path / "fsdp", "--steps", "3", "--time-limit-minutes", "1e-9")
    assert [json.loads(line)["step"] for line in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()] == [1]
    shutil.copytree(tmp_path / "fsdp", tmp_path / "fsdp_then_one")
    _torchrun(tmp_path / "fsdp", "--steps", "3")
    assert _losses(tmp_path / "fsdp") == pytest.approx(list(whole.losses), rel=1e-5, abs=1e-6)
    for key in ("val_loss", "val_rotation_deg"):  # validation runs on every rank, on the gathered units
        assert _losses(tmp_path / "fsdp", key) == pytest.approx(_losses(tmp_path / "one", key), rel=1e-5, abs=1e-5)
    _assert_same_weights(tmp_path / "fsdp" / "model.safetensors", whole.weights)
    loaded = mapstream.load_model(tmp_path / "fsdp" / "model.safetensors", preset="tiny")
    exported, held = load_file(tmp_path / "fsdp" / "model.safetensors"), loaded.state_dict()
    assert all(torch.equal(held[k], v) for k, v in exported.items())
    # The export is the EMA's average, which the (gathered) checkpoint holds beside the weights.
    state = load_checkpoint(latest_checkpoint(tmp_path / "fsdp"))
    assert all(torch.equal(exported[k], v) for k, v in state["ema"]["shadow"].items())
    assert any(not torch.equal(exported[k], state["model"][k]) for k in state["ema"]["shadow"])

    # The sharded checkpoint (optimizer keyed by name) continues in one process ...
    rest = train(TrainConfig(out=tmp_path / "fsdp_then_one", steps=3, batch_size=2, **SMALL), progress=False)
    assert rest.start_step == 1
    assert _losses(tmp_path / "fsdp_then_one") == pytest.approx(list(whole.losses), rel=1e-5, abs=1e-6)
    _assert_same_weights(rest.weights, whole.weights)
    # ... and a one-process checkpoint (optimizer keyed by position) continues sharded, here
    # recomputing each layer in the backward pass (which gathers the layer's weights again).
    train(TrainConfig(out=tmp_path / "one_then_fsdp", steps=3, batch_size=2, **SMALL), progress=False, stop_at=1)
    _torchrun(tmp_path / "one_then_fsdp", "--steps", "3", "--checkpoint-layers")
    assert _losses(tmp_path / "one_then_fsdp") == pytest.approx(list(whole.losses), rel=1e-5, abs=1e-6)
    _assert_same_weights(tmp_path / "one_then_fsdp" / "model.safetensors", whole.weights)


def test_fsdp_in_one_process_is_the_plain_run(tmp_path):
    plain = train(TrainConfig(out=tmp_path / "a", steps=2, batch_size=1, **SMALL), progress=False)
    fsdp = train(TrainConfig(out=tmp_path / "b", steps=2, batch_size=1, distributed="fsdp", **SMALL), progress=False)
    assert fsdp.losses == plain.losses
    a, b = load_file(plain.weights), load_file(fsdp.weights)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_modes_are_told_clearly():
    with pytest.raises(ValueError, match="distributed"):
        TrainConfig(distributed="zero3")
    model, _ = build_training_model(TrainConfig(steps=1))
    add_lora(model, 2, 4.0)
    forward = _Clips(model, 1, False, "sdpa", False)
    assert Parallel("fsdp", 1, 0, torch.device("cpu")).wrap(forward, model) is forward
    with pytest.raises(ValueError, match="LoRA"):
        Parallel("fsdp", 2, 0, torch.device("cpu")).wrap(forward, model)
