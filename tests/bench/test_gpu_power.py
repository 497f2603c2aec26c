"""The benchmark's power readings (`mapstream.gpu_power`): the summary from scripted readings,
and no readings, with a reason, where NVML or a CUDA device is missing. On a GPU the readings
come from NVML itself (tests/gpu)."""
from __future__ import annotations

import logging

import pytest
import torch

from conftest import ScriptedPowerReadings
from mapstream.cli.bench import _power_line
from mapstream.gpu_power import PowerLog, open_reader


def test_power_log_summarizes_energy_clock_and_capping_over_its_frames():
    # 4 frames: 60 J over 0.1 s; frames 2 and 3 capped by power, frame 4 only "idle" (0x1,
    # not a cap) and frame 3 also thermal.
    times = iter([10.0, 10.1])
    reader = ScriptedPowerReadings(energy_mj=[1_000_000, 1_060_000], mhz=[1980, 1800, 1695, 1890],
                       reasons=[0x0, 0x4, 0x4 | 0x20, 0x1])
    log = PowerLog(reader, clock=lambda: next(times))
    assert log.summary() is None  # nothing yet
    log.start()
    for _ in range(4):
        log.after_frame()
    s = log.summary()
    assert s["frames"] == 4
    assert s["J_per_frame"] == pytest.approx(15.0)
    assert s["mean_W"] == pytest.approx(600.0)
    assert s["power_limit_W"] == 700.0
    assert s["sm_mhz"] == {"mean": pytest.approx(1841.25), "min": 1695, "max": 1980}
    assert s["capped_frames"] == 0.5
    assert s["cap_reasons"] == ["power cap (software)", "thermal (software)"]
    line = _power_line(s)
    assert "600 W of 700" in line and "1841 MHz (1695-1980)" in line and "capped on 50% of the frames" in line
    assert "15.00 J a frame" in line


def test_power_log_start_begins_afresh_and_frames_need_a_start():
    with pytest.raises(RuntimeError, match="before start"):
        PowerLog(ScriptedPowerReadings([], [], [])).after_frame()
    times = iter([0.0, 1.0, 1.5])  # start, start again, summary
    reader = ScriptedPowerReadings(energy_mj=[0, 9_000, 9_700], mhz=[1500, 1980], reasons=[0x4, 0x0])
    log = PowerLog(reader, clock=lambda: next(times))
    log.start()
    log.after_frame()  # an earlier run's frame (capped): forgotten by the next start
    log.start()
    log.after_frame()
    s = log.summary()
    assert s["J_per_frame"] == pytest.approx(0.7) and s["mean_W"] == pytest.approx(1.4)
    assert s["sm_mhz"] == {"mean": 1980, "min": 1980, "max": 1980}
    assert s["capped_frames"] == 0.0 and s["cap_reasons"] == []
    assert "never capped" in _power_line(s)


def test_no_readings_off_cuda_or_without_the_nvml_library(caplog):
    assert open_reader(torch.device("cpu")) is None
    if not torch.cuda.is_available():
        return  # the library path needs a CUDA device to look up
    with caplog.at_level(logging.INFO, logger="mapstream.gpu_power"):
        assert open_reader(torch.device("cuda"), library="libnot-nvml-at-all.so") is None
    assert "cannot load libnot-nvml-at-all.so" in caplog.text
