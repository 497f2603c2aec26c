"""How many multiprocessors does the camera head's fp32 chain need, and would the heads' tail
shrink if the two heads each had their own part of the GPU?

The step's tail (the heads after the trunk) takes ≈ 2.5 ms with fp32 heads: the camera head's
chain of one-row products (3.2 GB of fp32 weights a frame) beside the DPT head's convolutions,
each ≈ 1.1-1.5 ms alone (docs/BENCHMARKS.md, sessions 13 and 16). Session 16 confined the DPT
head to 96-120 SMs with the camera head free on all: no gain. What it did not measure is how
fast the camera chain runs on a few SMs alone, i.e. how much memory bandwidth a multiprocessor
can draw with our row kernel. This probe times, each captured in a CUDA graph (median of 50
replays):

- the camera trunk's product chain as the step runs it (4 passes x 4 blocks of
  `norm_linear` q/k/v, `linear_residual` projection, `norm_linear` fc1 + GELU,
  `linear_residual` fc2; one row, fp32; the attention and the small per-pass work left out):
  alone on all SMs and alone on N SMs (a green context);
- the DPT head (fp32, channels-last, TF32 convolutions as in the step) alone on all SMs and on
  the other 132 - N;
- both together: on two ordinary streams (the step's arrangement) and split N / 132 - N.

With ``--configs``, the row kernel's launch settings are varied instead (rows a program,
chunk bytes, warps),
each timed alone on all SMs and on the first ``--sms`` count, beside the DPT head on all SMs
(the step's arrangement) and split with it (``--staged`` the same way).

With ``--tma``, the weights reach the kernel by bulk copies (TMA) through a tensor descriptor,
in [rows, chunk] boxes staged by the pipeliner (stages, rows, chunk as listed); timed the same way.

With ``--staged``, a variant of the kernel without the hand-written one-ahead prefetch, whose
weight loads Triton's software pipeliner stages through shared memory (``tl.range(...,
num_stages=S)``), is timed against the kernel as it is, alone, on the first ``--sms`` count and
beside the DPT head: more bytes in flight a multiprocessor, if the pipeliner takes the loads.

Usage (device): python3 scripts/probe_camera_partition.py [--sms 16 24 32 48] [--configs | --staged | --tma] [--out FILE.json]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from torch import nn

from _partition import sm_partition
from _probe import report
from _timing import side_by_side, timeit

from mapstream.heads.dpt import DPTHead
from mapstream.layers import _row_linear_kernel, row_linear
from mapstream.layers.row_linear import linear_residual, norm_linear

DIM, PASSES, BLOCKS = 2048, 4, 4
# (rows a program, chunk bytes, warps). Session 20 also had the first weight chunk requested
# after the LayerNorm's statistics as an arm (a kernel flag, since removed: before them won).
CONFIGS = [(4, 2048, 4), (2, 2048, 4), (8, 2048, 4), (4, 4096, 4), (8, 4096, 8), (16, 2048, 8)]


@triton.jit
def _row_stats(X, K, eps, BLOCK_K: tl.constexpr):
    """The fp32 row's LayerNorm mean and 1/std, in two passes (mean, then centred variance), as
    the product kernel computes them; shared by the probe's stand-in kernels."""
    total = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in tl.range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        total += tl.load(X + cols, mask=cols < K, other=0.0)
    mean = tl.sum(total, 0) / K
    total = tl.zeros([BLOCK_K], dtype=tl.float32)
    for start in tl.range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        d = tl.load(X + cols, mask=cols < K, other=0.0) - mean
        total += tl.where(cols < K, d * d, 0.0)
    return mean, 1.0 / tl.sqrt(tl.sum(total, 0) / K + tl.cast(eps, tl.float32))


@triton.jit
def _stand_in_row_linear(
    X, W, B, NW, NB, R, G, Y, N, K, stride_w, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, NORM_AFFINE: tl.constexpr,
    ROUND_NORM: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr, STAGES: tl.constexpr,
    TMA: tl.constexpr,
):
    """The product kernel's computation (fp32 row, no half-precision rounding) with its weight
    loads left to the pipeliner over STAGES: plain loads, or with TMA (W then a tensor
    descriptor) bulk copies of [BLOCK_N, BLOCK_K] boxes."""
    n0 = tl.program_id(0) * BLOCK_N
    rows = n0 + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    mean = 0.0
    rstd = 1.0
    if NORM:
        mean, rstd = _row_stats(X, K, eps, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        if TMA:
            w = W.load([n0, start])
        else:
            w = tl.load(W + rows[:, None].to(tl.int64) * stride_w + cols[None, :],
                        mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        x = tl.load(X + cols, mask=col_ok, other=0.0)
        if NORM:
            x = (x - mean) * rstd
            if NORM_AFFINE:
                x = x * tl.load(NW + cols, mask=col_ok, other=0.0) + tl.load(NB + cols, mask=col_ok, other=0.0)
            x = tl.where(col_ok, x, 0.0)
        acc += w * x[None, :]
    y = tl.sum(acc, 1) + tl.load(B + rows, mask=row_ok, other=0.0)
    if GELU:
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    if RESIDUAL:
        y = tl.load(R + rows, mask=row_ok, other=0.0) + tl.load(G + rows, mask=row_ok, other=0.0) * y
    tl.store(Y + rows, y, mask=row_ok)


class _Staged:
    """Stands in for the product kernel in `launch_row_linear` (kernel[grid](...))."""

    def __init__(self, stages: int) -> None:
        self.stages = stages

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _stand_in_row_linear[grid](*args, STAGES=self.stages, TMA=False, **kwargs)


class _Tma:
    """Stands in for the product kernel in `launch_row_linear`: the same arguments, the weight
    handed to the kernel as a tensor descriptor of [rows, chunk] boxes (kept per weight)."""

    def __init__(self, stages: int, rows: int, chunk: int) -> None:
        self.stages, self.rows, self.chunk = stages, rows, chunk
        self.descriptors = {}

    def __getitem__(self, grid):
        from triton.tools.tensor_descriptor import TensorDescriptor

        def launch(X, W, *args, **kwargs):
            n, k = W.shape
            key = (W.data_ptr(), n, k)
            if key not in self.descriptors:
                self.descriptors[key] = TensorDescriptor(W, [n, k], [W.stride(0), 1], [self.rows, self.chunk])
            kwargs.update(BLOCK_N=self.rows, BLOCK_K=self.chunk, num_warps=4)
            _stand_in_row_linear[(triton.cdiv(n, self.rows),)](
                X, self.descriptors[key], *args, STAGES=self.stages, TMA=True, **kwargs
            )
        return launch


class TrunkBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.ls1, self.ls2 = nn.Parameter(torch.full((DIM,), 0.1)), nn.Parameter(torch.full((DIM,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if DIRECT:  # the launcher itself, so that a stand-in kernel can be swapped in
            return self.direct(x)
        v = norm_linear(x, self.norm1, self.qkv)[..., 2 * DIM:]  # the values stand in for the attention's output
        x = linear_residual(v, self.proj, x, self.ls1)
        return linear_residual(norm_linear(x, self.norm2, self.fc1, gelu=True), self.fc2, x, self.ls2)

    def direct(self, x: torch.Tensor) -> torch.Tensor:
        run = row_linear.launch_row_linear
        n1, n2 = self.norm1, self.norm2
        v = run(x, self.qkv.weight, self.qkv.bias, n1.weight, n1.bias, None, None, n1.eps, False, True)[..., 2 * DIM:]
        x = run(v, self.proj.weight, self.proj.bias, None, None, x, self.ls1, 0.0, False, False)
        h = run(x, self.fc1.weight, self.fc1.bias, n2.weight, n2.bias, None, None, n2.eps, True, True)
        return run(h, self.fc2.weight, self.fc2.bias, None, None, x, self.ls2, 0.0, False, False)


DIRECT = False


def camera_chain():
    """The camera trunk's blocks (random weights, fp32, on the GPU) and a function that runs
    the step's chain of them on one token: PASSES passes through BLOCKS blocks."""
    blocks = nn.ModuleList(TrunkBlock() for _ in range(BLOCKS)).cuda().eval()
    token = torch.randn(1, 1, DIM, device="cuda")

    def camera():
        x = token
        for _ in range(PASSES):
            for block in blocks:
                x = block(x)
        return x

    return blocks, camera


def main() -> None:
    global DIRECT
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", type=int, nargs="*", default=[16, 24, 32, 48])
    parser.add_argument("--configs", action="store_true")
    parser.add_argument("--staged", action="store_true")
    parser.add_argument("--tma", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.allow_tf32 = True
    blocks, camera = camera_chain()
    weight_bytes = PASSES * sum(p.numel() * 4 for p in blocks.parameters())
    dpt = DPTHead(DIM).cuda().eval().to(memory_format=torch.channels_last)
    layers = [torch.randn(1, 1, 978, DIM, device="cuda") for _ in range(4)]

    def dense():
        return dpt(layers, (378, 504), 6)

    def time_of(works) -> float:
        return round(timeit(side_by_side(works).replay), 1)

    res = {"camera_weight_bytes_per_frame": weight_bytes}

    def compare(variants) -> None:
        """Each (label, put in place) variant of the camera chain's kernel timed alone, on the
        first --sms count, beside the DPT head and split with it; outputs against the first's."""
        (part, got), (rest, others) = sm_partition(args.sms[0])
        want = None
        for label, put_in_place in variants:
            put_in_place()
            with torch.no_grad():
                out = camera()
            want = out if want is None else want
            alone = time_of([(None, camera)])
            res[label] = row = {
                "camera_us": alone, "camera_TB_s": round(weight_bytes / alone / 1e6, 2),
                f"camera_on_{got}_us": time_of([(part, camera)]),
                "beside_dpt_us": time_of([(None, camera), (None, dense)]),
                f"split_{got}_{others}_us": time_of([(part, camera), (rest, dense)]),
                "max_abs_diff_vs_first": float((out - want).abs().max()),
            }
            print(label, row, flush=True)
        report(res, args.out)

    if args.staged:
        DIRECT = True
        product = _row_linear_kernel._row_linear_fwd

        def kernel(stages: int):
            return lambda: setattr(_row_linear_kernel, "_row_linear_fwd", _Staged(stages) if stages else product)

        compare([(f"stages {stages or 'product'}", kernel(stages)) for stages in (0, 2, 3, 4, 6)])
        _row_linear_kernel._row_linear_fwd = product
        return
    if args.tma:
        DIRECT = True
        product = _row_linear_kernel._row_linear_fwd

        def tma(config):
            return lambda: setattr(_row_linear_kernel, "_row_linear_fwd", _Tma(*config) if config else product)

        compare([(f"tma {c}" if c else "product", tma(c)) for c in (None, (4, 16, 256), (6, 16, 256), (4, 32, 256))])
        _row_linear_kernel._row_linear_fwd = product
        return
    if args.configs:

        def launch(config):
            def put_in_place():
                row_linear._BLOCK_N, row_linear._CHUNK_BYTES, row_linear._NUM_WARPS = config
            return put_in_place

        compare([(f"rows {c[0]}, {c[1]} B, {c[2]} warps", launch(c)) for c in CONFIGS])
        return
    alone = time_of([(None, camera)])
    res["all SMs"] = {
        "camera_us": alone, "camera_TB_s": round(weight_bytes / alone / 1e6, 2),
        "dpt_us": time_of([(None, dense)]), "both_side_by_side_us": time_of([(None, camera), (None, dense)]),
    }
    for n in args.sms:
        (part, got), (rest, others) = sm_partition(n)
        cam = time_of([(part, camera)])
        res[f"{got} / {others} SMs"] = {
            "camera_us": cam, "camera_TB_s": round(weight_bytes / cam / 1e6, 2),
            "dpt_us": time_of([(rest, dense)]), "both_split_us": time_of([(part, camera), (rest, dense)]),
        }
        print(res[f"{got} / {others} SMs"], flush=True)
    report(res, args.out)


if __name__ == "__main__":
    main()
