"""Run the conv-epilogue kernel (mapstream/layers/_conv_epilogue_kernel.py) under Triton's CPU
interpreter against the PyTorch composition relu?(conv(x) + adds...), both against a float64
evaluation of the same formula; prints a JSON report (see test_layers_fast_forms.py). Must
start with TRITON_INTERPRET=1 set (tests/conftest.py::run_interpreted does)."""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def main() -> None:
    from mapstream.layers.conv_epilogue import _launch, _same_layout, _without_bias

    torch.manual_seed(0)
    convs = {
        "conv3x3": nn.Conv2d(6, 5, 3, padding=1),
        "conv1x1_nobias": nn.Conv2d(6, 5, 1, bias=False),
        "convT4": nn.ConvTranspose2d(6, 5, 4, stride=4),
        "conv3x3_stride2": nn.Conv2d(6, 5, 3, stride=2, padding=1),
    }
    report = {}
    for name, conv in convs.items():
        for dtype in (torch.float32, torch.bfloat16):
            for channels_last in (False, True):
                for n_adds, relu in ((0, False), (1, True), (2, False), (2, True)):
                    c = conv.to(dtype)
                    fmt = torch.channels_last if channels_last else torch.contiguous_format
                    x = torch.randn(2, 6, 7, 9).to(dtype).contiguous(memory_format=fmt)
                    y = _without_bias(c, x)
                    adds = [torch.randn_like(y) for _ in range(n_adds)]
                    got = _launch(y, c.bias, adds, relu)
                    want = c(x)
                    for a in adds:
                        want = want + a
                    want = F.relu(want) if relu else want
                    exact = y.double() + (c.bias.double().view(1, -1, 1, 1) if c.bias is not None else 0)
                    for a in adds:
                        exact = exact + a.double()
                    exact = exact.clamp_min(0) if relu else exact
                    scale = float(exact.abs().max())
                    report[f"{name}/{str(dtype)[6:]}/{'cl' if channels_last else 'nchw'}/{n_adds}adds{'/relu' if relu else ''}"] = {
                        "layout_ok": _same_layout(y, adds),
                        "kept_format": got.stride() == y.stride() and got.dtype == dtype and got.shape == want.shape,
                        "kernel_err": float((got.double() - exact).abs().max()) / scale,
                        "composition_err": float((want.double() - exact).abs().max()) / scale,
                    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
