"""A function of static tensors, run eagerly or replayed from a captured CUDA graph."""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import weakref
from typing import Callable

import torch

from .streams import shared_stream

__all__ = ["Piece", "KeyedPiece", "conv_search", "outside_captures", "weakly"]

log = logging.getLogger(__name__)

# Held while a graph is captured. A CUDA graph capture forbids, process-wide, the CUDA calls
# other threads make as a matter of course (allocations, synchronous copies): work on another
# thread that shares the GPU with a stream (the global map's) runs inside `outside_captures`.
_CAPTURING = threading.RLock()


@contextlib.contextmanager
def outside_captures():
    """Run the enclosed GPU work while no CUDA graph is being captured (and let no capture
    start until it is done)."""
    with _CAPTURING:
        yield


def weakly(method: Callable, *args) -> Callable[[], object]:
    """`method(*args)` as a callable that does not keep the method's object alive. The graphed
    steps own their pieces and the pieces call the steps' methods: held strongly, each step
    would be a reference cycle that only the garbage collector's cycle search frees, and the
    captured graphs' memory and the cache storage they point at would stay allocated until it
    runs."""
    ref = weakref.WeakMethod(method)

    def call():
        bound = ref()
        if bound is None:
            raise ReferenceError("the graphed step this piece belongs to is gone")
        return bound(*args)

    return call


def _unowned(fn: Callable | None) -> Callable | None:
    return weakly(fn) if inspect.ismethod(fn) else fn


class Piece:
    """A function of static tensors, run eagerly or replayed from a captured graph. A bound
    method (`fn`, `reads`) is held weakly (`weakly`)."""

    def __init__(self, fn: Callable[[], tuple], capture: bool, pool, reads: Callable[[], list] | None = None) -> None:
        fn, reads = _unowned(fn), _unowned(reads)
        self.fn, self.capture, self.pool = fn, capture, pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: tuple = ()
        # Tensors the graph reads that others own and may drop (`reads()` after capture):
        # held for as long as the graph, so that their memory is never reused under it.
        self.reads, self.held = reads, []

    def __call__(self) -> tuple:
        if not self.capture:
            self.outputs = self.fn()
        elif self.graph is None:
            # Warm up on a side stream (cuBLAS/cuDNN handles, autotuning), then capture.
            stream = shared_stream(torch.device("cuda", torch.cuda.current_device()), "warmup")
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.fn()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with _CAPTURING, torch.cuda.graph(self.graph, pool=self.pool):
                self.outputs = self.fn()
            self.held = self.reads() if self.reads is not None else []
            self.graph.replay()
        else:
            self.graph.replay()
        return self.outputs


class KeyedPiece:
    """A `Piece` captured for one key — what its graph holds fixed, such as cache storage
    addresses — and captured again when the key changes."""

    def __init__(self, fn: Callable[[], tuple], capture: bool, pool, what: str,
                 reads: Callable[[], list] | None = None) -> None:
        fn, reads = _unowned(fn), _unowned(reads)
        self.fn, self.capture, self.pool, self.what, self.reads = fn, capture, pool, what, reads
        self.piece: Piece | None = None
        self.key = None

    def for_key(self, key) -> Piece:
        if self.piece is None or key != self.key:
            if self.piece is not None:
                log.debug("%s: what its graph holds changed (cache storage, hints), capturing again", self.what)
            self.piece = Piece(self.fn, self.capture, self.pool, self.reads)
            self.key = key
        return self.piece


@contextlib.contextmanager
def conv_search(on: bool):
    """cuDNN's benchmark mode while the dense heads are warmed up and captured.

    Without it cuDNN runs its heuristics' first choice for each convolution. With it, the
    first call of each shape times the candidates and keeps the fastest for the process;
    the warm-up before every capture makes that first call, so the graph holds the chosen
    kernels (faster than the heuristics' on the dense heads' TF32 convolutions).
    The choice depends on timings, so two processes may pick different kernels, whose
    results differ by TF32 rounding; a user who asked for deterministic algorithms keeps
    the heuristics."""
    if not on or torch.backends.cudnn.deterministic or torch.are_deterministic_algorithms_enabled():
        yield
        return
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous
