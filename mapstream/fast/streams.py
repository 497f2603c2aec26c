"""The process's CUDA streams for side work, one per device and role."""
from __future__ import annotations

import threading

import torch

__all__ = ["shared_stream"]

_STREAMS: dict[tuple[int, str], torch.cuda.Stream] = {}
_LOCK = threading.Lock()


def shared_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """The process's CUDA stream for `role` on `device` ("warmup": graphs' warm-up runs before
    capture; "side": work a graphed step runs beside its main stream; "background": the
    global map's thread), made on first use and then reused. cuBLAS keeps a workspace for
    every stream it has computed on for the life of the process (tens of MiB on a Hopper GPU),
    so streams made per session or per capture would hold that memory after the session is
    gone. Work that several sessions put on one role's stream is ordered, not wrong."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _LOCK:
        stream = _STREAMS.get((index, role))
        if stream is None:
            stream = _STREAMS[index, role] = torch.cuda.Stream(torch.device("cuda", index))
        return stream
