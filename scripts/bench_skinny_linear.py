"""`skinny_linear` (mapstream/layers/skinny.py) against cuBLAS (`F.linear`) on the camera
head's products: one row through 2048-wide blocks (q/k/v 2048→6144, projection 2048→2048,
MLP 2048→8192→2048), fp32 (the protocol's heads) and bf16. Each variant is checked against
float64 first, then replayed from CUDA graphs, interleaved; GB/s counts the weight bytes.

Usage (CUDA): python scripts/bench_skinny_linear.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from _timing import captured, interleaved
from mapstream.layers.skinny import launch_skinny_linear, plan


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for name, (k, n) in {"qkv": (2048, 6144), "proj": (2048, 2048), "fc1": (2048, 8192), "fc2": (8192, 2048)}.items():
            x = torch.randn(1, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype) / k**0.5
            b = torch.randn(n, device=dev, dtype=dtype)
            want = x.double() @ w.double().T + b.double()
            size = x.element_size()
            variants = {"cublas": lambda x=x, w=w, b=b: F.linear(x, w, b)}
            configs = {"plan": plan(n, k, size, 4 * sms), "plan_2x": plan(n, k, size, 8 * sms),
                       "n8": (8,) + plan(n, k, size, 4 * sms)[1:], "n32": (32,) + plan(n, k, size, 4 * sms)[1:],
                       "k1024B": plan(n, k, size, 4 * sms)[:1] + (1024 // size,) + plan(n, k, size, 4 * sms)[2:]}
            for label, cfg in configs.items():
                got = launch_skinny_linear(x, w, b, config=cfg)
                err = float((got.double() - want).abs().max() / want.abs().max())
                assert err < (1e-6 if dtype == torch.float32 else 1e-2), (name, label, err)
                variants[f"{label}{cfg}"] = lambda x=x, w=w, b=b, cfg=cfg: launch_skinny_linear(x, w, b, config=cfg)
            cublas_err = float((F.linear(x, w, b).double() - want).abs().max() / want.abs().max())
            print(f"{str(dtype)[6:]} {name} {k}->{n}: weights {w.numel() * size / 1e6:.1f} MB, cuBLAS error {cublas_err:.1e}")
            graphs = {label: captured(fn) for label, fn in variants.items()}
            interleaved({label: g.replay for label, g in graphs.items()}, rounds=5, label=f"{str(dtype)[6:]} {name} ")


if __name__ == "__main__":
    main()
