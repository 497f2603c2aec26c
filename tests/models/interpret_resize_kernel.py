"""Run the bilinear resize kernel (mapstream/layers/_resize_kernel.py) under Triton's CPU
interpreter against F.interpolate and print the errors as JSON. Started by
test_layers_fast_forms.py in a fresh process with TRITON_INTERPRET=1."""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F


def main() -> None:
    from mapstream.layers.resize import SeparableAddend, _resize_triton

    torch.manual_seed(0)
    report = {}
    cases = [((1, 5, 4, 6), (9, 13)), ((2, 70, 7, 3), (14, 6)), ((1, 3, 1, 5), (4, 1)), ((1, 8, 6, 6), (6, 6))]
    for shape, size in cases:
        for fmt in ("nchw", "nhwc"):
            x = torch.randn(shape)
            if fmt == "nhwc":
                x = x.to(memory_format=torch.channels_last)
            add = torch.randn(shape[1], *size)
            want = F.interpolate(x, size=size, mode="bilinear", align_corners=True)
            got = _resize_triton(x, size, None)
            got_add = _resize_triton(x, size, add)
            split = shape[1] // 2 + 1  # unequal parts: more channels vary along x than along y
            tables = SeparableAddend(torch.randn(size[1], split), torch.randn(size[0], shape[1] - split))
            got_tables = _resize_triton(x, size, tables)
            report[f"{shape}->{size}/{fmt}"] = {
                "err": float((got - want).abs().max()),
                "err_add": float((got_add - (want + add)).abs().max()),
                "err_separable": float((got_tables - (want + tables.dense())).abs().max()),
                "shape_ok": list(got.shape) == [shape[0], shape[1], *size],
                "format_kept": got.is_contiguous(memory_format=torch.channels_last) == (fmt == "nhwc") or shape[1] == 1,
            }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
