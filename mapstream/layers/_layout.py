"""Memory-layout questions our element-wise kernels ask of a 4D map [N, C, H, W]."""
from __future__ import annotations

import torch


def channels_last(t: torch.Tensor) -> bool:
    """Dense channels-last and not also contiguous (a map where both hold, e.g. one channel or
    one pixel, is read the same either way: callers treat it as contiguous)."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
