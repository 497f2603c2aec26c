"""What the GPU's power manager did while the benchmark ran: energy, SM clock, capping.

Under the protocol's load a large GPU can reach its power cap and lower its SM clock, so
the same step takes longer back to back than with the GPU rested between steps. A figure
then means little without the clock it ran at, and the step's energy sets its speed as much
as its kernels' times do. `mapstream bench` records, over the steady frames: the energy a frame, the mean
power against the enforced limit, the SM clock after each frame, and the share of frames the
driver was capping the clock (power or thermal reasons).

Read from NVML, the driver's own library (`libnvidia-ml.so.1`), through ctypes: no package to
install, and nothing but a logged reason where the library or the device is missing.
"""
from __future__ import annotations

import ctypes
import logging
import statistics
import time
from typing import Callable, Protocol

import torch

__all__ = ["NvmlReader", "PowerLog", "open_reader", "CAP_REASONS"]

log = logging.getLogger(__name__)

CAP_REASONS = {
    0x4: "power cap (software)",
    0x8: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake (hardware)",
}
"""NVML's clock-event reasons that mean the clock was held down by power or heat (the others:
idle, application clocks, sync boost, display clocks)."""

_NVML_CLOCK_SM = 1


class Reader(Protocol):
    """What `PowerLog` reads: the device's energy counter, clock, reasons and power limit."""

    def energy_mj(self) -> int: ...

    def sm_mhz(self) -> int: ...

    def reasons(self) -> int: ...

    def power_limit_w(self) -> float: ...


class NvmlReader:
    """One device's readings through NVML (`open_reader` finds the device)."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
        self._lib, self._handle = lib, handle

    def _read(self, fn: str, ctype, *args):
        value = ctype()
        status = getattr(self._lib, fn)(self._handle, *args, ctypes.byref(value))
        if status != 0:
            raise RuntimeError(f"NVML {fn} failed with status {status}")
        return value.value

    def energy_mj(self) -> int:
        """Energy since the driver loaded, mJ (Volta and newer)."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption", ctypes.c_ulonglong)

    def sm_mhz(self) -> int:
        return self._read("nvmlDeviceGetClockInfo", ctypes.c_uint, _NVML_CLOCK_SM)

    def reasons(self) -> int:
        """The bit mask of why the clocks are below their maximum now."""
        return self._read("nvmlDeviceGetCurrentClocksThrottleReasons", ctypes.c_ulonglong)

    def power_limit_w(self) -> float:
        return self._read("nvmlDeviceGetEnforcedPowerLimit", ctypes.c_uint) / 1e3


def open_reader(device: torch.device, library: str = "libnvidia-ml.so.1") -> NvmlReader | None:
    """NVML readings of CUDA `device` (found by its UUID, so CUDA_VISIBLE_DEVICES does not
    matter), or None, with the reason logged, where they cannot be had."""
    if device.type != "cuda":
        return None
    try:
        lib = ctypes.CDLL(library)
    except OSError as exc:
        log.info("no GPU power readings: cannot load %s (%s)", library, exc)
        return None
    if lib.nvmlInit_v2() != 0:
        log.info("no GPU power readings: nvmlInit failed")
        return None
    handle = ctypes.c_void_p()
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    status = -1
    if uuid is not None:
        text = str(uuid)
        status = lib.nvmlDeviceGetHandleByUUID(
            (text if text.startswith("GPU-") else f"GPU-{text}").encode(), ctypes.byref(handle))
    if status != 0 and not torch.cuda.device_count() > 1:  # one GPU: NVML's index 0 is it
        status = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
    if status != 0:
        log.info("no GPU power readings: NVML does not know device %s (status %d)", device, status)
        return None
    reader = NvmlReader(lib, handle)
    try:
        reader.energy_mj()
        reader.reasons()
    except RuntimeError as exc:
        log.info("no GPU power readings: %s", exc)
        return None
    return reader


class PowerLog:
    """Readings over a run of frames: `start()` before the first, `after_frame()` after each
    (outside the timed part: each is a few driver calls), `summary()` at the end. The energy
    covers the whole span, the host's gaps between frames included."""

    def __init__(self, reader: Reader, clock: Callable[[], float] = time.perf_counter) -> None:
        self._reader, self._clock = reader, clock
        self._start: tuple[int, float] | None = None
        self._mhz: list[int] = []
        self._capped = 0
        self._seen = 0

    def start(self) -> None:
        self._start = (self._reader.energy_mj(), self._clock())
        self._mhz.clear()
        self._capped = self._seen = 0

    def after_frame(self) -> None:
        if self._start is None:
            raise RuntimeError("PowerLog.after_frame before start()")
        self._mhz.append(self._reader.sm_mhz())
        reasons = self._reader.reasons() & sum(CAP_REASONS)
        self._capped += reasons != 0
        self._seen |= reasons

    def summary(self) -> dict | None:
        """{frames, J_per_frame, mean_W, power_limit_W, sm_mhz: {mean, min, max},
        capped_frames (a share), cap_reasons (names)}, or None before any frame."""
        if self._start is None or not self._mhz:
            return None
        mj0, t0 = self._start
        joules = (self._reader.energy_mj() - mj0) / 1e3
        seconds = self._clock() - t0
        frames = len(self._mhz)
        return {
            "frames": frames,
            "J_per_frame": joules / frames,
            "mean_W": joules / seconds if seconds > 0 else float("nan"),
            "power_limit_W": self._reader.power_limit_w(),
            "sm_mhz": {"mean": statistics.fmean(self._mhz), "min": min(self._mhz), "max": max(self._mhz)},
            "capped_frames": self._capped / frames,
            "cap_reasons": [name for bit, name in CAP_REASONS.items() if self._seen & bit],
        }
