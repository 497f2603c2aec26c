"""`mapstream run --gpu-memory`: the amount checked before any work, the frames' shape known
from the input's headers, the plan made for the GPU (its size faked here: the plan itself is
tested in tests/memory) and no effect off CUDA, said so."""
from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch

import mapstream
from mapstream.gpu_memory import GIB, MemoryBudgetError, estimate_memory
from mapstream.pipeline.memory_budget import fit_to_budget, run_frame_shape
from mapstream.pipeline.options import RunOptions
from mapstream.pipeline.run_input import DEMO_HW, open_input
from mapstream.pipeline.stream_plan import StreamPlan
from run_helpers import photos, run_cli


def test_a_budget_that_is_not_an_amount_is_refused_before_any_work(tmp_path, capsys):
    assert run_cli(str(photos(tmp_path, n=3)), "--out", str(tmp_path / "out"), "--gpu-memory", "lots") != 0
    assert "GPU memory 'lots'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_off_cuda_the_budget_is_told_to_have_no_effect(tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        assert run_cli(str(photos(tmp_path, n=3)), "--out", str(out), "--device", "cpu", "--formats", "npz",
                       "--gpu-memory", "8GB") == 0
    assert any("--gpu-memory 8GB has no effect on cpu" in r.getMessage() for r in caplog.records)
    assert json.loads((out / "run.json").read_text())["gpu_memory"] is None


def test_the_frames_shape_is_read_from_the_input_before_any_frame(tmp_path):
    folder = photos(tmp_path, n=3)
    opts = RunOptions(input=str(folder), out=tmp_path / "out", image_size=140)
    _, first = next(iter(open_input(opts)))
    assert run_frame_shape(opts, 140) == tuple(first.shape[1:]) == (84, 140)
    _, first = next(iter(open_input(replace(opts, image_size=280))))
    assert run_frame_shape(opts, 280) == tuple(first.shape[1:])
    assert run_frame_shape(replace(opts, preprocess="pad"), 140) == (140, 140)
    assert run_frame_shape(RunOptions(input=None, out=tmp_path / "demo", demo=True), 294) == DEMO_HW


def test_the_plan_is_made_for_the_inputs_frames_and_the_gpus_size(tmp_path, caplog, fake_gpu):
    with torch.device("meta"):  # sizes only
        net = mapstream.build_model("lingbot-map")
    folder = photos(tmp_path, n=3)
    cuda = torch.device("cuda")
    opts = RunOptions(input=str(folder), out=tmp_path / "out", gpu_memory="8GB")
    plan = StreamPlan("streaming", net.stream_config)
    fake_gpu(80)
    with caplog.at_level(logging.INFO):
        memory = fit_to_budget(opts, net, plan, "bf16", cuda, 518)
    hw = run_frame_shape(opts, 518)
    assert memory.frame_hw == hw and memory.budget == 8 * GIB and memory.estimate.total <= 8 * GIB
    assert memory.estimate == estimate_memory(net, hw, memory.stream, precision="bf16",
                                              low_precision_heads=memory.low_precision_heads,
                                              dense_chunk_frames=memory.dense_chunk_frames)
    assert any("GPU memory budget 8.00 GiB" in r.getMessage() for r in caplog.records)
    fake_gpu(6)  # a budget above the card's memory: planned for the card's
    with caplog.at_level(logging.WARNING):
        memory = fit_to_budget(opts, net, plan, "bf16", cuda, 518)
    assert memory.budget == 6 * GIB and any("more than a fake GPU has" in r.getMessage() for r in caplog.records)
    with pytest.raises(MemoryBudgetError, match="too small"):
        fit_to_budget(replace(opts, gpu_memory="1GB"), net, plan, "bf16", cuda, 518)
    assert fit_to_budget(replace(opts, gpu_memory=None), net, plan, "bf16", cuda, 518) is None


def test_while_streaming_the_allocator_is_held_to_the_budget_and_an_overrun_says_what_to_do(tmp_path, monkeypatch, fake_gpu):
    from mapstream.pipeline.memory_budget import held_to_budget

    with torch.device("meta"):
        net = mapstream.build_model("lingbot-map")
    fake_gpu(80)
    fractions = [0.9]  # what the process had set before
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device: fractions[-1])
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: fractions.append(f))
    opts = RunOptions(input=str(photos(tmp_path, n=3)), out=tmp_path / "out", gpu_memory="8GB")
    memory = fit_to_budget(opts, net, StreamPlan("streaming", net.stream_config), "bf16", torch.device("cuda"), 518)
    with held_to_budget(memory, torch.device("cuda")):
        assert fractions[-1] == pytest.approx(8 / 80)
    assert fractions[-1] == 0.9
    with pytest.raises(MemoryBudgetError, match="larger --gpu-memory"), held_to_budget(memory, torch.device("cuda")):
        raise torch.OutOfMemoryError("CUDA out of memory")
    assert fractions[-1] == 0.9
    with held_to_budget(None, torch.device("cuda")):  # no budget: nothing set
        assert fractions[-1] == 0.9
