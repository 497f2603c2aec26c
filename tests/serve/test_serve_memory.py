"""`mapstream serve --gpu-memory`: the sessions' settings fitted so that --max-sessions of
them fit the budget (the GPU's size faked here; the plan itself is tested in tests/memory),
a bad amount refused before the model loads, no effect off CUDA, said so."""
from __future__ import annotations

import logging

import pytest
import torch

import mapstream
from mapstream.cli.main import main
from mapstream.gpu_memory import GIB, MemoryBudgetError, estimate_memory
from mapstream.serve.config import ServeConfig
from mapstream.serve.memory import fit_sessions


@pytest.fixture(scope="module")
def official():
    with torch.device("meta"):  # sizes only
        return mapstream.build_model("lingbot-map")


def test_the_sessions_settings_are_fitted_so_that_max_sessions_of_them_fit(official, caplog, fake_gpu):
    stream = official.stream_config.with_settings(precision="bf16")
    config = ServeConfig(max_sessions=8, max_batch=4)
    cuda = torch.device("cuda")
    fake_gpu(80)
    with caplog.at_level(logging.INFO):
        plan = fit_sessions("70GB", official, stream, config, cuda)
    assert plan.budget == 70 * GIB and plan.frame_hw == (518, 518)  # the model's width, as tall as wide
    assert plan.estimate == estimate_memory(official, (518, 518), plan.stream, precision="bf16", streams=8, batch=4,
                                            dense_chunk_frames=plan.dense_chunk_frames,
                                            low_precision_heads=plan.low_precision_heads)
    assert plan.estimate.total <= 70 * GIB < estimate_memory(official, (518, 518), stream, precision="bf16",
                                                             streams=8, batch=4).total
    assert plan.stream.kv_dtype == "fp8" and plan.changes
    assert any("8 streams of 518x518" in r.getMessage() for r in caplog.records)
    fake_gpu(40)  # more than the card has: planned for the card's
    with caplog.at_level(logging.WARNING):
        plan = fit_sessions("70GB", official, stream, config, cuda)
    assert plan.budget == 40 * GIB and any("more than a fake GPU has" in r.getMessage() for r in caplog.records)
    with pytest.raises(MemoryBudgetError, match=r"8 streams .*fewer streams \(about \d+ fit\)"):
        fit_sessions("10GB", official, stream, config, cuda)
    fake_gpu(80)  # windows no longer than the frames a smaller cache holds, where windows run
    small_window = estimate_memory(official, (518, 518), stream.with_settings(kv_dtype="fp8", sliding_window=32),
                                   precision="bf16", streams=8, batch=4).total
    for mode, windowed in (("streaming", False), ("windowed", True)):
        plan = fit_sessions(f"{(small_window + 2**10) / GIB}GiB", official, stream, config, cuda, mode=mode)
        assert plan.stream.sliding_window == 32
        assert plan.stream.window_size == (stream.anchor_frames + 32 if windowed else stream.window_size)


def test_off_cuda_the_budget_is_told_to_have_no_effect(official, caplog):
    with caplog.at_level(logging.WARNING):
        assert fit_sessions("8GB", official, official.stream_config, ServeConfig(), torch.device("cpu")) is None
    assert any("--gpu-memory 8GB has no effect on cpu" in r.getMessage() for r in caplog.records)


def test_a_budget_that_is_not_an_amount_is_refused_before_the_model_loads(capsys):
    assert main(["serve", "--no-auth", "--model", "no/such-model", "--gpu-memory", "lots"]) == 2
    err = capsys.readouterr().err
    assert "GPU memory 'lots'" in err and "no/such-model" not in err
