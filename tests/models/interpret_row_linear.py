"""Run the row-linear kernel (mapstream/layers/_row_linear_kernel.py) under Triton's CPU
interpreter against a float64 evaluation of the composition it replaces, with a
half-precision norm's result rounded as the interpreter rounds (toward zero in Triton
3.6-3.9); prints a JSON report (see test_layers_fast_forms.py). Must start with
TRITON_INTERPRET=1 set (tests/conftest.py::run_interpreted does)."""
from __future__ import annotations

import json
import math

import torch
from torch import nn

from interpret_heads_kernel import _interpreter_truncates, to_interpreted


def _exact(x, linear, norm, gelu, residual, scale, truncates):
    """The composition in float64 (the half-precision norm's result rounded as the module
    hands it on)."""
    h = x.double()
    if norm is not None:
        h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + norm.eps)
        if norm.weight is not None:
            h = h * norm.weight.double() + norm.bias.double()
        if x.dtype != torch.float32:
            h = to_interpreted(h.float(), x.dtype, truncates).double()
    y = h @ linear.weight.double().t() + linear.bias.double()
    if gelu:
        y = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))
    if residual is not None:
        y = residual.double() + scale.double() * y
    return y


@torch.no_grad()
def main() -> None:
    from mapstream.layers.row_linear import launch_row_linear

    torch.manual_seed(0)
    truncates = _interpreter_truncates()
    report = {}
    # widths off the kernel's 4 x 512 tiles, a row longer than one chunk, one shorter
    for k, n in ((37, 10), (700, 9), (1030, 5), (512, 4)):
        for dtype in (torch.float32, torch.bfloat16):
            linear = nn.Linear(k, n).to(dtype)
            x = (torch.randn(1, 1, k) * 3 + 1.5).to(dtype)  # an offset mean, as the head's tokens have
            for case in ("norm", "norm_plain", "norm_gelu", "residual"):
                norm = None
                residual = scale = None
                if case.startswith("norm"):
                    norm = nn.LayerNorm(k, eps=1e-5, elementwise_affine=case != "norm_plain")
                    if norm.weight is not None:
                        norm.weight.normal_()
                        norm.bias.normal_()
                else:
                    residual = torch.randn(1, 1, n).to(dtype)
                    scale = (torch.rand(n) * 0.1).to(dtype)
                gelu = case == "norm_gelu"
                got = launch_row_linear(
                    x, linear.weight, linear.bias,
                    None if norm is None else norm.weight, None if norm is None else norm.bias,
                    residual, scale, 0.0 if norm is None else norm.eps, gelu, norm is not None,
                )
                want = _exact(x, linear, norm, gelu, residual, scale, truncates)
                err = (got.double() - want).abs()
                # in units of the output dtype's rounding of each value (2^-7 of it in bf16)
                unit = want.abs().clamp_min(1e-30) * torch.finfo(dtype).eps
                report[f"{k}x{n}/{str(dtype)[6:]}/{case}"] = {
                    "shape_ok": got.shape == (1, 1, n) and got.dtype == dtype,
                    "rel_err": float(err.max()) / float(want.abs().max()),
                    "max_units": float((err / unit).max()),
                }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
