"""CUDA streams whose kernels run on only part of the GPU's multiprocessors (green contexts),
for the device probes. Session 16's experiment (commit 69ae6f1, mapstream/fast/partition.py,
removed in 695e5b3 when it did not pay) with the remaining multiprocessors as a second stream.

After the last global block, a step runs two heads side by side: the camera head, a chain of
~100 one-row products bound by reading its weights (3.2 GB a frame in fp32), and the DPT
head, whose convolutions fill every multiprocessor with their tiles. While a convolution
holds the whole GPU, each of the camera head's kernels gets only the few multiprocessors
left over, and the chain crawls: in the step's profile the camera head took 2.5 ms beside
the DPT head, against ≈ 1.2 ms alone (docs/BENCHMARKS.md, session 16).

A green context (CUDA 12.4+ driver) owns a subset of the multiprocessors; kernels launched
on its streams run only there, also when the stream's work is captured into a CUDA graph.
Confining the DPT head to most of the GPU leaves the rest free for the camera head's chain.
PyTorch 2.11 has no stream constructor for green contexts, so the driver is called through
ctypes; the stream is handed to PyTorch as an external stream.
"""
from __future__ import annotations

import ctypes
import functools
import logging

import torch

__all__ = ["PartitionUnavailable", "sm_partition"]

log = logging.getLogger(__name__)

_SM_RESOURCE = 1  # CU_DEV_RESOURCE_TYPE_SM
# CUdevResource is 144 bytes in CUDA 12.4's header and has grown since; every call here
# takes a single resource, so a buffer larger than any version's struct is enough.
_RESOURCE_BYTES = 1024
_SM_COUNT_OFFSET = 96  # CUdevResource.sm.smCount: after the type and 92 bytes of padding
_GREEN_CTX_DEFAULT_STREAM = 1
_STREAM_NON_BLOCKING = 1  # the only flag green-context streams accept


class PartitionUnavailable(RuntimeError):
    """The driver cannot confine a stream to part of the GPU (no green contexts)."""


@functools.cache
def _driver() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise PartitionUnavailable(f"the CUDA driver library could not be loaded: {exc}") from exc
    for name in ("cuDevSmResourceSplitByCount", "cuGreenCtxCreate", "cuGreenCtxStreamCreate"):
        if not hasattr(lib, name):
            raise PartitionUnavailable(f"the CUDA driver has no {name} (green contexts need a 12.4+ driver)")
    return lib


def _check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise PartitionUnavailable(f"{what} failed: {name.value.decode() if name.value else result}")


def _stream_of(lib, resource, dev, device_index: int) -> torch.cuda.ExternalStream:
    desc = ctypes.c_void_p()
    _check(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), resource, 1), "cuDevResourceGenerateDesc")
    ctx = ctypes.c_void_p()
    _check(lib.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, _GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
    handle = ctypes.c_void_p()
    _check(lib.cuGreenCtxStreamCreate(ctypes.byref(handle), ctx, _STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate")
    return torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", device_index))


@functools.cache
def sm_partition(num_sms: int, device_index: int = 0):
    """((stream, SMs), (stream, SMs)): a stream on `num_sms` multiprocessors (rounded up by the
    driver to its granularity) and one on all the others. Kept for the process."""
    lib = _driver()
    torch.cuda.init()  # the primary context must exist before a green context derives from it
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    whole = ctypes.create_string_buffer(_RESOURCE_BYTES)
    _check(lib.cuDeviceGetDevResource(dev, whole, _SM_RESOURCE), "cuDeviceGetDevResource")
    part, rest = ctypes.create_string_buffer(_RESOURCE_BYTES), ctypes.create_string_buffer(_RESOURCE_BYTES)
    groups = ctypes.c_uint(1)
    _check(lib.cuDevSmResourceSplitByCount(part, ctypes.byref(groups), whole, rest, 0, num_sms),
           f"splitting {num_sms} SMs off the device")
    sms = [ctypes.c_uint.from_buffer(r, _SM_COUNT_OFFSET).value for r in (part, rest)]
    log.info("green contexts of %d and %d SMs (asked for %d)", *sms, num_sms)
    return tuple((_stream_of(lib, r, dev, device_index), n) for r, n in zip((part, rest), sms))
