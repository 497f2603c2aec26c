"""`mapstream info`: versions, presets and which attention backends can run here."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Info:
    """Print versions, model presets and the attention backends usable on this machine."""

    def main(self) -> int:
        import torch

        import mapstream
        from mapstream.attention import available_backends

        print(f"mapstream {mapstream.__version__}, torch {torch.__version__}")
        for name in mapstream.preset_names():
            print(f"preset {name}: {mapstream.get_preset(name).description}")
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
        for device in devices:
            for dtype in (torch.float32, torch.bfloat16):
                for backend, reasons in available_backends(device, dtype).items():
                    state = "ok" if not reasons else "no: " + "; ".join(reasons)
                    print(f"backend {backend:10s} {device.type:4s} {str(dtype):15s} {state}")
        return 0
