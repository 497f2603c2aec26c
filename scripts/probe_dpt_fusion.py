"""cuDNN's fused convolution epilogue in the DPT head (tried in session 22, not adopted).

Under the protocol the H200 sits at its 700 W power cap and lowers its SM clock (1,695-1,890
MHz against 1,980 rested; `probe_clocks.py`, docs/BENCHMARKS.md session 22), so a step's
energy sets its speed as much as its kernels' times do. This probe times the DPT head (fp32,
channels-last, TF32 convolutions, one CUDA graph, cuDNN benchmark mode as the graphed step
captures it) as the library runs it (bias-free cuDNN convolution, then our Triton epilogue for
bias, addends and ReLU) against a form whose ReLU'd convolutions run bias, addend and ReLU in
cuDNN's own epilogue (`torch.cudnn_convolution_relu` / `_add_relu`; the fusion blocks' first
residual unit ReLU'd at its end, since the second uses only the ReLU of its input): alone,
beside the camera head's fp32 product chain (as in the step's tail), energy a call, and the
largest difference of the outputs. Arms alternate twice.

Usage (device, from scripts/): python3 probe_dpt_fusion.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from _probe import energy, energy_reader, report
from _timing import side_by_side, timeit
from probe_camera_partition import DIM, camera_chain

from mapstream.heads import dpt
from mapstream.heads.dpt import DPTHead
from mapstream.layers.conv_epilogue import conv_epilogue
from mapstream.layers.resize import resize_bilinear


def _fused_conv_epilogue(conv, x, adds=(), relu=False):
    """`conv_epilogue` with a ReLU'd Conv2d through cuDNN's fused calls (one addend: two are
    summed first)."""
    if relu and x.is_cuda and isinstance(conv, nn.Conv2d):
        args = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
        if adds:
            z = adds[0] if len(adds) == 1 else adds[0] + adds[1]
            return torch.cudnn_convolution_add_relu(x, conv.weight, z, 1.0, conv.bias, *args)
        return torch.cudnn_convolution_relu(x, conv.weight, conv.bias, *args)
    return conv_epilogue(conv, x, adds, relu)


def _unit_forward(self, x, extra=None, relu_out=False):
    x = F.relu(x)
    hidden = dpt.conv_epilogue(self.conv1, x, relu=True)
    return dpt.conv_epilogue(self.conv2, hidden, adds=(x,) if extra is None else (x, extra), relu=relu_out)


def _fusion_forward(self, x, skip, size):
    if skip is not None:
        x = self.resConfUnit1(skip, extra=x, relu_out=True)
    x = self.resConfUnit2(x)
    return dpt.conv_epilogue(self.out_conv, resize_bilinear(x, size))


@contextlib.contextmanager
def cudnn_fused():
    """The DPT module's epilogues and fusion blocks swapped for the fused forms above."""
    saved = dpt.conv_epilogue, dpt._ResidualConvUnit.forward, dpt._FusionBlock.forward
    dpt.conv_epilogue, dpt._ResidualConvUnit.forward, dpt._FusionBlock.forward = (
        _fused_conv_epilogue, _unit_forward, _fusion_forward)
    try:
        yield
    finally:
        dpt.conv_epilogue, dpt._ResidualConvUnit.forward, dpt._FusionBlock.forward = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # as the graphed step captures the dense heads
    nvml = energy_reader()
    res: dict = {}
    head = DPTHead(DIM).cuda().eval().to(memory_format=torch.channels_last)
    layers = [torch.randn(1, 1, 978, DIM, device="cuda") for _ in range(4)]
    _, camera = camera_chain()

    outputs = {}
    for fused in (False, True, False, True):
        label = "cudnn_fused" if fused else "triton_epilogue"
        with cudnn_fused() if fused else contextlib.nullcontext():
            with torch.no_grad():
                outputs[label] = head(layers, (378, 504), 6)
            alone = side_by_side([(None, lambda: head(layers, (378, 504), 6))])
            both = side_by_side([(None, camera), (None, lambda: head(layers, (378, 504), 6))])
        row = {"dpt_alone_us": round(timeit(alone.replay), 1), "beside_camera_us": round(timeit(both.replay), 1),
               "dpt_energy": energy(nvml, alone.replay), "both_energy": energy(nvml, both.replay)}
        res.setdefault(label, []).append(row)
        print(label, row, flush=True)
        del alone, both
    (d0, c0), (d1, c1) = outputs["triton_epilogue"], outputs["cudnn_fused"]
    res["max_rel_diff"] = {"depth": float(((d1 - d0).abs() / d0.abs().clamp_min(1e-6)).max()),
                           "conf": float(((c1 - c0).abs() / c0.abs()).max())}
    print(res["max_rel_diff"], flush=True)
    cam = side_by_side([(None, camera)])
    res["camera_alone"] = {"us": round(timeit(cam.replay), 1), "energy": energy(nvml, cam.replay)}
    print("camera", res["camera_alone"], flush=True)
    del cam

    report(res, args.out)


if __name__ == "__main__":
    main()
