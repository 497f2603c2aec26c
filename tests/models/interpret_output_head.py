"""Run the DPT output kernel (mapstream/layers/_output_head_kernel.py) under Triton's CPU
interpreter against a float64 evaluation of the composition it replaces (1x1 convolution,
channels last, exp of the values, 1 + exp of the confidence); prints a JSON report (see
test_layers_fast_forms.py). Must start with TRITON_INTERPRET=1 set
(tests/conftest.py::run_interpreted does)."""
from __future__ import annotations

import json

import torch
from torch import nn


@torch.no_grad()
def main() -> None:
    from mapstream.layers.output_head import _launch

    torch.manual_seed(0)
    report = {}
    # the depth head's 32 -> 2, odd channel counts, pixel counts off the 128-pixel blocks
    for c_in, c_out, n, hw in ((32, 2, 2, (9, 23)), (5, 4, 1, (16, 8)), (17, 3, 3, (1, 7))):
        for dtype in (torch.float32, torch.bfloat16):
            for layout in ("nchw", "channels_last"):
                conv = nn.Conv2d(c_in, c_out, 1).to(dtype)
                h = torch.randn(n, c_in, *hw).to(dtype)
                if layout == "channels_last":
                    h = h.contiguous(memory_format=torch.channels_last)
                value, conf = _launch(conv, h)
                logits = torch.einsum("nkhw,ck->nhwc", h.double(), conv.weight.double()[:, :, 0, 0])
                logits = logits + conv.bias.double()
                want_value, want_conf = logits[..., :-1].exp(), 1 + logits[..., -1].exp()
                report[f"{c_in}to{c_out}/{n}x{hw[0]}x{hw[1]}/{str(dtype)[6:]}/{layout}"] = {
                    "shape_ok": value.shape == want_value.shape and conf.shape == want_conf.shape
                    and value.dtype == dtype and conf.dtype == dtype,
                    "value_rel": float(((value.double() - want_value).abs() / want_value).max()),
                    "conf_rel": float(((conf.double() - want_conf).abs() / want_conf).max()),
                }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
