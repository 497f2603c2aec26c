"""The global blocks' key-norm hints for their cache attentions, and when to withdraw them.

Keys of a global block leave its qk-norm (a LayerNorm), so their norms have a bound known
from the weights (`layers.layer_norm_bound`). Handed to the attention backend as a
`KeyNormHint`, it lets our Triton kernel fix each query row's softmax reference point in
advance, which spares it the running max and the rescaling it drives. The kernel
checks every row and computes a block of rows again where the bound put its weights out of
range, counting it in the hint's counter: correct whatever the weights, but a block
computed again costs more than the running max saves. Weights whose bound is that loose
(a qk-norm weight much larger in one feature than in the others) lose the hint of the
block concerned from the next step on, with a warning.

The counters live on the GPU; reading them must not make a step wait for it. Each step
queues a copy of them into pinned host memory and reads the copy of an earlier step once
its event has passed: a loose bound is noticed a step or two after its first repair.
"""
from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch import nn

from ..attention import KeyNormHint

__all__ = ["KeyNormHints"]

log = logging.getLogger(__name__)


class KeyNormHints:
    """Per global block, the hint its cache attention gets (`current()`), owned by the
    aggregator. Bounds are computed again (and withdrawn hints restored) when a k_norm
    parameter moves or is written in place: PyTorch counts every in-place write in a
    tensor's version, load_state_dict's included."""

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        self._blocks = blocks
        self._key: tuple | None = None
        self._bounds: list[float | None] = []
        self._repairs: torch.Tensor | None = None  # int32 [blocks], on the weights' device
        self._seen: torch.Tensor | None = None  # a host copy of it (pinned on CUDA)
        self._copied: torch.cuda.Event | None = None
        self._withdrawn: set[int] = set()
        self._hints: tuple[KeyNormHint | None, ...] | None = None  # built again when bounds or withdrawals change

    def current(self) -> tuple[KeyNormHint | None, ...]:
        """The hints for the next step (None: no qk-norm, or withdrawn). Call outside CUDA
        graph capture: it queues a copy of the counters."""
        self._refresh()
        self._read_counters()
        if self._hints is None:
            self._hints = tuple(
                None if bound is None or i in self._withdrawn else KeyNormHint(bound, self._repairs[i : i + 1])
                for i, bound in enumerate(self._bounds)
            )
        return self._hints

    def __getstate__(self) -> dict:
        # A copy (copy.deepcopy of the model) starts afresh: the counters, the pending copy's
        # event and the pinned memory belong to this object's work on the device.
        state = dict(self.__dict__)
        state.update(_key=None, _bounds=[], _repairs=None, _seen=None, _copied=None, _withdrawn=set(), _hints=None)
        return state

    def repaired_blocks(self) -> list[int]:
        """Row blocks computed again so far, per global block (waits for the GPU)."""
        self._refresh()
        return self._repairs.tolist()

    def _params(self) -> list[torch.Tensor]:
        return [p for block in self._blocks if block.attn.k_norm is not None for p in block.attn.k_norm.parameters()]

    def _refresh(self) -> None:
        params = self._params()
        key = tuple((p.data_ptr(), p._version) for p in params)
        if key == self._key:
            return
        self._key = key
        self._bounds = [block.attn.key_norm_bound() for block in self._blocks]
        device = params[0].device if params else torch.device("cpu")
        self._repairs = torch.zeros(len(self._blocks), dtype=torch.int32, device=device)
        self._seen = torch.zeros(len(self._blocks), dtype=torch.int32, pin_memory=device.type == "cuda")
        self._copied = None
        self._withdrawn = set()
        self._hints = None

    def _read_counters(self) -> None:
        if self._repairs.device.type != "cuda":
            self._withdraw(self._repairs)
            return
        if self._copied is not None and not self._copied.query():
            return  # the last copy has not landed: read it at a later step
        if self._copied is not None:
            self._withdraw(self._seen)
        with torch.cuda.device(self._repairs.device):
            self._seen.copy_(self._repairs, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def _withdraw(self, counts: torch.Tensor) -> None:
        for i, count in enumerate(counts.tolist()):
            if count > 0 and i not in self._withdrawn:
                self._withdrawn.add(i)
                self._hints = None
                log.warning(
                    "global block %d: its key-norm bound %.3g left %d row block(s) of its cache attention out of "
                    "range; it goes back to the running max (the bound is too loose for these weights)",
                    i, self._bounds[i], count,
                )
