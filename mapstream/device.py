"""Which device a run uses: `resolve_device` turns a `--device` value into a torch device, or
into an error that says what to pass instead."""
from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    """The device a `--device` value names (auto: CUDA when there is a GPU), or a ValueError
    that says what to pass."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name}: not a device name ({exc}); use cpu, cuda, cuda:N or auto") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: mapstream runs on the CPU or a CUDA GPU; use cpu, cuda, cuda:N or auto")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"--device {name}: this PyTorch sees no CUDA GPU (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'none'}); use --device cpu, or auto to take a GPU when there is one"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {name}: this machine has {count} CUDA GPU(s), numbered from 0")
    return device
