"""Shared pieces of the device probes (`probe_*.py`): a clock each Triton program can read
on its own, a wrapper that runs marks around a function's calls, and the JSON report they
print and write."""
from __future__ import annotations

import json

import triton
import triton.language as tl


@triton.jit
def globaltimer():
    """The GPU's nanosecond clock (%globaltimer): programs time themselves with it."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


def report(res, out_path: str | None) -> None:
    """Print `res` as JSON and, given a path, write it there too."""
    print(json.dumps(res, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1)


def nothing() -> None:
    pass


class Around:
    """fn with `before()` and `after()` run around each call; other attributes are fn's (the
    whole step reads `_first_piece.outputs` when it captures again)."""

    def __init__(self, fn, before=nothing, after=nothing) -> None:
        self._fn, self._before, self._after = fn, before, after

    def __call__(self, *args, **kwargs):
        self._before()
        out = self._fn(*args, **kwargs)
        self._after()
        return out

    def __getattr__(self, name):
        return getattr(self._fn, name)
