"""The CUDA streams for side work: one per device, role and thread, for the life of the process."""
from __future__ import annotations

import threading

import torch

__all__ = ["shared_stream"]

_STREAMS: dict[tuple[int, str, int], torch.cuda.Stream] = {}
_LOCK = threading.Lock()


def shared_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """This thread's CUDA stream for `role` on `device` ("warmup": graphs' warm-up runs before
    capture; "side": work a graphed step runs beside its main stream; "background": the
    global map's thread), made on first use and then reused by every session the thread
    runs. cuBLAS keeps a workspace for every stream it has computed on for the life of the
    process (tens of MiB on a Hopper GPU), so streams made per session or per capture would
    hold that memory after the session is gone. Per thread, so that a graph captured on one
    thread never takes in side work another thread queued."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, role, threading.get_ident())
    with _LOCK:
        stream = _STREAMS.get(key)
        if stream is None:
            stream = _STREAMS[key] = torch.cuda.Stream(torch.device("cuda", index))
        return stream
